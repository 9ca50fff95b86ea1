"""A SQLite session backend written the way a third party would: stdlib ``sqlite3``, public imports only.

It exists to prove the conformance kit from outside: the correct :class:`SqliteBackend` passes the whole kit
(and the opt-in crash-state harness), and each deliberately buggy variant at the end of this module is a
mistake a backend author easily makes that the kit must catch.

What SQLite needs to meet the contract:

* **Connections are thread-bound** and every primitive runs in whichever anyio worker thread is free, so each
  primitive opens its own connection inside its worker thread and closes it there.
* **Two instances over one file** (the kit's "process restart", and real second processes) serialize through
  SQLite's own file locks: every write is one ``BEGIN IMMEDIATE`` transaction (the write lock is taken up
  front, so two writers never both read the same ``next seq``), with a busy timeout instead of failing fast.
* **Durable means durable.** In rollback-journal (``DELETE``) mode the commit point is the unlink of the
  journal; ``synchronous=FULL`` fsyncs the database and the journal but not the directory after that unlink,
  so a power cut right after a commit may bring the hot journal back and roll the acknowledged transaction
  back. ``synchronous=EXTRA`` also fsyncs the directory. (The crash-state harness found this.)
* **Seq contiguity is checked by the backend**, inside the write transaction (``check_contiguous``), so a
  stale second writer gets ``SeqMismatchError``, never a raw ``IntegrityError``.
* **Header and first batch commit in one transaction**; an existing session is never overwritten.
* **Mutating primitives are shielded** so a cancelled caller waits for the transaction to end.
"""

from __future__ import annotations

import builtins
import json
import os
import sqlite3
import uuid
from collections.abc import Callable, Sequence
from typing import ClassVar, TypeVar

import anyio
import anyio.to_thread
from dsh.session_persistence.backend import (
    RawArtifact,
    SessionAlreadyExistsError,
    SessionChangedError,
    SessionEvent,
    SessionHeader,
    SessionLocation,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionSnapshot,
    SessionStorageError,
    StorageMetadata,
    StoredPrefix,
    check_contiguous,
    decode_event_line,
    encode_event,
    header_from_stored,
    header_to_builtins,
)

__all__ = [
    "AckBeforeDurableSqliteBackend",
    "DeletingSqliteBackend",
    "NoSeqCheckSqliteBackend",
    "PerSessionRevisionSqliteBackend",
    "RawTextSqliteBackend",
    "RerenderedRawSqliteBackend",
    "SqliteBackend",
    "TwoTransactionSqliteBackend",
    "UnshieldedSqliteBackend",
]

