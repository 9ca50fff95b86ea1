"""The persistence coordinator: the ``SessionPersistence`` service over a small backend.

A backend implements durable primitives only; the coordinator owns what every backend would otherwise get
wrong. It is a façade over parts of this wing, each written against the one core object (:mod:`.state`):
:mod:`.fifo` (one storage operation per id at a time, in call order), :mod:`.cold_path` (cold reads, crash repair
with a revision check), :mod:`.live_path` (live Sessions: initialization, the write-behind window of
:mod:`.write_behind`, the flush), :mod:`.retirement` (disposal and the quiescent teardown), :mod:`.durable`
(every mutating primitive, shielded, under the writer lease of :mod:`.leases`, a failed write settled by reading
back), :mod:`.lifecycle` (listing, deletion, retention, compaction), :mod:`.hooks` (the host plugin) and :mod:`.inputs`.

It plugs into the :class:`~dsh.session_persistence.Host` through the four session lifecycle hooks, which it
registers when it starts (``async with PersistenceCoordinator(host, backend) as persistence:``) and unregisters
first thing on close. A live commit completes through :mod:`.waits`; other background work runs in a task group the
coordinator owns, so a caller that is cancelled abandons only its own wait.

The preparation cache (:mod:`.preparations`) has no calls of its own: a load right after ``inspect`` reuses the
validated read; the seed's ``prepare`` and ``borrow_session`` are not exposed.
"""

from __future__ import annotations

import builtins
import logging
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import AsyncExitStack
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from .._backends.listing import SessionPage
from .._backends.protocol import RawArtifact, SessionBackend, SessionLocation, SessionSnapshot
from .._host.host import Host
from .._host.session import Session
from .._model.errors import (
    SessionAlreadyExistsError,
    SessionDisposeError,
    SessionPersistenceError,
    UnsupportedOperationError,
)
from .._model.events import SessionEvent
from .._model.header import SessionHeader
from .._model.ids import check_session_id
from .._model.jsonvalue import is_safe_int
from .._model.views import SessionEventSuffix, SessionInspection
from . import lifecycle as _lifecycle
from .cold_path import cold_commit, iter_from, prepare, read_from
from .durable import DurableWrites
from .hooks import SessionHooks
from .inputs import check_create_meta, check_offset, snapshot_batch
from .live_path import LivePath, live_view
from .retirement import Retirement
from .scheduling import Scheduler, TaskGroupScheduler
from .state import CoordinatorCore, SessionState
from .turn_rules import ColdTurnRules
from .waits import CompletionPort
from .write_behind import DEFAULT_MAX_DELAY_MS, MAX_DELAY_MS_LIMIT

__all__ = ["PersistenceCoordinator"]

_logger = logging.getLogger("dsh.session_persistence")


