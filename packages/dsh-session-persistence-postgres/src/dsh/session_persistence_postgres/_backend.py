"""``PostgresBackend``: the session backend primitives as PostgreSQL transactions, on asyncio and trio.

Every mutating primitive is one transaction, so there are no torn tails: a crash or a lost connection leaves a
batch wholly committed or wholly absent, ``load_stored`` never reports a torn marker and ``commit_repair`` only
appends closers. Seq contiguity is enforced by the database too, not only by the coordinator: a batch commits
only through a compare-and-set on the session row's ``next_seq`` (under its row lock), and ``(session_id,
seq)`` is the events' primary key. Two processes racing on one id therefore never interleave or duplicate a
seq: the loser gets :class:`SeqMismatchError` (or :class:`SessionAlreadyExistsError` for the first batch).

The work runs on sync psycopg connections in threads, so any anyio event loop (asyncio, trio) can drive it. The
later batches of every session go through one committer thread that sends all the batches queued meanwhile as one
transaction (group commit, see :mod:`._group`); the other primitives run in anyio worker threads. A cancelled
caller leaves at once (its deadline bounds the call); the write goes on to its end, bounded by the backend's own
timeouts, and the session's next write waits for it and reads back what it left (see :mod:`._abandon`).
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread

from ._abandon import WriteChains, run_abandonable
from ._codec import DEFAULT_COMPRESS_THRESHOLD, EventCodec
from ._core import (
    IncompleteInheritedPrefixError,
    KeyProvider,
    ListQuery,
    SessionEvent,
    SessionHeader,
    SessionListing,
    SessionLocation,
    SessionPersistenceCorruptionError,
    SessionSnapshot,
    StaticKeyProvider,
    StorageMetadata,
    StoredPrefix,
    StoredSuffix,
    check_cipher_available,
    check_contiguous,
)
from ._errors import PostgresConfigurationError
from ._sealing import RowSealer  # no psycopg in it
from ._settings import Settings
from ._wake import DoneWaiter, Waiter

# psycopg (about 0.4 s of CPU to import) and the modules built on it load when the first backend is built, not
# with this module: every dsh-sessions process imports the class through the plugin entry point, and most of them
# never use PostgreSQL.
if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    from ._lease import AdvisoryLease, NoLease

__all__ = ["NotSubmittedError", "PostgresBackend"]


class NotSubmittedError(RuntimeError):
    """``submit_append_batch`` started nothing: the caller appends with ``append_batch`` instead."""


T = TypeVar("T")

#: At close, how long to wait for the committer to settle the groups still queued (seconds).
_COMMITTER_GRACE = 5.0


def _where(conninfo: str, pool: ConnectionPool[Any] | None) -> str:
    """host:port/dbname of the connection settings (for the cursor scope; no credentials)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    text = pool.conninfo if pool is not None and isinstance(pool.conninfo, str) else conninfo
    try:
        params = conninfo_to_dict(text)
    except psycopg.Error:
        return "?"
    return f"{params.get('host', '')}:{params.get('port', '')}/{params.get('dbname', '')}"


