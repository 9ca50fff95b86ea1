"""The coordinator's durable writes: each mutating primitive runs shielded, under the session's writer lease,
after any earlier in-doubt write is settled; a failure that may have reached storage is read back instead of
being retried blindly.

A mutating primitive (``append_batch``, ``materialize_header``, ``commit_repair``, ``rewrite``) that fails with
anything but an explicit refusal may still have reached storage: the rollback after a failed fsync failed too,
the directory fsync after publishing the file failed, the connection was lost after ``COMMIT``. Such a write is
*in doubt*. Before anything else is written for the session, the coordinator reads the stored log back:

* it holds exactly the write (byte-identical events at the expected seqs, the same header and cut): the write
  is acknowledged, as if the primitive had returned;
* it holds none of it: nothing happened, and the write may be retried;
* it holds a part of an append (a torn tail is cut first, as repair would): the stored part is acknowledged
  and the rest may be retried;
* anything else (fewer events than were acknowledged, events this writer did not write, another header) is a
  :class:`SessionPersistenceCorruptionError`, and the session stays in doubt so nothing is written on top;
* the read itself fails: :class:`SessionWriteInDoubtError`, and the session stays in doubt: the next write
  reads back first.

Never a blind re-append, and never a session wedged on its own committed write.
"""

from __future__ import annotations

import enum
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio

from .._backends.protocol import StorageMetadata
from .._model.errors import (
    IncompleteInheritedPrefixError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionStorageError,
    SessionWriteInDoubtError,
    UnsupportedOperationError,
)
from .._model.events import SessionEvent
from .._wire.contiguity import check_contiguous
from .._wire.stored_log import same_events, same_header, validate_stored
from .state import CoordinatorCore, PendingWrite, SessionState, is_refusal, succeeded

if sys.version_info < (3, 11):  # pragma: no cover - exercised on 3.10 only
    from exceptiongroup import BaseExceptionGroup

__all__ = ["DurableWrites", "Verdict", "storage_error"]

_logger = logging.getLogger("dsh.session_persistence")


# ------------------------------------------------------------------------------------------------------------
# settling a write whose outcome is unknown (the module doc): read the stored log back


#: Read-backs per settlement: a torn tail found by one is cut, and the next one decides.
MAX_SETTLE_ROUNDS = 3


class Verdict(enum.Enum):
    """What a read-back found of an in-doubt write."""

    ACKNOWLEDGED = "acknowledged"
    ABSENT = "absent"
    PARTIAL = "partial"


def _first_os_error(exc: BaseException) -> OSError | None:
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_os_error(inner)
            if found is not None:
                return found
    cause = exc.__cause__
    return _first_os_error(cause) if cause is not None and cause is not exc else None


def storage_error(name: str, action: str, session_id: str, exc: BaseException, note: str = "") -> SessionStorageError:
    """``exc`` as a :class:`SessionStorageError` (errno and path of the first ``OSError`` in it kept, ``exc``
    chained); a storage error is returned unchanged when there is nothing to add."""
    if isinstance(exc, SessionStorageError) and not note:
        return exc
    os_error = _first_os_error(exc)
    path = None if os_error is None or os_error.filename is None else str(os_error.filename)
    error = SessionStorageError(
        f'{name}: {action} for session "{session_id}" failed: {exc}{note}',
        errno=None if os_error is None else os_error.errno,
        path=path,
    )
    error.__cause__ = exc
    return error


def _fail(session_id: str, pending: PendingWrite, what: str) -> SessionPersistenceCorruptionError:
    return SessionPersistenceCorruptionError(
        f'session "{session_id}": a failed {pending.action} left storage in a state this writer did not produce '
        f"({what}); nothing more is written to it"
    )


