"""The backend primitives as blocking calls on sync psycopg connections (run in worker threads).

Each primitive is one pipeline: ``BEGIN``, its timeouts (``SET LOCAL`` through ``set_config``), its statements
and ``COMMIT`` go out together and cost one round trip. Reads run in one repeatable-read snapshot, so a
concurrent commit is seen wholly or not at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import psycopg
import zstandard

from ._codec import EventCodec
from ._connections import Conn, Connections
from ._core import (
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionEvent,
    SessionHeader,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionStorageError,
    StorageMetadata,
    header_to_builtins,
)
from ._errors import WeakDurabilityError
from ._retry import Outcome, Retrier
from ._schema import Tables, ensure_schema
from ._settings import Settings
from ._statements import Statements

__all__ = ["Loaded", "SyncStore"]

_log = logging.getLogger("dsh.session_persistence_postgres")

Row = tuple[int, bool, bytes]
#: header, inherited cut, events, revision token
Loaded = tuple[SessionHeader, int, list[SessionEvent], str]


def decode_header(session_id: str, text: str) -> SessionHeader:
    """The stored header (any version: the coordinator validates it)."""
    try:
        return msgspec.json.decode(text, type=SessionHeader)
    except msgspec.MsgspecError as exc:
        raise SessionPersistenceCorruptionError(f'stored session "{session_id}" failed validation: {exc}') from exc


def _arrays(rows: Sequence[Row]) -> dict[str, Any]:
    return {
        "seqs": [seq for seq, _c, _b in rows],
        "flags": [compressed for _s, compressed, _b in rows],
        "bodies": [body for _s, _c, body in rows],
    }


def _weakened(fsync: str, synchronous_commit: str) -> dict[str, str]:
    weak = {}
    if fsync != "on":
        weak["fsync"] = fsync
    if synchronous_commit == "off":
        weak["synchronous_commit"] = synchronous_commit
    return weak


class SyncStore:
    """Blocking primitives over one schema; thread-safe (each call takes its own pooled connection)."""

    def __init__(self, connections: Connections, tables: Tables, codec: EventCodec, settings: Settings) -> None:
        self._connections = connections
        self._tables = tables
        self._codec = codec
        self._settings = settings
        self._sql = Statements.for_tables(tables)
        self._retry = Retrier(connections, settings.retry_timeout)
        lock, statement = settings.server_timeouts()
        self._timeouts = {"lock": lock, "statement": statement}
        self._start_lock = threading.Lock()
        self._store_id: str | None = None
        self._closed = False

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
        row = conn.execute(self._sql.settings).fetchone()
        fsync, synchronous_commit = (str(row[0]), str(row[1])) if row is not None else ("?", "?")
        weak = _weakened(fsync, synchronous_commit)
        if weak:
            listed = ", ".join(f"{name}={value}" for name, value in weak.items())
            if not self._settings.allow_weak_durability:
                raise WeakDurabilityError(
                    f"the PostgreSQL server runs with {listed}: it acknowledges commits that a crash can lose, so "
                    "acknowledged session events would not be durable. Fix the server setting (fsync=on, "
                    "synchronous_commit=on or stronger), or pass allow_weak_durability=True to accept the risk",
                    weak,
                )
            _log.warning("PostgreSQL runs with %s: acknowledged events may be lost in a crash", listed)
        return ensure_schema(conn, self._tables)

    def close(self) -> None:
        with self._start_lock:
            self._closed = True
        self._connections.close()

    # -- reads ------------------------------------------------------------------------------------------

    def _pipeline(self, conn: Conn, begin: str, body: Callable[[Conn], Any]) -> Any:
        """``BEGIN``, the timeouts, ``body``'s statements and ``COMMIT``, sent as one round trip."""
        with conn.pipeline():
            conn.execute(begin)
            conn.execute(self._sql.set_timeouts, self._timeouts)
            result = body(conn)
            conn.execute("COMMIT")
        return result

    def read(self, session_id: str, from_seq: int) -> Loaded | None:
        """The session from ``from_seq`` on, in one snapshot; ``None`` if it is not stored."""
        store_id = self.start()
        params = {"id": session_id, "from": from_seq}

        def body(conn: Conn) -> tuple[Any, list[Any]] | None:
            def statements(c: Conn) -> tuple[psycopg.Cursor[Any], psycopg.Cursor[Any]]:
                return c.execute(self._sql.head, params), c.execute(self._sql.events_from, params)

            head_cur, rows_cur = self._pipeline(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", statements)
            head = head_cur.fetchone()
            return None if head is None else (head, rows_cur.fetchall())

        found = self._retry.read("load", body)
        if found is None:
            return None
        (header_text, cut, next_seq, revision), rows = found
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
        try:
            events = [self._codec.decode(compressed, bytes(body)) for _seq, compressed, body in rows]
        except (ValueError, msgspec.MsgspecError, zstandard.ZstdError) as exc:
            raise SessionPersistenceCorruptionError(f'stored session "{session_id}" failed validation: {exc}') from exc
        return meta, int(cut), events, f"{store_id}:{revision}"

    def revision(self, session_id: str) -> str | None:
        store_id = self.start()
        row = self._retry.read(
            "read revision", lambda conn: conn.execute(self._sql.revision, {"id": session_id}).fetchone()
        )
        return None if row is None else f"{store_id}:{row[0]}"

    def snapshots(self) -> list[tuple[SessionHeader, str]]:
        store_id = self.start()
        rows = self._retry.read("list", lambda conn: conn.execute(self._sql.snapshots).fetchall())
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

    def append(self, storage: StorageMetadata, rows: Sequence[Row], first: int, create: bool) -> None:
        """Store ``rows`` (seqs ``first...``): as the session's first batch (``create``) or a later one."""
        self.start()
        session_id = storage.meta.id
        header: str | None = None
        params: dict[str, Any]
        if create:
            header = msgspec.json.encode(header_to_builtins(storage.meta)).decode()
            params = {"id": session_id, "header": header, "cut": storage.inherited_event_count, "n": len(rows)}
        else:
            params = {"id": session_id, "first": first, "n": len(rows)}
        params.update(_arrays(rows))

        def attempt(conn: Conn) -> None:
            cur = self._pipeline(
                conn, "BEGIN", lambda c: c.execute(self._sql.create if create else self._sql.append, params)
            )
            result = cur.fetchone()
            assert result is not None
            if result[0] == 1:
                return
            if create:
                raise SessionAlreadyExistsError(f'session "{session_id}" already has a persisted log')
            if result[2] is None:
                raise SessionNotFoundError(session_id)
            raise SeqMismatchError(
                f'append seq mismatch for "{session_id}": expected {result[2]} at index 0, got {first}'
            )

        def settle(conn: Conn) -> Outcome:
            return self._settle_append(conn, session_id, rows, first, header, create)

        try:
            self._retry.write("append", attempt, settle)
        except SessionStorageError as exc:
            if isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                # Rows past next_seq (an external writer): refuse, never overwrite.
                raise SeqMismatchError(f'append seq mismatch for "{session_id}": seq already stored') from exc
            raise

    def _settle_append(
        self, conn: Conn, session_id: str, rows: Sequence[Row], first: int, header: str | None, create: bool
    ) -> Outcome:
        params = {"id": session_id, "from": first, "to": first + len(rows)}

        def statements(c: Conn) -> tuple[psycopg.Cursor[Any], psycopg.Cursor[Any]]:
            return c.execute(self._sql.head, params), c.execute(self._sql.events_between, params)

        head_cur, rows_cur = self._pipeline(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", statements)
        head = head_cur.fetchone()
        stored = rows_cur.fetchall()
        if head is None:
            if create:
                return Outcome.ABSENT
            raise SessionNotFoundError(session_id)
        header_text, _cut, next_seq, _rev = head
        if self._same_rows(stored, rows) and (not create or header_text == header):
            return Outcome.STORED
        if create:
            raise SessionAlreadyExistsError(f'session "{session_id}" already has a persisted log')
        if not stored and next_seq == first:
            return Outcome.ABSENT
        raise SeqMismatchError(
            f'append seq mismatch for "{session_id}": expected {next_seq} at index 0, got {first} '
            "(another writer stored these seqs)"
        )

    def _same_rows(self, stored: Sequence[tuple[Any, ...]], rows: Sequence[Row]) -> bool:
        if len(stored) != len(rows):
            return False
        for (seq, compressed, body), (want_seq, want_compressed, want_body) in zip(stored, rows, strict=True):
            if seq != want_seq:
                return False
            try:
                if self._codec.raw(compressed, bytes(body)) != self._codec.raw(want_compressed, want_body):
                    return False
            except zstandard.ZstdError:
                return False
        return True

    def rewrite(self, session_id: str, rows: Sequence[Row]) -> None:
        """Replace the log with ``rows`` (seqs from 0), header and cut kept; idempotent, so simply retried."""
        self.start()
        params = {"id": session_id, "n": len(rows), **_arrays(rows)}

        def attempt(conn: Conn) -> None:
            def statements(c: Conn) -> psycopg.Cursor[Any]:
                cur = c.execute(self._sql.rewrite_row, params)
                c.execute(self._sql.rewrite_delete, params)
                if rows:
                    c.execute(self._sql.rewrite_insert, params)
                return cur

            if self._pipeline(conn, "BEGIN", statements).fetchone() is None:
                raise SessionNotFoundError(session_id)

        try:
            self._retry.write("rewrite", attempt, lambda conn: Outcome.ABSENT)
        except SessionStorageError as exc:
            if isinstance(exc.__cause__, psycopg.errors.ForeignKeyViolation):
                raise SessionNotFoundError(session_id) from None
            raise