class PostgresBackend:
    """Session backend over a PostgreSQL database (sync psycopg 3 in worker threads; asyncio and trio).

    ``conninfo`` is a libpq connection string or URI; ``connection_kwargs`` are psycopg connection keyword
    arguments (for example ``{"prepare_threshold": None}`` behind pgbouncer in transaction mode). Or pass
    ``pool``, a :class:`psycopg_pool.ConnectionPool` the caller owns (then ``conninfo``, ``connection_kwargs``,
    ``min_size`` and ``max_size`` are not used, and :meth:`aclose` leaves the pool open).

    The tables live in ``schema`` (created if missing; any name of at most 63 bytes, case and spaces kept), so
    several independent stores can share one database. The bounds (``lock_timeout``, ``statement_timeout``,
    ``client_timeout``, ``retry_timeout``, ``pool_timeout``, in seconds), ``allow_weak_durability`` and
    ``writer_lease`` (an advisory lock per written session; off by default) are described in the README.
    The server's ``fsync`` and ``synchronous_commit`` are checked at the first use. Supports the optional
    ``load_stored_from``, ``materialize_header``, ``rewrite`` and ``acquire_writer_lease`` primitives;
    ``locate`` returns ``None`` (no artifact path) and raw artifacts are not supported.

    ``encryption`` (a :class:`~dsh.session_persistence.encryption.KeyProvider`; needs the ``cryptography``
    package, the ``[encryption]`` extra) seals every event body of the sessions this backend creates with
    AES-256-GCM under the provider's current key, and opens sealed rows with any key it still holds (see
    :mod:`._sealing`). Listing, ``delete`` and the lease need no key. A store that holds sealed sessions says so
    (schema v2); there a backend without ``encryption`` refuses to write plaintext rows
    (:class:`~dsh.session_persistence_postgres.SealedStoreError`, nothing written) unless ``allow_plaintext=True``.
    """

    NAME = "postgres"
    supports_raw_artifacts = False

    def __init__(
        self,
        conninfo: str = "",
        *,
        schema: str = "public",
        connection_kwargs: Mapping[str, Any] | None = None,
        pool: ConnectionPool[Any] | None = None,
        min_size: int = 1,
        max_size: int = 4,
        compress_threshold: int = DEFAULT_COMPRESS_THRESHOLD,
        lock_timeout: float | None = 10.0,
        statement_timeout: float | None = 30.0,
        client_timeout: float | None = None,
        retry_timeout: float = 30.0,
        pool_timeout: float = 10.0,
        allow_weak_durability: bool = False,
        writer_lease: bool = False,
        encryption: KeyProvider | None = None,
        allow_plaintext: bool = False,
    ) -> None:
        from psycopg_pool import ConnectionPool

        from ._connections import Connections
        from ._group import GroupCommitter, GroupJob
        from ._schema import Tables
        from ._store import SyncStore

        if pool is not None and (conninfo or connection_kwargs):
            raise PostgresConfigurationError("pass either a pool or conninfo/connection_kwargs, not both")
        if pool is not None and not isinstance(pool, ConnectionPool):
            raise PostgresConfigurationError(
                f"pool must be a psycopg_pool.ConnectionPool (sync: the backend runs in worker threads), got {pool!r}"
            )
        if min_size < 0 or max_size < max(1, min_size):
            raise PostgresConfigurationError(
                f"need 0 <= min_size <= max_size and max_size >= 1 ({min_size}, {max_size})"
            )
        if encryption is not None:
            if not isinstance(encryption, KeyProvider):
                raise TypeError(f"encryption must be a KeyProvider, got {type(encryption).__name__}")
            check_cipher_available()  # refused now, not at the first sealed write
        self._tables = Tables(schema)
        self._codec = EventCodec(compress_threshold)
        self._settings = Settings(
            lock_timeout=lock_timeout,
            statement_timeout=statement_timeout,
            client_timeout=client_timeout,
            retry_timeout=retry_timeout,
            pool_timeout=pool_timeout,
            allow_weak_durability=allow_weak_durability,
        )
        connections = Connections(
            conninfo,
            connection_kwargs or {},
            pool,
            min_size=min_size,
            max_size=max_size,
            pool_timeout=pool_timeout,
            client_deadline=self._settings.client_deadline,
            name=f"dsh-{schema}",
        )
        self._connections = connections
        self._scope = f"postgres:{_where(conninfo, pool)}/{schema}"
        self._writer_lease = writer_lease
        self._leases: list[AdvisoryLease] = []
        self._store = SyncStore(
            connections, self._tables, self._codec, self._settings, RowSealer(encryption, allow_plaintext)
        )
        self._chains = WriteChains()
        self._committer = GroupCommitter(self._store, self._chains)
        self._job = GroupJob  # psycopg loads with the first backend, not with this module
        self._closed = False

    @classmethod
    def key_options(cls, kind: str, name: str) -> dict[str, object]:
        """Constructor options for a key source a tool names (``dsh-sessions --key-env NAME`` / ``--key-file
        PATH``): ``{"encryption": StaticKeyProvider.from_source(kind, name)}``; a source without a usable key
        raises :class:`~dsh.session_persistence.encryption.SessionKeyError`."""
        return {"encryption": StaticKeyProvider.from_source(kind, name)}

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        # A read: a cancelled caller leaves, the thread ends on its own (bounded by the timeouts).
        return await run_abandonable(fn, *args)

    async def _write(self, session_id: str, fn: Callable[..., None], *args: Any) -> None:
        # A write: after the session's previous write has ended; told whether that one's outcome is unknown.
        await self._chains.run(session_id, functools.partial(fn, *args))

    # -- reads -------------------------------------------------------------------------------------------

    async def load_stored(self, session_id: str) -> StoredPrefix | None:
        """The whole stored log, read in one repeatable-read snapshot; never a torn marker."""
        loaded = await self._run(self._store.read, session_id, 0)
        if loaded is None:
            return None
        meta, cut, events, revision = loaded
        return StoredPrefix(meta=meta, inherited_event_count=cut, events=events, revision=revision, torn_marker=None)

    async def load_stored_from(self, session_id: str, from_seq: int) -> StoredSuffix | None:
        """Seek read: only the rows with ``seq >= from_seq`` are fetched (primary-key range scan)."""
        loaded = await self._run(self._store.read, session_id, from_seq)
        if loaded is None:
            return None
        meta, cut, events, _revision = loaded
        return StoredSuffix(meta=meta, inherited_event_count=cut, events=events)

    async def read_stored_revision(self, session_id: str) -> str | None:
        """The session row's revision, ``None`` if absent."""
        return await self._run(self._store.revision, session_id)

    async def list(self) -> builtins.list[SessionHeader]:
        """Headers of every stored session, in creation order (the events are not read)."""
        return [snapshot.header for snapshot in await self.list_snapshots()]

    async def list_snapshots(self) -> builtins.list[SessionSnapshot]:
        """Headers and revisions of every stored session, in creation order (an index scan)."""
        rows = await self._run(self._store.snapshots)
        return [SessionSnapshot(header=header, revision=revision) for header, revision in rows]

    def locate(self, meta: SessionHeader) -> SessionLocation | None:
        """No per-session artifact path: always ``None``."""
        return None

    # -- writes (each one transaction) -------------------------------------------------------------------

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        """Append a contiguous batch in one transaction; the first batch inserts the session row with it.

        A connection lost after the batch was sent is settled by reading back: the call returns normally if
        the batch is stored, sends it again if it is not, and raises
        :class:`~dsh.session_persistence.SessionWriteInDoubtError` if the state cannot be read within
        ``retry_timeout``.
        """
        session_id = storage.meta.id
        if not is_materialized:
            check_contiguous(session_id, 0, events)
            if len(events) < storage.inherited_event_count:
                raise IncompleteInheritedPrefixError(
                    f'session "{session_id}" cannot materialize before its inherited prefix is complete'
                )
            rows = [self._codec.encode(e) for e in events]
            await self._write(session_id, self._store.append, storage, rows, 0, True)
            return
        if not events:
            return
        first = events[0].seq
        check_contiguous(session_id, first, events)
        rows = [self._codec.encode(e) for e in events]
        link = self._chains.enter(session_id)
        if link is None:  # a write of the session is in flight or in doubt: after it, on its own
            await self._write(session_id, self._store.append, storage, rows, first, False)
            return
        waiter = Waiter()
        job = self._job(storage, first, rows, link, waiter)
        self._committer.submit(job)
        try:
            await waiter.wait()
        except BaseException:
            self._chains.abandon(session_id, link)  # the write goes on; the session's next write reads back
            raise
        if job.error is not None:
            raise job.error

    def submit_append_batch(
        self,
        storage: StorageMetadata,
        events: Sequence[SessionEvent],
        is_materialized: bool,
        done: Callable[[BaseException | None], None],
    ) -> None:
        """:meth:`append_batch` without an await (the core's ``SupportsSubmitAppend``): a later batch joins the
        committer's next group, and ``done(error)`` is called on the committer thread once the group has settled
        (read back if its reply was lost). A first batch, or a session with a write in flight or in doubt, is
        refused before anything starts (:class:`NotSubmittedError`): the coordinator then awaits
        :meth:`append_batch`, which handles it. ``done`` is never called for a refused submit."""
        session_id = storage.meta.id
        if not is_materialized or not events:
            raise NotSubmittedError(f'session "{session_id}": a first or empty batch is appended with append_batch')
        first = events[0].seq
        check_contiguous(session_id, first, events)
        rows = [self._codec.encode(e) for e in events]
        link = self._chains.enter(session_id)
        if link is None:
            raise NotSubmittedError(f'session "{session_id}" has a write in flight or in doubt')
        waiter = DoneWaiter(done)
        job = waiter.job = self._job(storage, first, rows, link, waiter)
        self._committer.submit(job)

    async def commit_repair(
        self, storage: StorageMetadata, torn_marker: object | None, closers: Sequence[SessionEvent]
    ) -> None:
        """Append ``closers`` (one transaction). There are never torn tails to cut: the marker must be ``None``."""
        if torn_marker is not None:
            raise SessionPersistenceCorruptionError(
                f'session "{storage.meta.id}": PostgresBackend never reports torn tails (marker {torn_marker!r})'
            )
        await self.append_batch(storage, closers, True)

    async def materialize_header(self, storage: StorageMetadata) -> None:
        """Insert a header-only session row; refuses an id that is already stored."""
        await self._write(storage.meta.id, self._store.append, storage, [], 0, True)

    async def rewrite(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        """Replace the whole log with ``events`` (contiguous from 0) in one transaction; header and cut kept."""
        session_id = storage.meta.id
        check_contiguous(session_id, 0, events)
        rows = [self._codec.encode(e) for e in events]
        await self._write(session_id, self._store.rewrite, session_id, rows)

    # -- lifecycle ---------------------------------------------------------------------------------------

    @property
    def cursor_scope(self) -> str:
        """The database and schema this backend lists (page cursors are bound to it)."""
        return self._scope

    async def list_page(self, query: ListQuery) -> builtins.list[SessionListing]:
        """One page in the query's order (recent: last durable write; created) with its filters: an index scan."""
        rows = await self._run(self._store.list_page, query)
        return [SessionListing(header=header, updated_at=at, revision=revision) for header, at, revision in rows]

    async def delete(self, session_id: str, expected_revision: str | None = None) -> None:
        """Remove the session and its events in one transaction (only at ``expected_revision`` if given)."""
        lease = await self.acquire_writer_lease(SessionHeader(id=session_id, created_at=0))
        try:
            await self._write(session_id, self._store.delete, session_id, expected_revision)
        finally:
            await lease.release()

    async def compact(self, storage: StorageMetadata, events: Sequence[SessionEvent], expected_revision: str) -> None:
        """Rewrite the log as ``events`` in one transaction, only if the session is still at ``expected_revision``.

        Rows carry no batch structure here, so this only re-stores the same events (a new revision).
        """
        session_id = storage.meta.id
        check_contiguous(session_id, 0, events)
        rows = [self._codec.encode(e) for e in events]
        await self._write(session_id, self._store.rewrite, session_id, rows, expected_revision)

    async def acquire_writer_lease(self, meta: SessionHeader) -> AdvisoryLease | NoLease:
        """The session's writer lease: a no-op unless ``writer_lease=True``, then an advisory lock.

        Off, a second writer is still refused by the compare-and-set on ``next_seq`` at its first write. On,
        it is refused up front with :class:`~dsh.session_persistence.SessionLockedError` naming the holder;
        each held lease uses a connection of its own until released.
        """
        from ._lease import NoLease, acquire_advisory_lease

        if not self._writer_lease:
            return NoLease()
        await self._run(self._store.start)
        # Not abandoned: a lease taken after its caller left would never be released (connect_timeout bounds it).
        lease = await anyio.to_thread.run_sync(
            acquire_advisory_lease, self._connections, self._tables.schema_name, meta.id
        )
        self._leases = [held for held in self._leases if held.held] + [lease]
        return lease

    async def aclose(self) -> None:
        """Close the connection pool it owns (idempotent; a caller's pool stays open)."""
        if self._closed:
            return
        self._closed = True
        self._chains.close()
        with anyio.CancelScope(shield=True):
            for lease in self._leases:  # leases the coordinator did not release end with the backend
                await lease.release()
            await anyio.to_thread.run_sync(self._store.close)
            # The jobs still queued fail typed on the closed store (their callers are woken); bounded like close.
            await anyio.to_thread.run_sync(self._committer.close, _COMMITTER_GRACE)

    def __repr__(self) -> str:
        return f"PostgresBackend(schema={self._tables.schema_name!r})"
