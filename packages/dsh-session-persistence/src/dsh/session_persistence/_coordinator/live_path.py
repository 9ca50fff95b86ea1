"""The live path: one write-behind controller per live Session, its initialization, writes and flush barrier.

When a Session is published (or is already live when the coordinator starts), its initialization runs on the
id's FIFO chain and settles one of four cases: the Session already owns the state; ownerless state from
``create``/``load``/a storage-only ``append`` is claimed; a stored log written by this Session earlier is
adopted (hot reload: a torn tail is cut, a live turn is never closed); or the session is new. Adopting a stored
log takes the writer lease first. Initialization only binds: what the Session holds beyond the stored log (a
resume's ``session/end-seed``, a fork's or seeded session's seed) is handed to the write-behind controller,
which is held until then, as the first events it writes. So every write of a live Session, the first included,
goes through the controller: a failed one is kept and the next flush tries again, whatever the session went
through. Each batch skips what is already stored and is appended through :mod:`._durable`.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
from msgspec import UNSET

from .._backends.protocol import StorageMetadata
from .._host.session import Session
from .._model.errors import (
    LiveTurnOpenError,
    SessionIdCollisionError,
    SessionNotFoundError,
    SessionPersistenceError,
    SessionReservedError,
    SessionWriteInDoubtError,
)
from .._model.events import SessionEvent
from .._model.header import SessionHeader
from .._model.repair import has_open_turn
from .._model.views import SessionInspection
from .._wire.stored_log import same_events, validate_stored
from .fifo import Ticket
from .scheduling import Scheduler
from .state import CoordinatorCore, Outcome, PendingWrite, SessionState, is_refusal, succeeded
from .waits import CompletionPort
from .write_behind import WriteBehindController

__all__ = ["Live", "LivePath", "live_view"]

_logger = logging.getLogger("dsh.session_persistence")

Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]


@dataclass(eq=False)
class Live:
    """One live Session's persistence: its initialization and its write-behind controller."""

    init: Outcome
    writes: WriteBehindController[SessionEvent]


def live_view(session: Session) -> SessionInspection:
    """A live Session's own events as an inspection (may be unbalanced)."""
    return SessionInspection(session.header, session.inherited_event_count, session.events)


def _show_cwd(cwd: object) -> str:
    return "none" if cwd is UNSET else str(cwd)


def _check_identity(session_id: str, storage: StorageMetadata, header: SessionHeader, cut: int) -> None:
    persisted = storage.meta.cwd
    if persisted != header.cwd:
        raise SessionIdCollisionError(
            f'session "{session_id}" is already persisted at a different cwd (persisted: {_show_cwd(persisted)}, '
            f"live: {_show_cwd(header.cwd)}) (id collision)"
        )
    if storage.inherited_event_count != cut:
        raise SessionIdCollisionError(
            f'session "{session_id}" is already persisted with a different inherited event count (id collision)'
        )


class LiveSink:
    """Where a live Session's write-behind batches go: after its initialization, one durable append in the id's
    FIFO (:meth:`LivePath.write_live`); a failed background write is logged, its events stay buffered."""

    __slots__ = ("init", "path", "session")

    def __init__(self, path: LivePath, session: Session, init: Outcome) -> None:
        self.path = path
        self.session = session
        self.init = init

    async def write_batch(self, batch: builtins.list[SessionEvent]) -> None:
        if not self.init.settled():
            await self.init.wait()
        await self.path.core.chains.run(self.session.id, partial(self.path.write_live, self.session, batch))

    def submit_batch(self, batch: builtins.list[SessionEvent], done: Callable[[BaseException | None], None]) -> bool:
        """The commit without a task (:func:`submit_live_append`) once the Session is bound and owns its
        state; ``False`` sends the batch down :meth:`write_batch` (initialization pending, anything unusual)."""
        init = self.init
        if not init.is_set() or init.error is not None:
            return False
        session = self.session
        core = self.path.core
        state = core.states.get(session.id)
        if state is None or state.owner is not session:
            return False
        return submit_live_append(core, session.id, state, batch, done)

    def background_failed(self, error: BaseException) -> None:
        _logger.warning(
            '%s: background write for session "%s" failed (buffered events retained): %s',
            self.path.core.name,
            self.session.id,
            error,
        )


