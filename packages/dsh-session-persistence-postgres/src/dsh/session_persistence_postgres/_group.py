"""Group commit: the later batches of many sessions, queued by their callers, sent as one transaction.

``append_batch`` of a session whose write chain is free queues a :class:`GroupJob` and waits on its event loop.
One committer thread per backend takes every queued job at each wake and sends them as one statement
(``Statements.append_group``): each session's ``next_seq`` is compare-and-set against its batch's first seq and
its events inserted only where that held, with one outcome row per session, so a refused session fails alone and
the others commit. The callers are woken through their loop's own thread-safe call, once per loop per group: no
thread hop per write, one per group.

The in-doubt rules of the single write hold for the group as a whole (DESIGN §10.3, §11.2): a connection lost
after the group was sent is settled by one read-back of every session of it (exactly its batch stored: done;
none of it: sent again in the next group attempt; anything else: that session's typed conflict), and a group the
server refused as a whole (a row past ``next_seq`` planted by another writer, a lock or statement timeout) wrote
nothing, so each of its batches is then sent on its own and only the faulty one fails. A caller's deadline
releases the caller, never the write: a queued job is always sent, and its session's next write reads back first.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from ._abandon import WriteChains
from ._arrays import bigint_array, bool_array, bytea_array, text_array
from ._connections import Conn, Lost, NotSent
from ._core import (
    SeqMismatchError,
    SessionNotFoundError,
    SessionPersistenceError,
    SessionStorageError,
    StorageMetadata,
)
from ._retry import FIRST_DELAY, MAX_DELAY, in_doubt_error, unreachable_error
from ._sealing import Row, SealedRows, StoredRow
from ._store import SNAPSHOT, SyncStore, cas_refused
from ._wake import DoneWaiter, Waiter

if TYPE_CHECKING:
    from ._abandon import _Link

__all__ = ["GroupCommitter", "GroupJob"]

#: The most batches one group transaction carries (its arrays stay a few MB at the fleet's batch sizes).
MAX_GROUP = 1024


class GroupJob:
    """One session's later batch waiting for the committer; ``error`` is its outcome (``None``: stored)."""

    __slots__ = ("error", "first", "link", "rows", "seal_id", "sealed", "storage", "waiter")

    def __init__(
        self, storage: StorageMetadata, first: int, rows: Sequence[Row], link: _Link, waiter: Waiter | DoneWaiter
    ) -> None:
        self.storage = storage
        self.first = first
        self.rows = rows
        self.link = link
        self.waiter = waiter
        self.error: BaseException | None = None
        self.seal_id: str | None = None
        self.sealed: SealedRows | None = None

    @property
    def session_id(self) -> str:
        return self.storage.meta.id