_T = TypeVar("_T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS store (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, header TEXT NOT NULL, inherited INTEGER NOT NULL, revision INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL, seq INTEGER NOT NULL, line BLOB NOT NULL, PRIMARY KEY (session_id, seq)
);
"""


class SqliteBackend:
    """Session logs in one SQLite database file, ``<root>/sessions.sqlite3``."""

    NAME: ClassVar[str] = "sqlite-example"
    SYNCHRONOUS: ClassVar[str] = "EXTRA"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.path = os.path.join(self.root, "sessions.sqlite3")
        self._store_id: str | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root={self.root!r})"

    # ------------------------------------------------------------------------------------------------------
    # plumbing: one connection per call, opened and closed in the worker thread that runs it

    def _connect(self) -> sqlite3.Connection:
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        db.execute("PRAGMA journal_mode=DELETE")
        db.execute(f"PRAGMA synchronous={self.SYNCHRONOUS}")
        return db

    def _call(self, work: Callable[[sqlite3.Connection], _T], action: str) -> _T:
        try:
            db = self._connect()
        except sqlite3.Error as exc:
            raise _storage_error(action, exc, self.path) from exc
        try:
            return work(db)
        except sqlite3.Error as exc:
            raise _storage_error(action, exc, self.path) from exc
        finally:
            db.close()

    def _write(self, work: Callable[[sqlite3.Connection], None], action: str) -> None:
        def transaction(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in SCHEMA.strip().split(";\n"):
                    if statement.strip():
                        db.execute(statement)
                work(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

        self._call(transaction, action)

    async def _run(self, func: Callable[[], _T]) -> _T:
        return await anyio.to_thread.run_sync(func)

    async def _run_shielded(self, func: Callable[[], _T]) -> _T:
        with anyio.CancelScope(shield=True):
            return await anyio.to_thread.run_sync(func)

    def _revision(self, db: sqlite3.Connection, number: int) -> str:
        if self._store_id is None:
            row = db.execute("SELECT value FROM store WHERE key = 'id'").fetchone()
            self._store_id = row[0] if row else "empty"
        return f"{self._store_id}:{number}"

    @staticmethod
    def _bump(db: sqlite3.Connection) -> int:
        if db.execute("SELECT value FROM store WHERE key = 'id'").fetchone() is None:
            db.execute("INSERT INTO store VALUES ('id', ?)", (uuid.uuid4().hex,))
        row = db.execute("SELECT value FROM store WHERE key = 'revision'").fetchone()
        number = int(row[0]) + 1 if row else 1
        db.execute("INSERT OR REPLACE INTO store VALUES ('revision', ?)", (str(number),))
        return number

    def _tables_exist(self, db: sqlite3.Connection) -> bool:
        return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'sessions'").fetchone() is not None

    # ------------------------------------------------------------------------------------------------------
    # reads

    def locate(self, meta: SessionHeader) -> SessionLocation:
        return SessionLocation(kind="sqlite", path=self.path)

    async def load_stored(self, session_id: str) -> StoredPrefix | None:
        def work(db: sqlite3.Connection) -> StoredPrefix | None:
            if not self._tables_exist(db):
                return None
            db.execute("BEGIN")
            try:
                row = db.execute(
                    "SELECT header, inherited, revision FROM sessions WHERE id = ?", (session_id,)
                ).fetchone()
                if row is None:
                    return None
                lines = db.execute(
                    "SELECT seq, line FROM events WHERE session_id = ? ORDER BY seq", (session_id,)
                ).fetchall()
                revision = self._revision(db, row[2])
            finally:
                db.execute("COMMIT")
            header = _decode_header(row[0], session_id, self.path)
            events = []
            for seq, line in lines:
                try:
                    event = decode_event_line(bytes(line))
                except Exception as exc:
                    raise SessionPersistenceCorruptionError(
                        f'corrupt event {seq} of "{session_id}" in {self.path}: {exc}'
                    ) from exc
                if event.seq != seq or seq != len(events):
                    raise SessionPersistenceCorruptionError(f'seq gap at {seq} in "{session_id}" ({self.path})')
                events.append(event)
            return StoredPrefix(header, int(row[1]), events, revision, None)

        return await self._run(lambda: self._call(work, f'load session "{session_id}"'))

    async def read_stored_revision(self, session_id: str) -> str | None:
        def work(db: sqlite3.Connection) -> str | None:
            if not self._tables_exist(db):
                return None
            row = db.execute("SELECT revision FROM sessions WHERE id = ?", (session_id,)).fetchone()
            return None if row is None else self._revision(db, row[0])

        return await self._run(lambda: self._call(work, f'read the revision of "{session_id}"'))

    async def list(self) -> builtins.list[SessionHeader]:
        return [snapshot.header for snapshot in await self.list_snapshots()]

    async def list_snapshots(self) -> builtins.list[SessionSnapshot]:
        def work(db: sqlite3.Connection) -> builtins.list[SessionSnapshot]:
            if not self._tables_exist(db):
                return []
            rows = db.execute("SELECT id, header, revision FROM sessions ORDER BY id").fetchall()
            return [SessionSnapshot(_decode_header(h, i, self.path), self._revision(db, r)) for i, h, r in rows]

        return await self._run(lambda: self._call(work, "list sessions"))

    # ------------------------------------------------------------------------------------------------------
    # writes

    def _insert_session(self, db: sqlite3.Connection, storage: StorageMetadata) -> None:
        session_id = storage.meta.id
        if db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is not None:
            raise SessionAlreadyExistsError(f'session "{session_id}" already exists in {self.path}')
        header = json.dumps(header_to_builtins(storage.meta), separators=(",", ":"))
        db.execute(
            "INSERT INTO sessions VALUES (?, ?, ?, ?)",
            (session_id, header, storage.inherited_event_count, self._next_revision(db, session_id)),
        )

    def _next_revision(self, db: sqlite3.Connection, session_id: str) -> int:
        """The number of the session's next revision: one store-wide counter, so no number ever comes back."""
        return self._bump(db)

    def _next_seq(self, db: sqlite3.Connection, session_id: str) -> int:
        row = db.execute("SELECT COUNT(*) FROM events WHERE session_id = ?", (session_id,)).fetchone()
        return int(row[0])

    def _check_seqs(self, db: sqlite3.Connection, session_id: str, events: Sequence[SessionEvent]) -> None:
        check_contiguous(session_id, self._next_seq(db, session_id), events)

    def _insert_events(self, db: sqlite3.Connection, session_id: str, events: Sequence[SessionEvent]) -> None:
        if db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
            raise SessionNotFoundError(session_id)
        self._check_seqs(db, session_id, events)
        db.executemany("INSERT INTO events VALUES (?, ?, ?)", [(session_id, e.seq, encode_event(e)) for e in events])
        db.execute("UPDATE sessions SET revision = ? WHERE id = ?", (self._next_revision(db, session_id), session_id))

    def _append_sync(self, storage: StorageMetadata, events: Sequence[SessionEvent], materialized: bool) -> None:
        session_id = storage.meta.id

        def work(db: sqlite3.Connection) -> None:
            if not materialized:
                self._insert_session(db, storage)
            self._insert_events(db, session_id, events)

        self._write(work, f'append to session "{session_id}"')

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        """Durably append one batch; the first batch commits with the header in one transaction."""
        if not events:
            return
        batch = list(events)
        await self._run_shielded(lambda: self._append_sync(storage, batch, is_materialized))

    async def materialize_header(self, storage: StorageMetadata) -> None:
        await self._run_shielded(
            lambda: self._write(lambda db: self._insert_session(db, storage), f'create "{storage.meta.id}"')
        )

    async def commit_repair(
        self, storage: StorageMetadata, torn_marker: object | None, closers: Sequence[SessionEvent]
    ) -> None:
        """Transactions leave no torn tails: only the closers are appended."""
        if torn_marker is not None:
            raise TypeError("this backend never reports a torn tail")
        if closers:
            batch = list(closers)
            await self._run_shielded(lambda: self._append_sync(storage, batch, True))

    async def rewrite(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        """Atomically replace the log with ``events`` (a prefix), in one transaction."""
        session_id = storage.meta.id
        batch = list(events)

        def work(db: sqlite3.Connection) -> None:
            if db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
                raise SessionNotFoundError(session_id)
            db.execute("DELETE FROM events WHERE session_id = ?", (session_id,))
            check_contiguous(session_id, 0, batch)
            db.executemany("INSERT INTO events VALUES (?, ?, ?)", [(session_id, e.seq, encode_event(e)) for e in batch])
            db.execute(
                "UPDATE sessions SET revision = ? WHERE id = ?", (self._next_revision(db, session_id), session_id)
            )

        await self._run_shielded(lambda: self._write(work, f'rewrite session "{session_id}"'))

    async def aclose(self) -> None:
        """Nothing to release: no connection outlives a primitive call."""


def _decode_header(text: str, session_id: str, path: str) -> SessionHeader:
    try:
        return header_from_stored(json.loads(text), expected_id=session_id)
    except ValueError as exc:
        raise SessionPersistenceCorruptionError(f'corrupt header of "{session_id}" in {path}: {exc}') from exc


def _storage_error(action: str, exc: sqlite3.Error, path: str) -> SessionStorageError:
    error = SessionStorageError(f"{action} failed: {exc}", path=path)
    return error


# ----------------------------------------------------------------------------------------------------------
# Deliberately buggy variants: each passed the kit before the kit case aimed at it was added.


class NoSeqCheckSqliteBackend(SqliteBackend):
    """Bug: trusts the coordinator's cursor. A stale second writer's batch hits the primary key instead."""

    def _check_seqs(self, db: sqlite3.Connection, session_id: str, events: Sequence[SessionEvent]) -> None:
        return None

    def _call(self, work: Callable[[sqlite3.Connection], _T], action: str) -> _T:
        # What a naive author writes: only "operational" errors are storage failures; the rest propagate raw.
        try:
            return super()._call(work, action)
        except SessionStorageError as exc:
            cause = exc.__cause__
            if isinstance(cause, sqlite3.IntegrityError):
                raise cause from None
            raise


class TwoTransactionSqliteBackend(SqliteBackend):
    """Bug: the header and the first batch commit in two transactions; a failure between them leaves a
    listed session without its first batch."""

    def _append_sync(self, storage: StorageMetadata, events: Sequence[SessionEvent], materialized: bool) -> None:
        session_id = storage.meta.id
        if not materialized:
            self._write(lambda db: self._insert_session(db, storage), f'create "{session_id}"')
        self._write(lambda db: self._insert_events(db, session_id, events), f'append to "{session_id}"')


class AckBeforeDurableSqliteBackend(SqliteBackend):
    """Bug: ``synchronous=OFF``: a commit returns before anything is fsynced."""

    SYNCHRONOUS: ClassVar[str] = "OFF"


class UnshieldedSqliteBackend(SqliteBackend):
    """Bug: mutating primitives are not shielded: a cancelled caller returns while the transaction still runs."""

    async def _run_shielded(self, func: Callable[[], _T]) -> _T:
        return await anyio.to_thread.run_sync(func, abandon_on_cancel=True)


# ----------------------------------------------------------------------------------------------------------
# Optional primitives the base backend leaves out, correct here (each is the control for the buggy variant
# below it): raw artifacts and deletion.


class RawTextSqliteBackend(SqliteBackend):
    """Raw artifacts: a session's stored header and event lines, joined as stored (never re-encoded)."""

    supports_raw_artifacts: ClassVar[bool] = True

    def _raw_lines(self, lines: builtins.list[bytes]) -> builtins.list[str]:
        return [line.decode() for line in lines]

    async def read_raw(self, session_id: str) -> RawArtifact | None:
        def work(db: sqlite3.Connection) -> RawArtifact | None:
            if not self._tables_exist(db):
                return None
            db.execute("BEGIN")
            try:
                row = db.execute("SELECT header, inherited FROM sessions WHERE id = ?", (session_id,)).fetchone()
                lines = [
                    bytes(r[0])
                    for r in db.execute("SELECT line FROM events WHERE session_id = ? ORDER BY seq", (session_id,))
                ]
            finally:
                db.execute("COMMIT")
            if row is None:
                return None
            header = _decode_header(row[0], session_id, self.path)
            content = "".join(f"{text}\n" for text in [row[0], *self._raw_lines(lines)])
            return RawArtifact(header, int(row[1]), f"{self.path}#{session_id}", content)

        return await self._run(lambda: self._call(work, f'read the raw log of "{session_id}"'))


class RerenderedRawSqliteBackend(RawTextSqliteBackend):
    """Bug: ``read_raw`` renders the stored JSON again (``json.dumps``) instead of returning the stored bytes: the
    text looks right, but its separators and escapes are not what is stored."""

    def _raw_lines(self, lines: builtins.list[bytes]) -> builtins.list[str]:
        return [json.dumps(json.loads(line)) for line in lines]


class DeletingSqliteBackend(SqliteBackend):
    """Deletion: the session row and its events in one transaction, compare-and-swap on the revision."""

    async def delete(self, session_id: str, expected_revision: str | None = None) -> None:
        def work(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT revision FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                raise SessionNotFoundError(session_id)
            if expected_revision is not None and self._revision(db, row[0]) != expected_revision:
                raise SessionChangedError(session_id)
            db.execute("DELETE FROM events WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))

        await self._run_shielded(lambda: self._write(work, f'delete session "{session_id}"'))


class PerSessionRevisionSqliteBackend(DeletingSqliteBackend):
    """Bug: the revision counts the session's own writes (1, 2, ...). It changes on every write, but a session
    deleted and re-created with the same writes gets its old revisions back."""

    def _next_revision(self, db: sqlite3.Connection, session_id: str) -> int:
        row = db.execute("SELECT revision FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return 1 if row is None else int(row[0]) + 1