def _compare(session_id: str, pending: PendingWrite, events: Sequence[SessionEvent]) -> Verdict:
    if pending.replaced:
        # A rewrite replaced ``start`` events by a prefix of them (a truncation): the old log or the new one.
        new = pending.events
        if len(events) == len(new) and same_events(events, new):
            return Verdict.ACKNOWLEDGED
        if len(events) == pending.start and same_events(events[: len(new)], new):
            return Verdict.ABSENT
        raise _fail(session_id, pending, f"{len(events)} stored event(s), neither the old log nor the new one")
    if len(events) < pending.start:
        raise _fail(session_id, pending, f"{len(events)} stored event(s), fewer than the {pending.start} acknowledged")
    tail = events[pending.start :]
    if len(tail) > len(pending.events) or not same_events(tail, pending.events[: len(tail)]):
        raise _fail(session_id, pending, f"events this writer did not write from seq {pending.start}")
    if len(tail) == len(pending.events):
        return Verdict.ACKNOWLEDGED
    return Verdict.ABSENT if not tail else Verdict.PARTIAL


def _apply(state: SessionState, pending: PendingWrite, verdict: Verdict, stored_length: int) -> None:
    state.doubt = None
    if verdict is Verdict.ACKNOWLEDGED:
        state.settled = pending.events
    state.cursor = stored_length
    # Whatever the verdict, an artifact with our header exists now (an absent first write returned above).
    state.materialized = True