class _Group:
    """One committer wake's jobs through the retry rules; every job leaves with its outcome set."""

    def __init__(self, store: SyncStore, store_id: str, jobs: list[GroupJob]) -> None:
        self._store = store
        self._store_id = store_id
        self._jobs = jobs
        self._in_doubt: Lost | None = None

    def run(self) -> None:
        retry = self._store.retrier
        deadline = time.monotonic() + self._store.retry_timeout
        delay = FIRST_DELAY
        pending = self._jobs
        while pending:
            try:
                rows = retry.once("append", functools.partial(self._attempt, jobs=pending), False, deadline)
            except NotSent as exc:
                if not exc.retryable or time.monotonic() + delay > deadline:
                    self._fail(pending, self._unsent_error, exc.cause)
                    return
                time.sleep(delay)
                delay = min(delay * 2, MAX_DELAY)
                continue
            except Lost as exc:
                self._in_doubt = exc
                pending = self._settle(pending, deadline)
                if pending and time.monotonic() > deadline:
                    self._fail(pending, in_doubt_error, "append", exc, exc.cause)
                    return
                continue
            except SessionStorageError as exc:
                # Refused as a whole by the server (rolled back): nothing of it was written.
                self._one_by_one(pending, exc)
                return
            self._outcomes(pending, rows, deadline)
            return

    def _unsent_error(self, cause: BaseException) -> SessionStorageError:
        if self._in_doubt is not None:
            return in_doubt_error("append", self._in_doubt, cause)
        return unreachable_error("append", cause)

    @staticmethod
    def _fail(jobs: Sequence[GroupJob], error: Callable[..., BaseException], *args: Any) -> None:
        for job in jobs:
            job.error = error(*args)  # one exception object per caller: each raises and chains its own
            if args and isinstance(args[-1], BaseException):
                job.error.__cause__ = args[-1]  # as the single write's ``raise ... from`` the connection's error

    def _attempt(self, conn: Conn, jobs: Sequence[GroupJob]) -> list[tuple[Any, ...]]:
        """One attempt: the group's outcome rows (id, stored, next_seq, same seal), one per job."""
        sql = self._store.statements
        if len(jobs) == 1:
            # A group of one (most groups at a low rate) sends the single append: the same compare-and-sets and
            # insert, and half the server's planning of the group statement.
            (job,) = jobs
            sealed = job.sealed
            assert sealed is not None
            params = {"id": job.session_id, "first": job.first, "n": len(sealed.seqs), "seal": job.seal_id}
            ((result,),) = self._store.transaction(conn, "BEGIN", [(sql.append, {**params, **sealed.params()})])
            return [(job.session_id, result[0] == 1, result[2], result[3])]
        (rows,) = self._store.transaction(conn, "BEGIN", [(sql.append_group, _group_params(jobs))])
        return rows

    def _outcomes(self, jobs: Sequence[GroupJob], rows: Sequence[tuple[Any, ...]], deadline: float) -> None:
        by_id = {row[0]: row for row in rows}
        refused: list[GroupJob] = []
        for job in jobs:
            _id, stored, next_seq, same_seal = by_id[job.session_id]
            if stored:
                self._store.seals.put(job.session_id, job.seal_id)
                continue
            if next_seq is None:
                job.error = SessionNotFoundError(job.session_id)
            elif not same_seal:
                self._store.seals.forget(job.session_id)
                job.error = SeqMismatchError(
                    f'append refused for "{job.session_id}": the session was deleted and created again since this '
                    "backend last read it (its seal id changed)"
                )
            else:
                job.error = SeqMismatchError(cas_refused(job.session_id, int(next_seq), job.first))
            refused.append(job)
        if refused and self._in_doubt is not None:
            # After an in-doubt attempt the conflicting writer may be this group's own first copy, committed late.
            errors = {id(job): job.error for job in refused}
            for job in refused:
                job.error = None
            for job in self._settle(refused, deadline):
                job.error = errors[id(job)]

    def _settle(self, jobs: Sequence[GroupJob], deadline: float) -> list[GroupJob]:
        """Read every job's session back: stored ones are done, conflicts fail; the absent ones are returned."""
        lost = self._in_doubt
        assert lost is not None
        delay = FIRST_DELAY
        while True:
            try:
                found = self._store.retrier.once(
                    "append (read-back)", lambda conn: self._read_back(conn, jobs), False, deadline
                )
                break
            except (NotSent, Lost) as exc:
                last = exc.cause
                if (isinstance(exc, NotSent) and not exc.retryable) or time.monotonic() + delay > deadline:
                    self._fail(jobs, in_doubt_error, "append", lost, last)
                    return []
            time.sleep(delay)
            delay = min(delay * 2, MAX_DELAY)
        absent = []
        for job in jobs:
            outcome = found[job.session_id]
            if outcome is None:
                absent.append(job)
            elif isinstance(outcome, BaseException):
                job.error = outcome
        return absent

    def _read_back(self, conn: Conn, jobs: Sequence[GroupJob]) -> dict[str, BaseException | bool | None]:
        """Per session: ``True`` stored, ``None`` absent (may be sent again), or its conflict error."""
        sql = self._store.statements
        ids = [job.session_id for job in jobs]
        ranges = {"ids": ids, "froms": [job.first for job in jobs], "tos": [job.first + len(job.rows) for job in jobs]}
        heads, events = self._store.transaction(conn, SNAPSHOT, [(sql.heads_of, {"ids": ids}), (sql.events_of, ranges)])
        head_of = {row[0]: row for row in heads}
        stored_of: dict[str, list[StoredRow]] = {}
        for row in events:
            stored_of.setdefault(row[0], []).append(tuple(row[1:]))
        found: dict[str, BaseException | bool | None] = {}
        for job in jobs:
            sid = job.session_id
            head = head_of.get(sid)
            if head is None:
                found[sid] = SessionNotFoundError(sid)
                continue
            next_seq, stored_seal = head[3], head[5]
            stored = stored_of.get(sid, [])
            if stored_seal == job.seal_id and self._store.same_rows(self._store_id, sid, stored_seal, stored, job.rows):
                self._store.seals.put(sid, stored_seal)
                found[sid] = True
            elif not stored and next_seq == job.first:
                found[sid] = None
            else:
                found[sid] = SeqMismatchError(
                    f'append seq mismatch for "{sid}": expected {next_seq} at index 0, got {job.first} '
                    "(another writer stored these seqs)"
                )
        return found

    def _one_by_one(self, jobs: Sequence[GroupJob], refusal: SessionStorageError) -> None:
        """The server refused the group as a whole: each batch on its own, so only the faulty one fails."""
        if len(jobs) == 1:
            jobs[0].error = _typed_refusal(jobs[0].session_id, refusal)
            return
        for job in jobs:
            try:
                self._store.append(job.storage, job.rows, job.first, False, after_unknown=self._in_doubt is not None)
            except SessionPersistenceError as exc:
                job.error = exc


