"""``PostgresBackend``: the session backend primitives (coordinator.md §2.1) as PostgreSQL transactions.

Every mutating primitive is one transaction, so there are no torn tails: a crash or a lost connection leaves a
batch wholly committed or wholly absent, ``load_stored`` never reports a torn marker and ``commit_repair`` only
appends closers. Seq contiguity is enforced by the database too, not only by the coordinator: a batch commits
only through a compare-and-set ``UPDATE ... WHERE next_seq = <first seq>`` on the session row (which holds the
row lock until commit), and ``(session_id, seq)`` is the events' primary key. Two processes racing on one id
therefore never interleave or duplicate a seq: the loser gets :class:`SeqMismatchError` (or
:class:`SessionAlreadyExistsError` for the first batch).

psycopg's async API runs on asyncio only; on trio every primitive raises :class:`UnsupportedOperationError`.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Sequence

import anyio
import msgspec
import psycopg
import zstandard
from psycopg import AsyncConnection, sql
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from ._codec import DEFAULT_COMPRESS_THRESHOLD, EventCodec
from ._core import (
    IncompleteInheritedPrefixError,
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionEvent,
    SessionHeader,
    SessionLocation,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionSnapshot,
    StorageMetadata,
    StoredPrefix,
    StoredSuffix,
    UnsupportedOperationError,
    check_contiguous,
    header_to_builtins,
)
from ._schema import Tables, ensure_schema

__all__ = ["PostgresBackend"]

_Conn = AsyncConnection[TupleRow]

_TRIO_REFUSAL = (
    "PostgresBackend runs on asyncio only: psycopg's async API does not support trio "
    "(run the application on anyio's asyncio backend, or use another backend under trio)"
)


def _header(session_id: str, text: str) -> SessionHeader:
    # Storage keeps whatever header was written (a newer version included); the coordinator validates it.
    try:
        return msgspec.json.decode(text, type=SessionHeader)
    except msgspec.MsgspecError as exc:
        raise SessionPersistenceCorruptionError(f'stored session "{session_id}" failed validation: {exc}') from exc


class PostgresBackend:
    """Session backend over a PostgreSQL database (psycopg 3, async connection pool, asyncio only).

    ``PostgresBackend(conninfo, *, schema="public", min_size=1, max_size=4, compress_threshold=4096,
    pool_timeout=30.0)``. ``conninfo`` is a libpq connection string or URI. The backend's tables live in
    ``schema`` (created if missing), so several independent stores can share one database. The pool opens
    lazily on first use and is closed by :meth:`aclose`. Supports the optional ``load_stored_from``,
    ``materialize_header`` and ``rewrite`` primitives; ``locate`` returns ``None`` (no artifact path) and raw
    artifacts are not supported.
    """

    NAME = "postgres"
    supports_raw_artifacts = False

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = "public",
        min_size: int = 1,
        max_size: int = 4,
        compress_threshold: int = DEFAULT_COMPRESS_THRESHOLD,
        pool_timeout: float = 30.0,
    ) -> None:
        self._tables = Tables(schema)
        self._codec = EventCodec(compress_threshold)
        self._pool: AsyncConnectionPool[_Conn] = AsyncConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            open=False,
            timeout=pool_timeout,
            kwargs={"autocommit": True},
            name=f"dsh-{schema}",
        )
        self._store_id: str | None = None
        self._start_lock: anyio.Lock | None = None
        self._closed = False

    # -- reads -------------------------------------------------------------------------------------------

    async def load_stored(self, session_id: str) -> StoredPrefix | None:
        """The whole stored log, read in one repeatable-read snapshot; never a torn marker."""
        loaded = await self._read(session_id, 0)
        if loaded is None:
            return None
        meta, cut, events, revision = loaded
        return StoredPrefix(meta=meta, inherited_event_count=cut, events=events, revision=revision, torn_marker=None)

    async def load_stored_from(self, session_id: str, from_seq: int) -> StoredSuffix | None:
        """Seek read: only the rows with ``seq >= from_seq`` are fetched (primary-key range scan)."""
        loaded = await self._read(session_id, from_seq)
        if loaded is None:
            return None
        meta, cut, events, _revision = loaded
        return StoredSuffix(meta=meta, inherited_event_count=cut, events=events)

    async def read_stored_revision(self, session_id: str) -> str | None:
        """The session row's revision, ``None`` if absent."""
        store_id = await self._start()
        t = self._tables
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                sql.SQL("SELECT revision FROM {sessions} WHERE id = %s").format(sessions=t.sessions), (session_id,)
            )
            row = await cur.fetchone()
        return None if row is None else f"{store_id}:{row[0]}"

    async def list(self) -> builtins.list[SessionHeader]:
        """Headers of every stored session, in creation order (the events are not read)."""
        return [snapshot.header for snapshot in await self.list_snapshots()]

    async def list_snapshots(self) -> builtins.list[SessionSnapshot]:
        """Headers and revisions of every stored session, in creation order."""
        store_id = await self._start()
        t = self._tables
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                sql.SQL("SELECT id, header::text, revision FROM {sessions} ORDER BY created_revision").format(
                    sessions=t.sessions
                )
            )
            rows = await cur.fetchall()
        return [SessionSnapshot(header=_header(sid, text), revision=f"{store_id}:{rev}") for sid, text, rev in rows]

    def locate(self, meta: SessionHeader) -> SessionLocation | None:
        """No per-session artifact path: always ``None``."""
        return None

    # -- writes (each one transaction) -------------------------------------------------------------------

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        """Append a contiguous batch in one transaction; the first batch inserts the session row with it."""
        await self._start()
        session_id = storage.meta.id
        if not is_materialized:
            check_contiguous(session_id, 0, events)
            if len(events) < storage.inherited_event_count:
                raise IncompleteInheritedPrefixError(
                    f'session "{session_id}" cannot materialize before its inherited prefix is complete'
                )
            rows = [self._codec.encode(e) for e in events]
            async with self._pool.connection() as conn, conn.transaction():
                await self._insert_session(conn, storage, len(rows))
                await self._copy_events(conn, session_id, rows)
            return
        if not events:
            return
        first = events[0].seq
        check_contiguous(session_id, first, events)
        rows = [self._codec.encode(e) for e in events]
        async with self._pool.connection() as conn, conn.transaction():
            await self._advance(conn, session_id, first, len(rows))
            await self._copy_events(conn, session_id, rows)

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
        await self._start()
        async with self._pool.connection() as conn, conn.transaction():
            await self._insert_session(conn, storage, 0)

    async def rewrite(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        """Replace the whole log with ``events`` (contiguous from 0) in one transaction; header and cut kept."""
        await self._start()
        session_id = storage.meta.id
        check_contiguous(session_id, 0, events)
        rows = [self._codec.encode(e) for e in events]
        t = self._tables
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                sql.SQL("SELECT next_seq FROM {sessions} WHERE id = %s FOR UPDATE").format(sessions=t.sessions),
                (session_id,),
            )
            if await cur.fetchone() is None:
                raise SessionNotFoundError(session_id)
            await conn.execute(
                sql.SQL("DELETE FROM {events} WHERE session_id = %s").format(events=t.events), (session_id,)
            )
            await self._copy_events(conn, session_id, rows)
            await conn.execute(
                sql.SQL("UPDATE {sessions} SET next_seq = %s, revision = nextval({rev}) WHERE id = %s").format(
                    sessions=t.sessions, rev=t.revisions_literal
                ),
                (len(rows), session_id),
            )

    async def aclose(self) -> None:
        """Close the connection pool (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._store_id is not None:
            with anyio.CancelScope(shield=True):
                await self._pool.close()

    # -- internals ---------------------------------------------------------------------------------------

    async def _start(self) -> str:
        """Open the pool and check (or create) the schema, once; return the store id."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise UnsupportedOperationError(_TRIO_REFUSAL) from None
        if self._store_id is not None:
            return self._store_id
        if self._closed:
            raise RuntimeError("PostgresBackend is closed")
        if self._start_lock is None:
            self._start_lock = anyio.Lock()
        async with self._start_lock:
            if self._store_id is None:
                await self._pool.open()
                try:
                    async with self._pool.connection() as conn:
                        self._store_id = await ensure_schema(conn, self._tables)
                except BaseException:
                    with anyio.CancelScope(shield=True):
                        await self._pool.close()
                    # A failed start leaves the instance unusable but closable.
                    self._closed = True
                    raise
            return self._store_id

    async def _read(
        self, session_id: str, from_seq: int
    ) -> tuple[SessionHeader, int, builtins.list[SessionEvent], str] | None:
        store_id = await self._start()
        t = self._tables
        async with self._pool.connection() as conn, conn.transaction():
            # One snapshot for the session row and its events: a concurrent commit is seen wholly or not at all.
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            cur = await conn.execute(
                sql.SQL(
                    "SELECT header::text, inherited_event_count, next_seq, revision FROM {sessions} WHERE id = %s"
                ).format(sessions=t.sessions),
                (session_id,),
            )
            head = await cur.fetchone()
            if head is None:
                return None
            cur = await conn.execute(
                sql.SQL(
                    "SELECT seq, compressed, body FROM {events} WHERE session_id = %s AND seq >= %s ORDER BY seq"
                ).format(events=t.events),
                (session_id, from_seq),
            )
            rows = await cur.fetchall()
        header_text, cut, next_seq, revision = head
        meta = _header(session_id, header_text)
        expected = list(range(from_seq, next_seq))
        if [row[0] for row in rows] != expected:
            found = [row[0] for row in rows]
            gap = next(
                (f"expected {e}, got {s}" for e, s in zip(expected, found, strict=False) if e != s),
                f"expected {len(expected)} event(s) from seq {from_seq}, found {len(found)}",
            )
            raise SessionPersistenceCorruptionError(
                f'corrupt session log "{session_id}": seq gap in committed rows ({gap})'
            )
        try:
            events = [self._codec.decode(compressed, bytes(body)) for _seq, compressed, body in rows]
        except (ValueError, msgspec.MsgspecError, zstandard.ZstdError) as exc:
            raise SessionPersistenceCorruptionError(f'stored session "{session_id}" failed validation: {exc}') from exc
        return meta, int(cut), events, f"{store_id}:{revision}"

    async def _insert_session(self, conn: _Conn, storage: StorageMetadata, next_seq: int) -> None:
        t = self._tables
        session_id = storage.meta.id
        header = msgspec.json.encode(header_to_builtins(storage.meta)).decode()
        cur = await conn.execute(
            sql.SQL(
                "WITH r AS (SELECT nextval({rev}) AS v) "
                "INSERT INTO {sessions} (id, header, inherited_event_count, next_seq, revision, created_revision) "
                "SELECT %s, %s::json, %s, %s, r.v, r.v FROM r ON CONFLICT (id) DO NOTHING RETURNING id"
            ).format(sessions=t.sessions, rev=t.revisions_literal),
            (session_id, header, storage.inherited_event_count, next_seq),
        )
        if await cur.fetchone() is None:
            raise SessionAlreadyExistsError(f'session "{session_id}" already has a persisted log')

    async def _advance(self, conn: _Conn, session_id: str, first: int, count: int) -> None:
        """Compare-and-set ``next_seq`` from ``first`` to ``first + count`` (takes the row lock until commit)."""
        t = self._tables
        cur = await conn.execute(
            sql.SQL(
                "UPDATE {sessions} SET next_seq = next_seq + %s, revision = nextval({rev}) "
                "WHERE id = %s AND next_seq = %s RETURNING next_seq"
            ).format(sessions=t.sessions, rev=t.revisions_literal),
            (count, session_id, first),
        )
        if await cur.fetchone() is not None:
            return
        cur = await conn.execute(
            sql.SQL("SELECT next_seq FROM {sessions} WHERE id = %s").format(sessions=t.sessions), (session_id,)
        )
        row = await cur.fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        raise SeqMismatchError(f'append seq mismatch for "{session_id}": expected {row[0]} at index 0, got {first}')

    async def _copy_events(self, conn: _Conn, session_id: str, rows: Sequence[tuple[int, bool, bytes]]) -> None:
        if not rows:
            return
        t = self._tables
        query = sql.SQL("COPY {events} (session_id, seq, compressed, body) FROM STDIN").format(events=t.events)
        try:
            async with conn.cursor() as cur, cur.copy(query) as copy:
                for seq, compressed, body in rows:
                    await copy.write_row((session_id, seq, compressed, body))
        except psycopg.errors.UniqueViolation as exc:
            # Only reachable if rows exist past next_seq (an external writer): refuse, never overwrite.
            raise SeqMismatchError(f'append seq mismatch for "{session_id}": seq already stored ({exc})') from exc

    def __repr__(self) -> str:
        return f"PostgresBackend(schema={self._tables.schema_name!r})"