class LivePath:
    """The live Sessions of one coordinator and what persists them."""

    def __init__(self, core: CoordinatorCore, spawn: Spawn, delay_ms: int) -> None:
        self.core = core
        self.spawn = spawn
        self.delay_ms = delay_ms
        self.scheduler: Scheduler | None = None
        self.running = False
        self.live: dict[Session, Live] = {}

    # -- publication and initialization ---------------------------------------------------------------------

    def on_created(self, session: Session) -> None:
        """The ``session_created`` hook: veto publication while a cold load will commit state for the id."""
        if self.core.reservations.get(session.id):
            raise SessionReservedError(
                f'cannot publish session "{session.id}": persisted state already owns this identity'
            )
        self.ensure_live(session)

    def enqueue(self, session: Session, event: SessionEvent) -> None:
        """The ``session_event`` hook: the event joins the Session's write-behind window."""
        live = self.live.get(session)  # ensure_live's own first step, inlined: this runs per appended event
        if live is None:
            live = self.ensure_live(session)
        live.writes.enqueue(event)

    def ensure_live(self, session: Session) -> Live:
        """Get or create the Session's controller and start its initialization (idempotent per Session)."""
        live = self.live.get(session)
        if live is not None:
            return live
        core = self.core
        if not self.running:
            raise SessionPersistenceError(f"{core.name} persistence coordinator is not running")
        assert self.scheduler is not None
        session_id = session.id

        init = Outcome()
        controller: WriteBehindController[SessionEvent] = WriteBehindController(
            sink=LiveSink(self, session, init),
            scheduler=self.scheduler,
            spawn=self.spawn,
            max_delay_ms=self.delay_ms,
            held=True,  # until initialization knows the stored length and hands over the unwritten seed
            signal=None if core.port is None else core.port.signal,
        )
        live_entry = Live(init=init, writes=controller)
        self.live[session] = live_entry
        # The seed is what the Session holds now; later events reach the controller through session_event.
        seed = session.events
        ticket = core.chains.take(session_id)

        async def run_init() -> None:
            # The controller is released before the outcome settles, so a flush woken by it finds the backlog.
            try:
                backlog = await core.chains.run(session_id, lambda: self.init(session, seed), ticket)
            except Exception as exc:
                controller.release()
                live_entry.init.settle(exc)
            except BaseException:
                controller.release()
                live_entry.init.settle(SessionPersistenceError(f'session "{session_id}" initialization was cancelled'))
                raise
            else:
                try:
                    controller.release(backlog)
                finally:
                    live_entry.init.settle()

        try:
            self.spawn(run_init)
        except BaseException:
            core.chains.release(session_id, ticket)
            del self.live[session]
            raise
        return live_entry

    async def init(self, session: Session, seed: tuple[SessionEvent, ...]) -> tuple[SessionEvent, ...]:
        """Initialization (claim, hot-reload adoption, or a new session). Runs serialized.

        Returns the backlog: the events of ``seed`` that storage lacks, for the controller to write first (never
        written here, so that a failed first write is the controller's, kept and retried, not a failed binding).
        """
        core = self.core
        session_id = session.id
        header = session.header
        cut = session.inherited_event_count
        state = core.states.get(session_id)
        if state is not None and state.owner is session:
            return ()
        if state is not None and state.owner is not None:
            other = self.live.get(state.owner) if isinstance(state.owner, Session) else None
            if state.materialized or (other is not None and other.writes.has_work):
                raise SessionIdCollisionError(
                    f'session "{session_id}" is already bound to a different live session in this backend '
                    "(id collision)"
                )
            del core.states[session_id]  # an abandoned lazy id is reclaimable
            state = None
        if state is not None:
            # Claim ownerless state (from create, load or a storage-only append).
            _check_identity(session_id, state.storage, header, cut)
            if state.materialized:
                await core.leases.acquire(state.storage.meta)  # adoption: the lease before reading for good
                await core.writes.settle_doubt(session_id, state)
                stored = await core.backend.load_stored(session_id)
                if stored is None or not _extends(stored.events, state.cursor, seed):
                    raise SessionIdCollisionError(
                        f'session "{session_id}" is already persisted with {state.cursor} event(s) that do not '
                        "match this live session (id collision)"
                    )
                state.cursor = len(stored.events)
                if stored.torn_marker is not None:
                    await core.writes.repair(session_id, state.storage, stored.torn_marker, [])
            state.owner = session
            return seed[state.cursor :]
        stored = await core.backend.load_stored(session_id)
        # Hot-reload adoption of a stored log by the Session that wrote it: under the lease, re-read if it moved.
        if stored is not None and await core.leases.acquire(stored.meta):
            revision = await core.backend.read_stored_revision(session_id)
            if revision != stored.revision:
                stored = await core.backend.load_stored(session_id)
        if stored is not None:
            storage = StorageMetadata(stored.meta, stored.inherited_event_count)
            location = core.location(stored.meta)
            validate_stored(session_id, stored.meta, stored.inherited_event_count, stored.events, location, whole=False)
            _check_identity(session_id, storage, header, cut)
            if len(stored.events) > len(seed) or not same_events(stored.events, seed[: len(stored.events)]):
                raise SessionIdCollisionError(
                    f'session "{session_id}" already has a persisted log on disk that does not match this live '
                    "session (id collision)"
                )
            state = SessionState(storage, len(stored.events), True, session)
            if stored.torn_marker is not None:
                # Truncate only: a live turn is never closed by repair.
                await core.writes.repair(session_id, storage, stored.torn_marker, [])
            core.states[session_id] = state
        else:
            # A new session: nothing is written (and no lease taken) before its first batch.
            state = SessionState(StorageMetadata(header, cut), 0, False, session)
            core.states[session_id] = state
        return seed[state.cursor :]

    # -- writes and flush -----------------------------------------------------------------------------------

    async def write_live(self, session: Session, batch: builtins.list[SessionEvent]) -> None:
        """The write-behind sink: settle any in-doubt write, skip what is stored, then append. Serialized.

        Called only from the controller's writes, tasks of the coordinator's own (a flush caller waits on the
        barrier, never here), so the durable write runs in this task.
        """
        core = self.core
        session_id = session.id
        state = core.states.get(session_id)
        if state is None or state.owner is not session:
            raise SessionIdCollisionError(
                f'session "{session_id}" is already bound to a different live session in this backend (id collision)'
            )
        await core.writes.settle_doubt(session_id, state)  # first: a settled write may already hold part of the batch
        cursor = state.cursor
        # Usually nothing of the batch is stored yet: one comparison, not one per event.
        fresh = batch if batch and batch[0].seq >= cursor else [event for event in batch if event.seq >= cursor]
        if fresh:
            await core.writes.append_settled(session_id, state, fresh, own_task=True)

    def flush(self, session: Session) -> Awaitable[None]:
        """Coordinator flush: initialization first, then the controller's quiescence barrier.

        Not a coroutine of its own: once the Session is bound (every barrier but its first) the awaitable is the
        controller's barrier itself, one coroutine less to start and resume per barrier. What it refuses (a Session
        not registered, a failed initialization) it raises here, at the caller's ``await``.
        """
        live = self.live.get(session)
        if live is None:
            store = self.core.host.sessions
            if store is None or not store.is_live(session):
                raise SessionPersistenceError(f'session "{session.id}" is not registered for persistence')
            live = self.ensure_live(session)
        live.writes.cancel_automatic_wait()
        if live.init.settled():
            return live.writes.flush()
        return self._flush_after_init(live)

    @staticmethod
    async def _flush_after_init(live: Live) -> None:
        try:
            await live.init.wait()
        except BaseException:
            live.writes.cancel_automatic_wait()
            raise
        await live.writes.flush()

    async def load_live(self, session: Session) -> SessionInspection:
        """``load`` of a live id: flush, then the live events (refused while the turn is open)."""
        session_id = session.id
        snapshot = session.events
        await self.flush(session)
        state = self.core.states.get(session_id)
        if not snapshot and (state is None or not state.materialized):
            raise SessionNotFoundError(session_id)
        if has_open_turn(snapshot):
            raise LiveTurnOpenError(
                f'cannot load session "{session_id}" while its live turn is open; '
                "use the live Session or wait for the turn to close"
            )
        if state is None:
            return SessionInspection(session.header, session.inherited_event_count, snapshot)
        return SessionInspection(state.storage.meta, state.storage.inherited_event_count, snapshot)


