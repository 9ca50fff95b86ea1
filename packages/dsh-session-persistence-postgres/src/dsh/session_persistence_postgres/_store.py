"""The backend primitives as blocking calls on sync psycopg connections (run in worker threads).

Each primitive is one message (see :func:`one_message_transaction`): ``BEGIN``, its timeouts (``SET LOCAL``
through ``set_config``), its statements and ``COMMIT`` go out together and cost one round trip. No primitive uses
a plain ``execute``, which psycopg turns into a server-side prepared statement after five uses (fatal behind a
transaction-mode pooler: the next client on that server connection finds the name taken). Reads run in one
repeatable-read snapshot, so a concurrent commit is seen wholly or not at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import psycopg
import zstandard
from psycopg import pq, sql

from ._codec import EventCodec
from ._connections import Conn, Connections
from ._core import (
    ListQuery,
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionChangedError,
    SessionEvent,
    SessionHeader,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionStorageError,
    StorageMetadata,
    header_to_builtins,
)
from ._errors import WeakDurabilityError
from ._limits import SEALED_SCHEMA_VERSION
from ._retry import Outcome, Retrier
from ._schema import Tables, ensure_schema
from ._sealing import Row, RowSealer, SealCache, StoredRow, new_seal_id
from ._settings import Settings
from ._statements import Statements, list_page_query

__all__ = ["SNAPSHOT", "Loaded", "SyncStore", "cas_refused"]

_log = logging.getLogger("dsh.session_persistence_postgres")

#: header, inherited cut, events, revision token
Loaded = tuple[SessionHeader, int, list[SessionEvent], str]


Statement = tuple[sql.Composed, Mapping[str, Any]]
SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_TUPLES_OK = pq.ExecStatus.TUPLES_OK


def one_message_transaction(
    conn: Conn, begin: str, statements: Sequence[Statement | str]
) -> list[list[tuple[Any, ...]]]:
    """Run ``begin``, ``statements`` and ``COMMIT`` as one simple-protocol message; each statement's rows, in order.

    One message is one round trip and ends with a single ``ReadyForQuery``, which is what a pooler in transaction
    mode (pgbouncer) releases its server connection on. libpq's pipeline mode would also be one round trip, but
    psycopg ends a pipeline with ``Sync`` then ``Flush``: a ``Flush`` reaching pgbouncer 1.18 after the ``Sync``'s
    reply released the server connection is given a server connection of its own that never answers, and each one
    leaks until every client hangs. The parameters are bound on the client (psycopg quotes them), which also
    needs no server-side prepared statements. If a statement fails the rest are skipped and the transaction is left
    failed; the caller's connection guard rolls it back. A statement given as ``str`` is already bound (see
    :meth:`SyncStore.transaction`).
    """
    cur = psycopg.ClientCursor(conn)
    bound = [statement if isinstance(statement, str) else cur.mogrify(*statement) for statement in statements]
    # A message of several statements is never prepared, so psycopg's prepared-statement bookkeeping (a hash of the
    # whole text, a cache entry made and dropped again) is switched off for it; the connection's setting is kept.
    threshold = conn.prepare_threshold
    if threshold is not None:
        conn.prepare_threshold = None
    try:
        cur.execute("; ".join([begin, *bound, "COMMIT"]))
    finally:
        if threshold is not None:
            conn.prepare_threshold = threshold
    rows: list[list[tuple[Any, ...]]] = []
    for _ in statements:
        if not cur.nextset():
            raise psycopg.InterfaceError(f"expected {len(statements) + 2} results from one transaction")
        # The result's status, not ``description`` (which builds a Column per field on every read).
        result = cur.pgresult
        rows.append(cur.fetchall() if result is not None and result.status == _TUPLES_OK else [])
    return rows


def decode_header(session_id: str, text: str) -> SessionHeader:
    """The stored header (any version: the coordinator validates it)."""
    try:
        return msgspec.json.decode(text, type=SessionHeader)
    except msgspec.MsgspecError as exc:
        raise SessionPersistenceCorruptionError(f'stored session "{session_id}" failed validation: {exc}') from exc


def cas_refused(session_id: str, snapshot_next_seq: int, first: int) -> str:
    """The message of a refused compare-and-set, true in both cases it covers.

    ``snapshot_next_seq`` is read in the statement's snapshot, taken before the statement waited for the row lock:
    when it equals ``first`` the batch was in line when sent, and another writer's commit moved the row on while
    this one waited (its next_seq is newer than the snapshot can show).
    """
    if snapshot_next_seq == first:
        return (
            f'append seq mismatch for "{session_id}": another writer stored seq {first} first (the stored log moved '
            "on while this batch waited for the session row)"
        )
    return f'append seq mismatch for "{session_id}": expected {snapshot_next_seq} at index 0, got {first}'


def _weakened(fsync: str, synchronous_commit: str) -> dict[str, str]:
    weak = {}
    if fsync != "on":
        weak["fsync"] = fsync
    if synchronous_commit == "off":
        weak["synchronous_commit"] = synchronous_commit
    return weak


class SyncStore:
    """Blocking primitives over one schema; thread-safe (each call takes its own pooled connection)."""

    def __init__(
        self, connections: Connections, tables: Tables, codec: EventCodec, settings: Settings, sealer: RowSealer
    ) -> None:
        self._connections = connections
        self._tables = tables
        self._codec = codec
        self._sealer = sealer
        self._seals = SealCache()
        self._settings = settings
        self._sql = Statements.for_tables(tables)
        self._retry = Retrier(connections, settings.retry_timeout)
        # What the group committer (:mod:`._group`) writes through: the same statements, retry rules and seals.
        self.statements = self._sql
        self.retrier = self._retry
        self.retry_timeout = settings.retry_timeout
        self.sealer = sealer
        self.seals = self._seals
        lock, statement = settings.server_timeouts()
        self._timeouts = {"lock": lock, "statement": statement}
        #: The timeouts statement bound once per client encoding (the same text for every transaction).
        self._bound_timeouts: dict[str, str] = {}
        self._start_lock = threading.Lock()
        self._store_id: str | None = None
        self._closed = False
        self._warned: set[str] = set()
        connections.on_new_connection = self.check_durability

    # -- start ------------------------------------------------------------------------------------------

    def start(self) -> str:
        """Check the server and the schema once; return the store id. A failed start may be tried again."""
        store_id = self._store_id
        if store_id is not None:
            return store_id
        with self._start_lock:
            if self._closed:
                raise SessionStorageError("PostgresBackend is closed")
            if self._store_id is None:
                # The first contact is a direct connection: its real error (refused, bad password...) surfaces
                # at once instead of a pool timeout; a server that is starting up is waited for.
                self._store_id = self._retry.read("start", self._start_on, direct=True)
                self._connections.open()
            return self._store_id

    def _start_on(self, conn: Conn) -> str:
        # The durability settings were checked on this connection's first use (check_durability).
        store_id, version = ensure_schema(conn, self._tables, sealing=self._sealer.keys is not None)
        self._sealer.sealed_store = version == SEALED_SCHEMA_VERSION  # a keyless backend then writes no plaintext
        return store_id

    def check_durability(self, conn: Conn) -> None:
        """Refuse (or warn about) a connection whose server session runs with weakened durability.

        Run on every new connection, not once: ``ALTER DATABASE ... SET synchronous_commit = off`` or a reloaded
        ``postgresql.conf`` changes what later sessions run with, so the first connection proves nothing about
        the next. The warning for an accepted weak setting is logged once per backend.
        """
        row = psycopg.ClientCursor(conn).execute(self._sql.settings).fetchone()
        fsync, synchronous_commit = (str(row[0]), str(row[1])) if row is not None else ("?", "?")
        weak = _weakened(fsync, synchronous_commit)
        if not weak:
            return
        listed = ", ".join(f"{name}={value}" for name, value in weak.items())
        if not self._settings.allow_weak_durability:
            raise WeakDurabilityError(
                f"the PostgreSQL server runs with {listed}: it acknowledges commits that a crash can lose, so "
                "acknowledged session events would not be durable. Fix the server setting (fsync=on, "
                "synchronous_commit=on or stronger), or pass allow_weak_durability=True to accept the risk",
                weak,
            )
        if listed not in self._warned:
            self._warned.add(listed)
            _log.warning("PostgreSQL runs with %s: acknowledged events may be lost in a crash", listed)

    def close(self) -> None:
        # Not under the start lock: a start still retrying (a thread whose caller left) holds it for up to
        # retry_timeout; the closing connections refuse its next attempt.
        self._closed = True
        self._connections.close()

    # -- reads ------------------------------------------------------------------------------------------

    def transaction(self, conn: Conn, begin: str, statements: Sequence[Statement]) -> list[list[tuple[Any, ...]]]:
        """``statements`` between ``begin`` and ``COMMIT``, under the timeouts: their rows, one list each."""
        encoding = conn.info.encoding
        timeouts = self._bound_timeouts.get(encoding)
        if timeouts is None:
            timeouts = psycopg.ClientCursor(conn).mogrify(self._sql.set_timeouts, self._timeouts)
            self._bound_timeouts[encoding] = timeouts
        return one_message_transaction(conn, begin, [timeouts, *statements])[1:]

    def read(self, session_id: str, from_seq: int) -> Loaded | None:
        """The session from ``from_seq`` on, in one snapshot; ``None`` if it is not stored."""
        store_id = self.start()
        params = {"id": session_id, "from": from_seq}

        def body(conn: Conn) -> tuple[Any, list[Any]] | None:
            head, rows = self.transaction(conn, SNAPSHOT, [(self._sql.head, params), (self._sql.events_from, params)])
            return None if not head else (head[0], rows)

        found = self._retry.read("load", body)
        if found is None:
            return None
        (header_text, cut, next_seq, revision, seal_id), rows = found
        meta = decode_header(session_id, header_text)
        expected = list(range(from_seq, next_seq))
        seqs = [row[0] for row in rows]
        if seqs != expected:
            gap = next(
                (f"expected {e}, got {s}" for e, s in zip(expected, seqs, strict=False) if e != s),
                f"expected {len(expected)} event(s) from seq {from_seq}, found {len(seqs)}",
            )
            raise SessionPersistenceCorruptionError(
                f'corrupt session log "{session_id}": seq gap in committed rows ({gap})'
            )
        self._seals.put(session_id, seal_id)
        bodies = self._sealer.open_rows(store_id, session_id, seal_id, rows)  # typed key errors
        try:
            events = [self._codec.decode(row[1], body) for row, body in zip(rows, bodies, strict=True)]
        except (ValueError, msgspec.MsgspecError, zstandard.ZstdError) as exc:
            raise SessionPersistenceCorruptionError(f'stored session "{session_id}" failed validation: {exc}') from exc
        return meta, int(cut), events, f"{store_id}:{revision}"

    def revision(self, session_id: str) -> str | None:
        store_id = self.start()
        (rows,) = self._retry.read(
            "read revision", lambda conn: self.transaction(conn, SNAPSHOT, [(self._sql.revision, {"id": session_id})])
        )
        return None if not rows else f"{store_id}:{rows[0][0]}"

    def snapshots(self) -> list[tuple[SessionHeader, str]]:
        store_id = self.start()
        (rows,) = self._retry.read("list", lambda conn: self.transaction(conn, SNAPSHOT, [(self._sql.snapshots, {})]))
        listed = []
        for sid, text, rev in rows:
            try:
                header = decode_header(sid, text)
            except SessionPersistenceCorruptionError as exc:
                # One damaged header makes that session unlistable, never the whole list (load reports it).
                _log.warning("list: leaving out %r: %s", sid, exc)
                continue
            listed.append((header, f"{store_id}:{rev}"))
        return listed

    # -- writes -----------------------------------------------------------------------------------------

    def append(
        self, storage: StorageMetadata, rows: Sequence[Row], first: int, create: bool, *, after_unknown: bool = False
    ) -> None:
        """Store ``rows`` (seqs ``first...``): as the session's first batch (``create``) or a later one.

        ``after_unknown``: the session's previous write was abandoned by its caller after it was sent; these rows
        are read back first (a caller retrying the batch it abandoned finds it stored, and nothing is sent).
        """
        store_id = self.start()
        session_id = storage.meta.id
        header: str | None = None
        params: dict[str, Any]
        if create:
            # A backend given keys creates sealed sessions (a fresh incarnation id); without keys, plaintext ones.
            seal_id = new_seal_id() if self._sealer.keys is not None else None
            header = msgspec.json.encode(header_to_builtins(storage.meta)).decode()
            params = {"id": session_id, "header": header, "cut": storage.inherited_event_count, "n": len(rows)}
        else:
            seal_id = self.seal_of(session_id)  # a plaintext session stays plaintext, a sealed one sealed
            params = {"id": session_id, "first": first, "n": len(rows)}
        # Sealed once: a retried attempt sends the very same bytes.
        params.update(self._sealer.seal_rows(store_id, session_id, seal_id, rows).params(), seal=seal_id)

        def attempt(conn: Conn) -> None:
            ((result,),) = self.transaction(conn, "BEGIN", [(self._sql.create if create else self._sql.append, params)])
            if result[0] == 1:
                self._seals.put(session_id, seal_id)
                return
            if create:
                raise SessionAlreadyExistsError(f'session "{session_id}" already has a persisted log')
            if result[2] is None:
                raise SessionNotFoundError(session_id)
            if not result[3]:
                self._seals.forget(session_id)
                raise SeqMismatchError(
                    f'append refused for "{session_id}": the session was deleted and created again since this '
                    "backend last read it (its seal id changed)"
                )
            raise SeqMismatchError(cas_refused(session_id, int(result[2]), first))

        def settle(conn: Conn) -> Outcome:
            return self._settle_append(conn, store_id, session_id, rows, first, header, seal_id)

        if after_unknown and self._retry.read("append (read-back)", settle) is Outcome.STORED:
            return
        try:
            self._retry.write("append", attempt, settle)
        except SessionStorageError as exc:
            if isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                # Rows past next_seq (an external writer): refuse, never overwrite.
                raise SeqMismatchError(f'append seq mismatch for "{session_id}": seq already stored') from exc
            raise

    def _settle_append(
        self,
        conn: Conn,
        store_id: str,
        session_id: str,
        rows: Sequence[Row],
        first: int,
        header: str | None,
        seal_id: str | None,
    ) -> Outcome:
        create = header is not None
        params = {"id": session_id, "from": first, "to": first + len(rows)}

        heads, stored = self.transaction(conn, SNAPSHOT, [(self._sql.head, params), (self._sql.events_between, params)])
        head = heads[0] if heads else None
        if head is None:
            if create:
                return Outcome.ABSENT
            raise SessionNotFoundError(session_id)
        header_text, _cut, next_seq, _rev, stored_seal = head
        # A create this call abandoned drew its own seal id: the stored one opens its rows (the header and the
        # plaintext decide). A later batch must find the incarnation it was sealed for.
        same_place = header_text == header if create else stored_seal == seal_id
        if same_place and self.same_rows(store_id, session_id, stored_seal, stored, rows):
            self._seals.put(session_id, stored_seal)
            return Outcome.STORED
        if create:
            raise SessionAlreadyExistsError(f'session "{session_id}" already has a persisted log')
        if not stored and next_seq == first:
            return Outcome.ABSENT
        raise SeqMismatchError(
            f'append seq mismatch for "{session_id}": expected {next_seq} at index 0, got {first} '
            "(another writer stored these seqs)"
        )

    def same_rows(
        self, store_id: str, session_id: str, seal_id: str | None, stored: Sequence[StoredRow], rows: Sequence[Row]
    ) -> bool:
        """Whether ``stored`` holds the events of ``rows`` (compared as JSON: a re-sealed row has a new nonce)."""
        if len(stored) != len(rows):
            return False
        for row, (want_seq, want_compressed, want_body) in zip(stored, rows, strict=True):
            if row[0] != want_seq:
                return False
            try:
                body = self._sealer.open_row(store_id, session_id, seal_id, row)
                if self._codec.raw(row[1], body) != self._codec.raw(want_compressed, want_body):
                    return False
            except (zstandard.ZstdError, SessionPersistenceError):
                return False  # rows it cannot open are not the ones this call sealed
        return True

    def seal_of(self, session_id: str) -> str | None:
        """The session's seal id (``None``: plaintext), remembered or read; :class:`SessionNotFoundError` if absent."""
        known, seal_id = self._seals.get(session_id)
        if known:
            return seal_id
        (rows,) = self._retry.read(
            "read seal", lambda conn: self.transaction(conn, SNAPSHOT, [(self._sql.seal, {"id": session_id})])
        )
        if not rows:
            raise SessionNotFoundError(session_id)
        seal_id = None if rows[0][0] is None else str(rows[0][0])
        self._seals.put(session_id, seal_id)
        return seal_id

    def rewrite(
        self, session_id: str, rows: Sequence[Row], expected_revision: str | None = None, *, after_unknown: bool = False
    ) -> None:
        """Replace the log with ``rows`` (seqs from 0), header and cut kept; idempotent, so simply retried.

        With ``expected_revision`` (compaction) nothing is written unless the session is still at it. Idempotent
        and revision-checked, so an abandoned write before it needs no read-back (``after_unknown`` is unused).
        """
        store_id = self.start()
        expected = None if expected_revision is None else self._revision_number(session_id, expected_revision, store_id)
        seal_id = self.seal_of(session_id)
        new_seal = seal_id
        if expected is not None and seal_id is None and self._sealer.keys is not None:
            new_seal = new_seal_id()  # a compaction (re-encrypt) given keys seals a plaintext session
        sealed = self._sealer.seal_rows(store_id, session_id, new_seal, rows)
        # A compaction is not activity (``updated_at`` kept); a truncation is.
        params = {
            "id": session_id,
            "n": len(rows),
            "expected": expected,
            "touch": expected is None,
            "seal": seal_id,
            "new_seal": new_seal,
            **sealed.params(),
        }

        def attempt(conn: Conn) -> None:
            (written,) = self.transaction(conn, "BEGIN", [(self._sql.rewrite, params)])
            if not written or written[0][0] == 0:
                if self._exists(conn, session_id):
                    self._seals.forget(session_id)  # moved on, or deleted and created again (a new seal id)
                    raise SessionChangedError(session_id)
                raise SessionNotFoundError(session_id)
            self._seals.put(session_id, new_seal)

        def settle(conn: Conn) -> Outcome:
            # A lost compaction may have committed (its revision moved): done if the log now reads as ``rows``.
            if expected is None:
                return Outcome.ABSENT
            loaded = self._rows_now(conn, session_id)
            if loaded is None or loaded[0] != new_seal:
                return Outcome.ABSENT
            if not self.same_rows(store_id, session_id, new_seal, loaded[1], rows):
                return Outcome.ABSENT
            self._seals.put(session_id, new_seal)
            return Outcome.STORED

        self._retry.write("rewrite", attempt, settle)

    # -- lifecycle --------------------------------------------------------------------------------------

    def _revision_number(self, session_id: str, token: str, store_id: str) -> int:
        store, _, number = token.partition(":")
        if store != store_id or not number.isdigit():
            raise SessionChangedError(session_id, f'session "{session_id}": revision {token!r} is not of this store')
        return int(number)

    def _exists(self, conn: Conn, session_id: str) -> bool:
        (rows,) = self.transaction(conn, SNAPSHOT, [(self._sql.revision, {"id": session_id})])
        return bool(rows)

    def _rows_now(self, conn: Conn, session_id: str) -> tuple[str | None, list[StoredRow]] | None:
        """The session's seal id and rows now, ``None`` if it is not stored."""
        params = {"id": session_id, "from": 0}
        head, rows = self.transaction(conn, SNAPSHOT, [(self._sql.head, params), (self._sql.events_from, params)])
        return None if not head else (head[0][4], rows)

    def delete(self, session_id: str, expected_revision: str | None, *, after_unknown: bool = False) -> None:
        """Remove the session row (its events cascade) in one transaction (idempotent and revision-checked, so an
        abandoned write before it needs no read-back: ``after_unknown`` changes nothing, as for :meth:`rewrite`)."""
        store_id = self.start()
        expected = None if expected_revision is None else self._revision_number(session_id, expected_revision, store_id)
        params = {"id": session_id, "expected": expected}
        self._seals.forget(session_id)

        def attempt(conn: Conn) -> None:
            (rows,) = self.transaction(conn, "BEGIN", [(self._sql.delete, params)])
            if not rows:
                if self._exists(conn, session_id):
                    raise SessionChangedError(session_id)
                raise SessionNotFoundError(session_id)

        def settle(conn: Conn) -> Outcome:
            # Gone means deleted (by us: the row existed when the lost attempt was sent).
            return Outcome.ABSENT if self._exists(conn, session_id) else Outcome.STORED

        self._retry.write("delete", attempt, settle)

    def list_page(self, query: ListQuery) -> list[tuple[SessionHeader, int, str]]:
        """One page: (header, updated_at ms, revision) rows in the query's order; damaged headers left out."""
        store_id = self.start()
        after = None if query.after is None else (query.after.key, query.after.session_id)
        statement, params = list_page_query(
            self._tables, query.order, after, query.cwd, query.parent, query.since, query.limit
        )
        (rows,) = self._retry.read("list page", lambda conn: self.transaction(conn, SNAPSHOT, [(statement, params)]))
        page = []
        for sid, text, rev, updated_at in rows:
            try:
                header = decode_header(sid, text)
            except SessionPersistenceCorruptionError as exc:
                _log.warning("list page: leaving out %r: %s", sid, exc)
                continue
            page.append((header, int(updated_at), f"{store_id}:{rev}"))
        return page
