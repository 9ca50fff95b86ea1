"""The live commit's fast path: a durable append started without an await, its end delivered as a completion.

A live Session's write-behind batch usually meets a session in the steady state: bound, stored, its lease held,
nothing in doubt, no other storage operation of its id queued. Then the append needs none of the async path's
machinery (a FIFO wait, a doubt settlement, a lease acquisition, a shielded task): it takes the id's FIFO ticket
synchronously, hands the batch to the backend's ``submit_append_batch`` (one hand-off to the backend's writer),
and the backend's completion comes back through the coordinator's :class:`~.waits.CompletionPort`. Success
records the write exactly as the async path does (:func:`~.durable.succeeded`); a refusal is the caller's error; any
other failure may have reached storage and is settled by reading back, in a task of the coordinator's (rare), before
the ticket is released, so nothing else of the id is written first. Every case this path does not take (the first
write, an in-doubt session, a busy id, a batch partly stored, a backend without the primitive) returns ``False``
before anything is started, and the caller takes the async path, which handles it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial

import anyio

from .._model.errors import SessionWriteInDoubtError
from .._model.events import SessionEvent
from .durable import is_refusal, succeeded
from .fifo import Ticket
from .state import CoordinatorCore, PendingWrite, SessionState

__all__ = ["submit_live_append"]

_logger = logging.getLogger("dsh.session_persistence")

Done = Callable[[BaseException | None], None]


def submit_live_append(
    core: CoordinatorCore, session_id: str, state: SessionState, batch: Sequence[SessionEvent], done: Done
) -> bool:
    """Start the durable append of ``batch`` at ``state``'s cursor; ``done(error)`` runs later on the loop, once.

    ``False``: nothing was started (the async path must write it).
    """
    submit = core.caps.submit_append
    port = core.port
    if (
        submit is None
        or port is None
        or not batch
        or not state.materialized
        or state.doubt is not None
        or state.running is not None
        or state.settled
        or batch[0].seq != state.cursor
        or session_id in core.chains.queues
        or not core.leases.holds(session_id)
    ):
        return False
    ticket = core.chains.take(session_id)
    events = tuple(batch)
    pending = PendingWrite("append", state.cursor, events, False)
    finish = partial(_finished, core, session_id, state, pending, ticket, done)
    post = port.post
    try:
        submit(state.storage, events, True, lambda error: post(partial(finish, error)))
    except Exception:
        # Refused before anything started: the async path runs the same append and reports what it raises.
        core.chains.release(session_id, ticket)
        return False
    return True


def _finished(
    core: CoordinatorCore,
    session_id: str,
    state: SessionState,
    pending: PendingWrite,
    ticket: Ticket,
    done: Done,
    error: BaseException | None,
) -> None:
    """On the loop: the backend reported the end of ``pending``'s append."""
    if error is None:
        succeeded(state, pending)
        core.chains.release(session_id, ticket)
        done(None)
        return
    if isinstance(error, Exception) and is_refusal(error):
        # Refused before anything was written (a stale lease, a seq mismatch): the caller's error, nothing to read.
        core.chains.release(session_id, ticket)
        done(error)
        return
    spawn = core.spawn
    if not isinstance(error, Exception) or spawn is None:
        # No way to read back now (the coordinator is closing, or the step died of an interpreter-level exit):
        # the next write of the id reads back first.
        state.doubt = pending
        core.chains.release(session_id, ticket)
        done(SessionWriteInDoubtError(f'session "{session_id}": the {pending.action} was interrupted; read it back'))
        return
    failure = error

    async def settle() -> None:
        outcome: BaseException | None = None
        try:
            with anyio.CancelScope(shield=True):
                await core.writes.settle_failed(session_id, state, pending, failure)
        except Exception as exc:
            outcome = exc
        except BaseException:
            state.doubt = pending
            core.chains.release(session_id, ticket)
            done(SessionWriteInDoubtError(f'session "{session_id}": reading back a failed {pending.action} stopped'))
            raise
        core.chains.release(session_id, ticket)
        done(outcome)

    try:
        spawn(settle)
    except BaseException:
        state.doubt = pending
        core.chains.release(session_id, ticket)
        done(failure)
        raise