def _extends(stored: Sequence[SessionEvent], cursor: int, seed: tuple[SessionEvent, ...]) -> bool:
    """Whether the stored log is this Session's own: at least ``cursor`` events, all of them a prefix of the seed."""
    return len(stored) >= cursor and len(stored) <= len(seed) and same_events(stored, seed[: len(stored)])


# ------------------------------------------------------------------------------------------------------------
# The live commit's fast path
#
# The live commit's fast path: a durable append started without an await, its end delivered as a completion.
#
# A live Session's write-behind batch usually meets a session in the steady state: bound, stored, its lease held,
# nothing in doubt, no other storage operation of its id queued. Then the append needs none of the async path's
# machinery (a FIFO wait, a doubt settlement, a lease acquisition, a shielded task): it takes the id's FIFO ticket
# synchronously, hands the batch to the backend's ``submit_append_batch`` (one hand-off to the backend's writer),
# and the backend's completion comes back through the coordinator's :class:`~.waits.CompletionPort`. Success
# records the write exactly as the async path does (:func:`~.state.succeeded`); a refusal is the caller's error; any
# other failure may have reached storage and is settled by reading back, in a task of the coordinator's (rare), before
# the ticket is released, so nothing else of the id is written first. Every case this path does not take (the first
# write, an in-doubt session, a busy id, a batch partly stored, a backend without the primitive) returns ``False``
# before anything is started, and the caller takes the async path, which handles it.

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
    write = _LiveWrite(core, session_id, state, PendingWrite("append", state.cursor, events, False), ticket, done, port)
    try:
        submit(state.storage, events, True, write)
    except Exception:
        # Refused before anything started: the async path runs the same append and reports what it raises.
        core.chains.release(session_id, ticket)
        return False
    return True


class _LiveWrite:
    """One fast-path append in flight: what its end needs, in one object the backend calls with its outcome.

    The backend calls it (on its writer thread) once; the outcome is then posted to the coordinator's loop. One
    tracked object per write instead of a chain of partials and closures: an in-flight write at 1,000 sessions
    outlives several young-generation collections, so every object it holds is garbage-collector work.
    """

    __slots__ = ("core", "done", "error", "pending", "port", "session_id", "state", "ticket")

    def __init__(
        self,
        core: CoordinatorCore,
        session_id: str,
        state: SessionState,
        pending: PendingWrite,
        ticket: Ticket,
        done: Done,
        port: CompletionPort,
    ) -> None:
        self.core = core
        self.port = port
        self.session_id = session_id
        self.state = state
        self.pending = pending
        self.ticket = ticket
        self.done = done
        self.error: BaseException | None = None

    def __call__(self, error: BaseException | None) -> None:
        """The backend's completion (any thread): hand the outcome to the loop."""
        self.error = error
        self.port.post(self._deliver)

    def _deliver(self) -> None:
        _finished(self.core, self.session_id, self.state, self.pending, self.ticket, self.done, self.error)


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
