"""Settling a write whose outcome is unknown by reading the stored state back.

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
import sys
from collections.abc import Sequence

import anyio

from .._model.errors import (
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionStorageError,
    SessionWriteInDoubtError,
)
from .._model.events import SessionEvent
from .._wire.stored_log import same_events, same_header, validate_stored
from .state import CoordinatorCore, PendingWrite, SessionState

if sys.version_info < (3, 11):  # pragma: no cover - exercised on 3.10 only
    from exceptiongroup import BaseExceptionGroup

__all__ = ["Verdict", "is_refusal", "settle", "storage_error"]

#: Read-backs per settlement: a torn tail found by one is cut, and the next one decides.
MAX_SETTLE_ROUNDS = 3


class Verdict(enum.Enum):
    """What a read-back found of an in-doubt write."""

    ACKNOWLEDGED = "acknowledged"
    ABSENT = "absent"
    PARTIAL = "partial"


def is_refusal(exc: BaseException) -> bool:
    """Whether a primitive refused before writing (a persistence error other than a storage failure, or bad
    input): nothing reached storage, so there is nothing to read back."""
    if isinstance(exc, SessionStorageError):
        return False
    return isinstance(exc, (SessionPersistenceError, TypeError, ValueError))


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


async def settle(core: CoordinatorCore, session_id: str, state: SessionState, pending: PendingWrite) -> Verdict:
    """Read the stored log back, decide what ``pending`` left there and update ``state`` to match.

    Runs serialized and shielded (the caller's write is shielded). Raises as described in the module doc.
    """
    state.doubt = pending
    for _ in range(MAX_SETTLE_ROUNDS):
        try:
            stored = await core.backend.load_stored(session_id)
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
                    await core.backend.commit_repair(state.storage, stored.torn_marker, [])
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