def _group_params(jobs: Sequence[GroupJob]) -> dict[str, str]:
    """The group statement's parameters: one entry per batch, one per row, each array as its literal's text."""
    ids: list[str] = []
    firsts: list[int] = []
    ns: list[int] = []
    seals: list[str | None] = []
    sids: list[str] = []
    seqs: list[int] = []
    flags: list[bool] = []
    bodies: list[bytes] = []
    key_ids: list[str | None] = []
    nonces: list[bytes | None] = []
    for job in jobs:
        sealed = job.sealed
        assert sealed is not None
        ids.append(job.session_id)
        firsts.append(job.first)
        ns.append(len(sealed.seqs))
        seals.append(job.seal_id)
        sids += [job.session_id] * len(sealed.seqs)
        seqs += sealed.seqs
        flags += sealed.flags
        bodies += sealed.bodies
        key_ids += sealed.key_ids
        nonces += sealed.nonces
    return {
        "ids": text_array(ids),
        "firsts": bigint_array(firsts),
        "ns": bigint_array(ns),
        "seals": text_array(seals),
        "sids": text_array(sids),
        "seqs": bigint_array(seqs),
        "flags": bool_array(flags),
        "bodies": bytea_array(bodies),
        "key_ids": text_array(key_ids),
        "nonces": bytea_array(nonces),
    }


def _typed_refusal(session_id: str, refusal: SessionStorageError) -> SessionPersistenceError:
    if isinstance(refusal.__cause__, psycopg.errors.UniqueViolation):
        # Rows past next_seq (an external writer): refuse, never overwrite.
        error = SeqMismatchError(f'append seq mismatch for "{session_id}": seq already stored')
        error.__cause__ = refusal
        return error
    return refusal


def _copy(exc: Exception) -> BaseException:
    """A copy of one failure for each caller (each raises and chains its own); the original if it cannot be."""
    try:
        return copy.copy(exc)
    except Exception:
        return exc


class GroupCommitter:
    """One thread per backend that sends every queued job as one group transaction and wakes the callers."""

    def __init__(self, store: SyncStore, chains: WriteChains) -> None:
        self._store = store
        self._chains = chains
        self._queue: queue.SimpleQueue[GroupJob | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, job: GroupJob) -> None:
        """Queue ``job``; it is sent in the next group (its waiter is woken with ``job.error`` set or not)."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="dsh-postgres-committer", daemon=True)
                    self._thread.start()
        self._queue.put(job)

    def close(self, timeout: float) -> None:
        """Stop after the jobs already queued (they fail typed on the closed store); wait up to ``timeout``."""
        self._queue.put(None)
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                return
            jobs = [first]
            while len(jobs) < MAX_GROUP:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                    break
                jobs.append(job)
            self._commit(jobs)

    def _commit(self, jobs: list[GroupJob]) -> None:
        unknown = False
        try:
            self._send(jobs)
        except BaseException as exc:
            # Raised past the retry rules (a connection refused by the durability check, a bug): every caller
            # gets it, as the single write would raise it, and since what was sent is not known, the session's
            # next write reads back first.
            unknown = True
            for job in jobs:
                if job.error is None:
                    job.error = (
                        _copy(exc)
                        if isinstance(exc, Exception)
                        else SessionStorageError(f"PostgreSQL append failed: {type(exc).__name__}: {exc}")
                    )
        finally:
            by_loop: dict[int, list[GroupJob]] = {}
            for job in jobs:
                self._chains.end(job.session_id, job.link, unknown=unknown)
                by_loop.setdefault(id(job.waiter.key), []).append(job)
            for woken in by_loop.values():
                with contextlib.suppress(RuntimeError):  # a loop that has closed has no caller left to wake
                    woken[0].waiter.post(_waker(woken))

    def _send(self, jobs: list[GroupJob]) -> None:
        try:
            store_id = self._store.start()
        except SessionPersistenceError as exc:
            for job in jobs:
                job.error = _copy(exc)
            return
        ready = []
        for job in jobs:
            try:
                job.seal_id = self._store.seal_of(job.session_id)
                job.sealed = self._store.sealer.seal_rows(store_id, job.session_id, job.seal_id, job.rows)
            except SessionPersistenceError as exc:
                job.error = exc
                continue
            ready.append(job)
        if ready:
            _Group(self._store, store_id, ready).run()


def _waker(jobs: list[GroupJob]) -> Callable[[], None]:
    """The one callback, run on the callers' loop, that wakes every job of ``jobs``."""

    def wake() -> None:
        for job in jobs:
            job.waiter.wake()

    return wake