class PersistenceCoordinator:
    """The session persistence service: durable, serialized, validated storage of live and cold sessions.

    :param host: the plugin host; its ``sessions`` store (if any) tells which ids are live.
    :param backend: the storage primitives (:class:`~dsh.session_persistence.backend.SessionBackend`); its
        optional primitives are resolved once, here.
    :param write_batch_max_delay_ms: the write-behind window, an integer in ``1..2147483647`` (default 200).
    :param prepared_session_cache_size: how many validated cold reads to keep for a resume right after a preview
        (``inspect``, a picker); one is reused only while storage reports the revision it was read at.
    :param scheduler: timers for the write-behind windows; defaults to tasks sleeping in the coordinator's task
        group (tests pass a manual scheduler).

    Use it as an async context manager: entering starts the task group and registers the hooks (initializing
    sessions that are already live), leaving runs :meth:`aclose`. A session written through this coordinator
    is held under its backend's writer lease (when the backend has one) until it is disposed or the
    coordinator closes: a second writer is refused with :class:`~dsh.session_persistence.SessionLockedError`.
    """

    def __init__(
        self,
        host: Host,
        backend: SessionBackend,
        *,
        write_batch_max_delay_ms: int = DEFAULT_MAX_DELAY_MS,
        prepared_session_cache_size: int = 5,
        scheduler: Scheduler | None = None,
    ) -> None:
        if not is_safe_int(prepared_session_cache_size) or prepared_session_cache_size < 1:
            raise TypeError("preparedSessionCacheSize must be a positive safe integer")
        if type(write_batch_max_delay_ms) is not int or not 1 <= write_batch_max_delay_ms <= MAX_DELAY_MS_LIMIT:
            raise TypeError(f"writeBatchMaxDelayMs must be an integer between 1 and {MAX_DELAY_MS_LIMIT}")
        self._host = host
        self._backend = backend
        self._core = core = CoordinatorCore(host, backend, DurableWrites, prepared_session_cache_size)
        self._livepath = LivePath(core, self._spawn, write_batch_max_delay_ms)
        self._livepath.scheduler = scheduler
        self._retirement = Retirement(core, self._livepath, self._spawn)
        self._turn_rules = ColdTurnRules()
        self._hooks = SessionHooks(self, core, self._livepath, self._retirement)
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        # The bookkeeping maps (tests assert they drain to empty).
        self._states = core.states
        self._live = self._livepath.live
        self._retirements = core.retirements
        self._chains = core.chains.queues
        self._reservations = core.reservations

    # ------------------------------------------------------------------------------------------------------------
    # Lifecycle

    @property
    def backend(self) -> SessionBackend:
        """The storage backend."""
        return self._backend

    def _live_session(self, session_id: str) -> Session | None:
        """The host's live Session with this id, if any (the core's lookup, typed for the paths that use it)."""
        store = self._host.sessions
        return None if store is None else store.get(session_id)

    @property
    def name(self) -> str:
        """The backend's name (used in log lines and the teardown error group)."""
        return self._core.name

    async def __aenter__(self) -> PersistenceCoordinator:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack = self._stack
        try:
            await self.aclose()
        finally:
            if stack is not None:
                self._stack = None
                self._core.spawn = None
                if self._tg is not None:
                    # Only idle timers can be left; the body of ``async with`` has finished.
                    self._tg.cancel_scope.cancel()
                # The body's own exception is not handed to the task group: it propagates unchanged from here
                # instead of coming back wrapped in an ExceptionGroup.
                await stack.__aexit__(None, None, None)
                self._tg = None

    async def start(self) -> None:
        """Open the task group, register the hooks and initialize the sessions already live in the host.

        Prefer ``async with``: the task group must be exited by the task that entered it.
        """
        if self._livepath.running or self._core.closed:
            raise RuntimeError("a PersistenceCoordinator can be started only once")
        stack = AsyncExitStack()
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        tg = self._tg
        self._core.spawn = lambda job: tg.start_soon(job)  # durable writes run here: a caller can leave at its deadline
        self._core.port = CompletionPort()  # the running loop's: backend writers report commits through it
        if self._livepath.scheduler is None:
            self._livepath.scheduler = TaskGroupScheduler(self._spawn)
        self._host.register(self._hooks, name=f"dsh-session-persistence-{id(self):x}")
        self._livepath.running = True
        store = self._host.sessions
        if store is not None:
            for session in store.list():
                session.enforce_turn_rules()  # as for a session created later (hooks.session_created)
                self._livepath.ensure_live(session)

    async def aclose(self) -> None:
        """Stop admission, drain every controller and chain, release the writer leases, close the backend.

        Raises :class:`~dsh.session_persistence.SessionDisposeError` (its ``errors`` one per failing session) if
        a final flush failed; the backend is closed in every case (its own close error is raised only when the
        drain succeeded).
        """
        if self._core.closed:
            return
        self._core.closed = True
        if self._livepath.running:
            self._livepath.running = False
            if self._host.is_registered(self._hooks):
                self._host.unregister(self._hooks)
        errors: builtins.list[Exception] = []
        try:
            await self._retirement.drain(errors)
        finally:
            close_error: Exception | None = None
            try:
                with anyio.CancelScope(shield=True):
                    for running in builtins.list(self._core.running_writes):  # writes whose callers left
                        await running.wait()
                await self._core.leases.release_all()
                close = self._core.caps.aclose
                if close is not None:
                    await close()
            except Exception as exc:
                close_error = exc
        if errors:
            raise SessionDisposeError(self.name, errors)
        if close_error is not None:
            raise close_error

    def _require_open(self) -> None:
        self._core.require_open()

    def _spawn(self, func: Callable[[], Coroutine[Any, Any, None]]) -> None:
        tg = self._tg
        if tg is None:
            raise RuntimeError("the PersistenceCoordinator is not running (use `async with`)")
        tg.start_soon(self._guarded, func)

    @staticmethod
    async def _guarded(func: Callable[[], Coroutine[Any, Any, None]]) -> None:
        # Background work must never take the coordinator's task group (and the caller's body) down.
        try:
            await func()
        except Exception:
            _logger.exception("session persistence background task failed")

    async def _cold_commit(self, session_id: str) -> SessionInspection:
        """The cold load's serialized core (exposed for tests that drive it directly)."""
        return await cold_commit(self._core, session_id)

    # ------------------------------------------------------------------------------------------------------------
    # Public surface

    def locate(self, meta: SessionHeader) -> SessionLocation | None:
        """The backend's artifact location for ``meta`` (no I/O, nothing created), ``None`` without one."""
        locate = self._core.caps.locate
        return None if locate is None else locate(meta)

    @property
    def supports_raw_artifacts(self) -> bool:
        """Whether :meth:`read_raw` can return the backend's artifact text."""
        return self._core.caps.read_raw is not None

    async def read_raw(self, session_id: str) -> RawArtifact | None:
        """The stored artifact verbatim, ``None`` if supported but absent."""
        check_session_id(session_id)
        await anyio.lowlevel.checkpoint_if_cancelled()
        read_raw = self._core.caps.read_raw
        if read_raw is None:
            raise UnsupportedOperationError("this session persistence backend does not expose raw artifacts")
        await self._retirement.wait(session_id)
        return await read_raw(session_id)

    async def create(self, meta: SessionHeader | Mapping[str, Any], inherited_event_count: int | None = None) -> None:
        """Register a session lazily: nothing is written until its first append."""
        self._require_open()
        storage = check_create_meta(meta, inherited_event_count)
        session_id = storage.meta.id
        core = self._core

        async def run() -> None:
            if session_id in core.states or core.reservations.get(session_id):
                raise SessionAlreadyExistsError(f'session "{session_id}" already exists in this backend')
            if await self._backend.read_stored_revision(session_id) is not None:
                raise SessionAlreadyExistsError(
                    f'session "{session_id}" already has a persisted log on disk; load/resume it instead of creating'
                )
            core.states[session_id] = SessionState(storage, 0, False, None)

        await core.chains.run(session_id, run)

    async def ensure_materialized(self, session: Session) -> None:
        """Make an empty live session durable and listable without inventing an event."""
        self._require_open()
        await self._livepath.flush(session)
        session_id = session.id
        core = self._core

        async def run() -> None:
            state = core.states.get(session_id)
            if state is None:
                raise SessionPersistenceError(f'session "{session_id}" is not registered for persistence')
            if state.materialized:
                return
            await core.writes.materialize(session_id, state)

        await core.chains.run(session_id, run)

    async def append(self, session_id: str, events: Sequence[SessionEvent | Mapping[str, Any]]) -> None:
        """Durably persist one contiguous batch; returns only once the backend made it durable."""
        self._require_open()
        check_session_id(session_id)
        batch = snapshot_batch(events)
        core = self._core

        async def run() -> None:
            if not batch:
                return
            state = core.states.get(session_id)
            if state is None or (state.owner is None and state.materialized and not core.leases.holds(session_id)):
                # Adopt the stored log (committing any pending crash repair) under the writer lease.
                await cold_commit(core, session_id, for_write=True)
                state = core.states[session_id]
            await core.writes.settle_doubt(session_id, state)  # the stored end the batch must continue is known
            # A batch the loader would refuse is refused here (TurnInvariantError), before anything is written.
            turns = await self._turn_rules.check(core, session_id, state, batch)
            await core.writes.append(session_id, state, batch)
            if state.cursor == batch[-1].seq + 1:
                self._turn_rules.keep(session_id, state, turns)

        await core.chains.run(session_id, run)

    async def load(self, session_id: str) -> SessionInspection:
        """A balanced view of the session; commits cold crash repair (under the writer lease)."""
        self._require_open()
        check_session_id(session_id)
        await anyio.lowlevel.checkpoint_if_cancelled()
        await self._retirement.wait(session_id)
        core = self._core
        session = self._live_session(session_id)
        if session is not None:
            return await self._livepath.load_live(session)
        core.reservations[session_id] = core.reservations.get(session_id, 0) + 1
        try:
            inspection = await core.chains.run(session_id, lambda: cold_commit(core, session_id))
        finally:
            left = core.reservations[session_id] - 1
            if left:
                core.reservations[session_id] = left
            else:
                del core.reservations[session_id]
        return inspection

    async def inspect(self, session_id: str) -> SessionInspection:
        """A logical view that never writes: cold logs get in-memory closers, a live session its own events."""
        self._require_open()
        check_session_id(session_id)
        await anyio.lowlevel.checkpoint_if_cancelled()
        await self._retirement.wait(session_id)
        core = self._core
        session = self._live_session(session_id)
        if session is not None:
            return live_view(session)
        prepared = await core.chains.run(session_id, lambda: prepare(core, session_id))
        session = self._live_session(session_id)
        if session is not None:
            # Published while we read: the live Session wins.
            return live_view(session)
        return prepared.inspection

    async def read_from(self, session_id: str, from_seq: int) -> SessionEventSuffix:
        """The stored events with ``seq >= from_seq`` (storage only: no closers, no repair, no live events)."""
        self._require_open()
        check_session_id(session_id)
        offset = check_offset(from_seq)
        await anyio.lowlevel.checkpoint_if_cancelled()
        await self._retirement.wait(session_id)
        core = self._core
        return await core.chains.run(session_id, lambda: read_from(core, session_id, offset))

    async def iter_events(self, session_id: str, from_seq: int = 0) -> AsyncIterator[SessionEvent]:
        """Stream the stored events with ``seq >= from_seq`` (storage only, like :meth:`read_from`).

        With a backend that streams (``SupportsStreamingRead``: JSONL, memory) memory stays bounded by one stored
        batch whatever the log's length, and only the batches from ``from_seq`` on are read; otherwise this is
        :meth:`read_from` yielded event by event. Each run is validated (identity, version, contiguity, known
        types) before its events are yielded; the stream reads the log as it was when it started. Raises
        ``SessionNotFoundError`` when the session is absent.
        """
        self._require_open()
        check_session_id(session_id)
        offset = check_offset(from_seq)
        await anyio.lowlevel.checkpoint_if_cancelled()
        await self._retirement.wait(session_id)
        stream = iter_from(self._core, session_id, offset)
        try:
            async for event in stream:
                yield event
        finally:
            await stream.aclose()

    async def list(self) -> builtins.list[SessionHeader]:
        """Headers of every materialized session (no log parsing)."""
        self._require_open()
        await anyio.lowlevel.checkpoint_if_cancelled()
        return await self._backend.list()

    async def list_snapshots(self) -> builtins.list[SessionSnapshot]:
        """Headers with opaque revisions of every materialized session."""
        self._require_open()
        await anyio.lowlevel.checkpoint_if_cancelled()
        return await self._backend.list_snapshots()

    async def truncate(self, session: Session, length: int) -> None:
        """Durably cut a live, owned session's log to ``length`` events (turn-tail deletion).

        Only after this returns may the caller cut the in-memory Session (``session.truncate(length)``). No events
        may be appended to the session while this runs. The rewrite is a compare-and-swap: the stored log is read
        under the writer lease and must still be exactly what this coordinator wrote, or nothing is rewritten.
        """
        self._require_open()
        check_offset(length)
        session_id = session.id
        not_owned = f'session "{session_id}" is not owned by this persistence coordinator'
        if session not in self._live:
            raise SessionPersistenceError(not_owned)
        await self._livepath.flush(session)
        core = self._core

        async def run() -> None:
            state = core.states.get(session_id)
            if state is None or state.owner is not session:
                raise SessionPersistenceError(not_owned)
            events = session.events
            if state.cursor != len(events):
                raise SessionPersistenceError(
                    f'session "{session_id}" changed while destructive deletion was preparing'
                )
            if length > len(events) or length < state.storage.inherited_event_count:
                raise ValueError(f"session truncation length {length} is outside the writable log prefix")
            await core.writes.rewrite(session_id, state, events, events[:length])

        await core.chains.run(session_id, run)

    async def flush(self, session: Session) -> None:
        """Make everything appended to the live ``session`` so far durable (the ``session_flush`` barrier)."""
        self._require_open()
        await self._livepath.flush(session)

    async def wait_ready(self, session: Session) -> None:
        """Wait until this live session is bound to its stored state; raise what binding raised.

        Writes nothing and is not a flush. A new session whose id is already stored raises
        ``SessionIdCollisionError`` here, and one whose writer lease another writer holds ``SessionLockedError``,
        before anything of it is appended.
        """
        self._require_open()
        live = self._livepath.live.get(session)
        if live is None:
            store = self._host.sessions
            if store is None or not store.is_live(session):
                raise SessionPersistenceError(f'session "{session.id}" is not registered for persistence')
            session.enforce_turn_rules()
            live = self._livepath.ensure_live(session)
        await live.init.wait()

    # ------------------------------------------------------------------------------------------------------------
    # Lifecycle: paged listing, deletion, retention, compaction (implemented in _lifecycle)

    async def list_page(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        order: str = "recent",
        cwd: str | os.PathLike[str] | None = None,
        parent: str | None = None,
        since: datetime | int | None = None,
    ) -> SessionPage:
        """One page of stored sessions, newest first by ``order`` (``"recent"`` activity or ``"created"``).

        Filters: ``cwd`` (exact header cwd), ``parent`` (``parentSession``), ``since`` (last activity at or
        after, an aware datetime or milliseconds since the epoch). Pass ``page.next_cursor`` back as ``cursor``
        for the next page; a cursor from another root, order or filter set raises ``SessionCursorError``.
        """
        return await _lifecycle.list_page(
            self._core, limit=limit, cursor=cursor, order=order, cwd=cwd, parent=parent, since=since
        )

    async def delete(self, session_id: str, *, expected_revision: str | None = None) -> None:
        """Durably delete a stored session; refused for a live one (``SessionLiveError``) or one whose writer
        lease another writer holds (``SessionLockedError``); unknown ids raise ``SessionNotFoundError``."""
        await _lifecycle.delete(self._core, session_id, expected_revision)

    async def compact(self, session_id: str) -> _lifecycle.CompactResult:
        """Rewrite a closed, cold session's log as one batch, atomically, under its writer lease."""
        return await _lifecycle.compact(self._core, session_id, prepare)

    async def prune(
        self,
        *,
        older_than: timedelta | None = None,
        keep_last: int | None = None,
        dry_run: bool = True,
        now: datetime | int | None = None,
        progress: _lifecycle.Progress | None = None,
    ) -> _lifecycle.PruneReport:
        """Retention by age and/or count; a dry run (the default) only reports what would be deleted."""
        return await _lifecycle.prune(
            self._core, older_than=older_than, keep_last=keep_last, dry_run=dry_run, now=now, progress=progress
        )


def core_of(coordinator: PersistenceCoordinator) -> CoordinatorCore:
    """The core object a coordinator's parts share, for the distribution's own tools (the CLI's ``repair`` holds a
    writer lease through it, the conformance kit waits for a retirement): never a part's private attributes."""
    return coordinator._core
