"""The coordinator's durable writes: each mutating primitive runs shielded, under the session's writer lease,
after any earlier in-doubt write is settled, and a failure that may have reached storage is read back
(see :mod:`._in_doubt`) instead of being retried blindly.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import anyio

from .._backends.protocol import StorageMetadata
from .._model.errors import (
    IncompleteInheritedPrefixError,
    SessionPersistenceError,
    SessionWriteInDoubtError,
    UnsupportedOperationError,
)
from .._model.events import SessionEvent
from .._wire.contiguity import check_contiguous
from .._wire.stored_log import same_events
from .in_doubt import Verdict, is_refusal, settle, storage_error
from .state import CoordinatorCore, PendingWrite, SessionState

__all__ = ["append_settled", "append", "ensure_lease", "materialize", "repair", "rewrite", "settle_doubt"]

_logger = logging.getLogger("dsh.session_persistence")


async def settle_doubt(core: CoordinatorCore, session_id: str, state: SessionState) -> None:
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
        verdict = await settle(core, session_id, state, pending)
    _logger.warning(
        '%s: session "%s": an earlier failed %s was read back: %s', core.name, session_id, pending.action, verdict.value
    )


async def ensure_lease(core: CoordinatorCore, session_id: str, state: SessionState) -> None:
    """Hold the session's writer lease before writing.

    Taking it here is only ever a first write (an unmaterialized session): every path that adopts an existing
    log takes the lease first and reads the log again under it (cold commit, live initialization), so a cursor
    is never trusted from a read made without the lease.
    """
    await core.leases.acquire(state.storage.meta)


async def _run(
    core: CoordinatorCore,
    session_id: str,
    state: SessionState,
    pending: PendingWrite,
    primitive: Callable[[], Awaitable[None]],
) -> None:
    """Run one durable write in the coordinator's task group and wait for it; a cancelled caller leaves at once.

    The write itself is never cancelled (it runs shielded, to its end, bounded by the backend's own timeouts):
    only the caller's wait is. The session's next write waits for it (:func:`settle_doubt`), and a batch it
    stored after its caller left is acknowledged when that caller retries it unchanged.
    """
    spawn = core.spawn
    if spawn is None:  # not running in a task group (a coordinator driven directly): the caller waits
        await _run_to_end(core, session_id, state, pending, primitive)
        return
    done = anyio.Event()
    caller = {"left": False, "completed": False}
    failure: list[Exception] = []

    async def job() -> None:
        try:
            await _run_to_end(core, session_id, state, pending, primitive)
            caller["completed"] = True
            if caller["left"] and not pending.replaced:
                state.settled = pending.events  # the caller never heard: its unchanged retry is acknowledged
        except Exception as exc:  # the caller's error; if it left, the state says what the next write must do
            failure.append(exc)
            if caller["left"]:
                _logger.warning(
                    '%s: %s for session "%s", abandoned by its caller, failed: %s',
                    core.name,
                    pending.action,
                    session_id,
                    exc,
                )
        finally:
            done.set()
            core.running_writes.discard(done)
            if state.running is done:
                state.running = None

    state.running = done
    core.running_writes.add(done)
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
        raise SessionWriteInDoubtError(f'session "{session_id}": the {pending.action} was interrupted; read it back')


async def _run_to_end(
    core: CoordinatorCore,
    session_id: str,
    state: SessionState,
    pending: PendingWrite,
    primitive: Callable[[], Awaitable[None]],
) -> None:
    """Run one mutating primitive shielded; on success record its effect, on failure settle it by reading back."""
    with anyio.CancelScope(shield=True):
        try:
            await primitive()
        except Exception as exc:
            if is_refusal(exc):
                raise
            verdict = await settle(core, session_id, state, pending)
            if verdict is Verdict.ACKNOWLEDGED:
                _logger.warning(
                    '%s: %s for session "%s" failed after reaching storage; read back and acknowledged: %s',
                    core.name,
                    pending.action,
                    session_id,
                    exc,
                )
                return
            note = ""
            if verdict is Verdict.PARTIAL:
                note = f" (events before seq {state.cursor} were stored and are acknowledged; the rest was not)"
            raise storage_error(core.name, pending.action, session_id, exc, note) from exc
        state.doubt = None
        state.settled = ()
        state.materialized = True
        state.cursor = len(pending.events) if pending.replaced else pending.start + len(pending.events)


async def append(core: CoordinatorCore, session_id: str, state: SessionState, batch: Sequence[SessionEvent]) -> None:
    """Contiguity, the inherited-prefix gate, the lease, then one durable ``append_batch``. Runs serialized.

    A batch that a read-back acknowledged a moment ago (its primitive had failed) is acknowledged again when it
    is retried unchanged, instead of being refused as a seq mismatch.
    """
    await settle_doubt(core, session_id, state)
    await append_settled(core, session_id, state, batch)


async def append_settled(
    core: CoordinatorCore, session_id: str, state: SessionState, batch: Sequence[SessionEvent]
) -> None:
    """:func:`append` for a caller that has just settled the id's in-doubt write itself (settlement runs once
    per write): contiguity, the inherited-prefix gate, the lease, then one durable ``append_batch``."""
    cursor = state.cursor
    settled = state.settled
    if settled and batch and batch[0].seq == cursor - len(settled) and same_events(batch, settled):
        return
    check_contiguous(session_id, cursor, batch)
    if not state.materialized and cursor + len(batch) < state.storage.inherited_event_count:
        raise IncompleteInheritedPrefixError(
            f'session "{session_id}" cannot materialize before its inherited prefix is complete'
        )
    await ensure_lease(core, session_id, state)
    events = tuple(batch)
    storage, materialized = state.storage, state.materialized
    pending = PendingWrite("append", cursor, events, not materialized)
    await _run(core, session_id, state, pending, lambda: core.backend.append_batch(storage, events, materialized))


async def materialize(core: CoordinatorCore, session_id: str, state: SessionState) -> None:
    """Durably create the header-only artifact of an empty session. Runs serialized."""
    materialize_header = core.caps.materialize_header
    if materialize_header is None:
        raise UnsupportedOperationError("session persistence backend cannot materialize an empty session")
    await settle_doubt(core, session_id, state)
    if state.materialized:
        return
    await ensure_lease(core, session_id, state)
    storage = state.storage
    pending = PendingWrite("header materialization", 0, (), True)
    await _run(core, session_id, state, pending, lambda: materialize_header(storage))


async def rewrite(
    core: CoordinatorCore,
    session_id: str,
    state: SessionState,
    expected: Sequence[SessionEvent],
    events: Sequence[SessionEvent],
) -> None:
    """Replace the stored log ``expected`` by its prefix ``events``, compare-and-swap: the stored log is read
    under the lease first and must still be exactly ``expected``, or nothing is written. Runs serialized."""
    rewrite_primitive = core.caps.rewrite
    if rewrite_primitive is None:
        raise UnsupportedOperationError(f"{core.name} does not support destructive session deletion")
    await settle_doubt(core, session_id, state)
    await ensure_lease(core, session_id, state)
    if state.materialized:
        stored = await core.backend.load_stored(session_id)
        if stored is None or stored.torn_marker is not None or not same_events(stored.events, expected):
            found = "no stored log" if stored is None else f"{len(stored.events)} stored event(s)"
            raise SessionPersistenceError(
                f'session "{session_id}" changed in storage since this writer wrote it ({found}, expected '
                f"{len(expected)}); refusing to rewrite it"
            )
    storage = state.storage
    new = tuple(events)
    pending = PendingWrite("rewrite", len(expected), new, False, replaced=True)
    await _run(core, session_id, state, pending, lambda: rewrite_primitive(storage, new))


async def repair(
    core: CoordinatorCore,
    session_id: str,
    storage: StorageMetadata,
    marker: object | None,
    closers: Sequence[SessionEvent],
) -> None:
    """``commit_repair`` shielded; a failure is read back: a repair that landed counts as done, one that did not
    surfaces as a storage error (the caller re-reads before any retry)."""
    with anyio.CancelScope(shield=True):
        try:
            await core.backend.commit_repair(storage, marker, closers)
        except Exception as exc:
            if is_refusal(exc):
                raise
            try:
                stored = await core.backend.load_stored(session_id)
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
                raise storage_error(core.name, "crash repair", session_id, exc) from exc