class DurableWrites:
    """The durable writes of one coordinator (``core.writes``): every mutating primitive goes through here.

    The cold and live paths reach it through the core object (typed there by the ``Writes`` protocol), so they sit
    beside this module, not on it; the service calls it the same way.
    """

    __slots__ = ("core",)

    def __init__(self, core: CoordinatorCore) -> None:
        self.core = core

    async def settle_doubt(self, session_id: str, state: SessionState) -> None:
        """Settle an earlier in-doubt write of ``state`` before anything else is written (no-op without one).

        A write still running (its caller left at its deadline) is waited for first.
        """
        running = state.running
        if running is not None:
            await running.wait()
        pending = state.doubt
        if pending is None:
            return
        with anyio.CancelScope(shield=True):
            verdict = await self._settle(session_id, state, pending)
        _logger.warning(
            '%s: session "%s": an earlier failed %s was read back: %s',
            self.core.name,
            session_id,
            pending.action,
            verdict.value,
        )

    async def _lease(self, session_id: str, state: SessionState) -> None:
        """Hold the session's writer lease before writing.

        Taking it here is only ever a first write (an unmaterialized session): every path that adopts an existing
        log takes the lease first and reads the log again under it (cold commit, live initialization), so a cursor
        is never trusted from a read made without the lease.
        """
        await self.core.leases.acquire(state.storage.meta)

    async def _run(
        self,
        session_id: str,
        state: SessionState,
        pending: PendingWrite,
        primitive: Callable[..., Awaitable[None]],
        *args: Any,
        own_task: bool = False,
    ) -> None:
        """Run one durable write, ``primitive(*args)``, in the coordinator's task group and wait for it; a cancelled
        caller leaves at once.

        The write itself is never cancelled (it runs shielded, to its end, bounded by the backend's own timeouts):
        only the caller's wait is. The session's next write waits for it (:meth:`settle_doubt`), and a batch it
        stored after its caller left is acknowledged when that caller retries it unchanged.

        ``own_task``: the caller is a task of the coordinator's own (the write-behind controller's write): nobody
        waits on it who could leave, so the write runs right there, without a task of its own.
        """
        spawn = self.core.spawn
        if spawn is None or own_task:  # a coordinator driven directly, or its own task: the caller waits
            await self._run_to_end(session_id, state, pending, primitive, args)
            return
        done = anyio.Event()
        caller = {"left": False, "completed": False}
        failure: list[Exception] = []

        async def job() -> None:
            try:
                await self._run_to_end(session_id, state, pending, primitive, args)
                caller["completed"] = True
                if caller["left"] and not pending.replaced:
                    state.settled = pending.events  # the caller never heard: its unchanged retry is acknowledged
            except Exception as exc:  # the caller's error; if it left, the state says what the next write must do
                failure.append(exc)
                if caller["left"]:
                    _logger.warning(
                        '%s: %s for session "%s", abandoned by its caller, failed: %s',
                        self.core.name,
                        pending.action,
                        session_id,
                        exc,
                    )
            finally:
                done.set()
                self.core.running_writes.discard(done)
                if state.running is done:
                    state.running = None

        state.running = done
        self.core.running_writes.add(done)
        spawn(job)
        try:
            await done.wait()
        except anyio.get_cancelled_exc_class():
            caller["left"] = True
            raise
        if failure:
            raise failure[0]
        if not caller["completed"]:
            state.doubt = pending  # the write task itself was cancelled (the coordinator is closing): read back first
            raise SessionWriteInDoubtError(
                f'session "{session_id}": the {pending.action} was interrupted; read it back'
            )

    async def _run_to_end(
        self,
        session_id: str,
        state: SessionState,
        pending: PendingWrite,
        primitive: Callable[..., Awaitable[None]],
        args: tuple[Any, ...],
    ) -> None:
        """Run one mutating primitive shielded; on success record its effect, on failure settle it by reading back."""
        with anyio.CancelScope(shield=True):
            try:
                await primitive(*args)
            except Exception as exc:
                await self.settle_failed(session_id, state, pending, exc)
                return
            succeeded(state, pending)

    async def settle_failed(self, session_id: str, state: SessionState, pending: PendingWrite, exc: Exception) -> None:
        """After ``pending``'s primitive raised ``exc``: a refusal is raised as it is; anything else may have reached
        storage and is read back: acknowledged (return), or raised as a storage error naming what was kept.
        Call it shielded."""
        if is_refusal(exc):
            raise exc
        verdict = await self._settle(session_id, state, pending)
        if verdict is Verdict.ACKNOWLEDGED:
            _logger.warning(
                '%s: %s for session "%s" failed after reaching storage; read back and acknowledged: %s',
                self.core.name,
                pending.action,
                session_id,
                exc,
            )
            return
        note = ""
        if verdict is Verdict.PARTIAL:
            note = f" (events before seq {state.cursor} were stored and are acknowledged; the rest was not)"
        raise storage_error(self.core.name, pending.action, session_id, exc, note) from exc

    async def append(self, session_id: str, state: SessionState, batch: Sequence[SessionEvent]) -> None:
        """Contiguity, the inherited-prefix gate, the lease, then one durable ``append_batch``. Runs serialized.

        A batch that a read-back acknowledged a moment ago (its primitive had failed) is acknowledged again when it
        is retried unchanged, instead of being refused as a seq mismatch.
        """
        await self.settle_doubt(session_id, state)
        await self.append_settled(session_id, state, batch)

    async def append_settled(
        self,
        session_id: str,
        state: SessionState,
        batch: Sequence[SessionEvent],
        *,
        own_task: bool = False,
    ) -> None:
        """:meth:`append` for a caller that has just settled the id's in-doubt write itself (settlement runs once
        per write): contiguity, the inherited-prefix gate, the lease, then one durable ``append_batch``
        (``own_task``: see :meth:`_run`)."""
        cursor = state.cursor
        settled = state.settled
        if settled and batch and batch[0].seq == cursor - len(settled) and same_events(batch, settled):
            return
        check_contiguous(session_id, cursor, batch)
        if not state.materialized and cursor + len(batch) < state.storage.inherited_event_count:
            raise IncompleteInheritedPrefixError(
                f'session "{session_id}" cannot materialize before its inherited prefix is complete'
            )
        await self._lease(session_id, state)
        events = tuple(batch)
        materialized = state.materialized
        pending = PendingWrite("append", cursor, events, not materialized)
        await self._run(
            session_id,
            state,
            pending,
            self.core.backend.append_batch,
            state.storage,
            events,
            materialized,
            own_task=own_task,
        )

    async def materialize(self, session_id: str, state: SessionState) -> None:
        """Durably create the header-only artifact of an empty session. Runs serialized."""
        materialize_header = self.core.caps.materialize_header
        if materialize_header is None:
            raise UnsupportedOperationError("session persistence backend cannot materialize an empty session")
        await self.settle_doubt(session_id, state)
        if state.materialized:
            return
        await self._lease(session_id, state)
        pending = PendingWrite("header materialization", 0, (), True)
        await self._run(session_id, state, pending, materialize_header, state.storage)

    async def rewrite(
        self,
        session_id: str,
        state: SessionState,
        expected: Sequence[SessionEvent],
        events: Sequence[SessionEvent],
    ) -> None:
        """Replace the stored log ``expected`` by its prefix ``events``, compare-and-swap: the stored log is read
        under the lease first and must still be exactly ``expected``, or nothing is written. Runs serialized."""
        rewrite_primitive = self.core.caps.rewrite
        if rewrite_primitive is None:
            raise UnsupportedOperationError(f"{self.core.name} does not support destructive session deletion")
        await self.settle_doubt(session_id, state)
        await self._lease(session_id, state)
        if state.materialized:
            stored = await self.core.backend.load_stored(session_id)
            if stored is None or stored.torn_marker is not None or not same_events(stored.events, expected):
                found = "no stored log" if stored is None else f"{len(stored.events)} stored event(s)"
                raise SessionPersistenceError(
                    f'session "{session_id}" changed in storage since this writer wrote it ({found}, expected '
                    f"{len(expected)}); refusing to rewrite it"
                )
        new = tuple(events)
        pending = PendingWrite("rewrite", len(expected), new, False, replaced=True)
        await self._run(session_id, state, pending, rewrite_primitive, state.storage, new)

    async def repair(
        self,
        session_id: str,
        storage: StorageMetadata,
        marker: object | None,
        closers: Sequence[SessionEvent],
    ) -> None:
        """``commit_repair`` shielded; a failure is read back: a repair that landed counts as done, one that did not
        surfaces as a storage error (the caller re-reads before any retry)."""
        with anyio.CancelScope(shield=True):
            try:
                await self.core.backend.commit_repair(storage, marker, closers)
            except Exception as exc:
                if is_refusal(exc):
                    raise
                try:
                    stored = await self.core.backend.load_stored(session_id)
                except Exception as read_exc:
                    raise SessionWriteInDoubtError(
                        f'session "{session_id}": the outcome of a failed crash repair is unknown, and reading it back '
                        f"failed ({read_exc})"
                    ) from read_exc
                done = (
                    stored is not None
                    and stored.torn_marker is None
                    and (not closers or same_events(stored.events[-len(closers) :], closers))
                )
                if not done:
                    raise storage_error(self.core.name, "crash repair", session_id, exc) from exc

    async def _settle(self, session_id: str, state: SessionState, pending: PendingWrite) -> Verdict:
        """Read the stored log back, decide what ``pending`` left there and update ``state`` to match.

        Runs serialized and shielded (the caller's write is shielded). Raises as described in the module doc.
        """
        state.doubt = pending
        for _ in range(MAX_SETTLE_ROUNDS):
            try:
                stored = await self.core.backend.load_stored(session_id)
            except Exception as exc:
                raise SessionWriteInDoubtError(
                    f'session "{session_id}": the outcome of a failed {pending.action} is unknown, and reading it back '
                    f"failed ({exc}); the next write reads back again first"
                ) from exc
            if stored is None:
                if pending.materializing:
                    state.doubt = None
                    return Verdict.ABSENT
                raise _fail(session_id, pending, "its stored log is gone")
            if not same_header(stored.meta, state.storage.meta, any_version=True) or (
                stored.inherited_event_count != state.storage.inherited_event_count
            ):
                raise _fail(session_id, pending, "the stored header or inherited cut differs from the one written")
            try:
                validate_stored(session_id, stored.meta, stored.inherited_event_count, stored.events, None, whole=False)
            except SessionPersistenceError as exc:
                raise _fail(session_id, pending, str(exc)) from exc
            events = stored.events
            verdict = _compare(session_id, pending, events)
            if stored.torn_marker is not None:
                # A part of the write that never completed: cut it (it was never acknowledged), then look again.
                with anyio.CancelScope(shield=True):
                    try:
                        await self.core.backend.commit_repair(state.storage, stored.torn_marker, [])
                    except Exception as exc:
                        raise SessionWriteInDoubtError(
                            f'session "{session_id}": a failed {pending.action} left a torn tail that could not be cut '
                            f"({exc}); the next write reads back again first"
                        ) from exc
                continue
            _apply(state, pending, verdict, len(events))
            return verdict
        raise SessionWriteInDoubtError(
            f'session "{session_id}": the outcome of a failed {pending.action} could not be settled in '
            f"{MAX_SETTLE_ROUNDS} read-backs; the next write reads back again first"
        )
