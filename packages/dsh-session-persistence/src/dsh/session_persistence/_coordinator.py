"""The persistence coordinator: the ``SessionPersistence`` service over a small backend (coordinator.md §1-§5).

A backend implements durable primitives only; this module owns what every backend would otherwise get wrong:

* per-id FIFO serialization (a ticket deque per id, position taken synchronously at call entry),
* lazy materialization, a contiguous seq cursor and the inherited-prefix gate,
* read validation (corruption wrapping, format refusal) and cold-only crash repair with a revision check,
* the live side: one write-behind controller per live ``Session``, initialization on publication (claim,
  hot-reload adoption, new session), the flush barrier, retirement on disposal and a quiescent teardown.

It plugs into the :class:`~dsh.session_persistence.Host` through the four session lifecycle hooks, which it
registers when it starts (``async with PersistenceCoordinator(host, backend) as persistence:``) and unregisters
first thing on close. Background work (write-behind timers and writes, initialization, retirement) runs in a
task group the coordinator owns, so a caller that is cancelled abandons only its own wait.

Not implemented yet (coordinator.md [ADVANCED]): the preparation cache, ``prepare`` and ``borrow_session``.
"""

from __future__ import annotations

import builtins
import logging
import operator
import os
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import msgspec
from anyio.abc import TaskGroup
from msgspec import UNSET

from . import _lifecycle
from ._backend import SessionBackend, SessionLocation, SessionSnapshot, StorageMetadata, StoredPrefix
from ._errors import (
    IncompleteInheritedPrefixError,
    LiveTurnOpenError,
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionIdCollisionError,
    SessionLiveError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionReservedError,
    UnsupportedOperationError,
)
from ._events import SessionEvent, decode_event, event_to_builtins
from ._format import check_format_version, refuse_unknown_events
from ._header import SessionHeader, header_from_builtins, header_to_builtins
from ._host import Host, hookimpl
from ._json import NotLosslessJsonError, is_safe_int, snapshot_json
from ._listing import SessionPage
from ._repair import has_open_turn, interrupted_turn_closers
from ._scheduling import Scheduler, TaskGroupScheduler
from ._session import Session
from ._validator import validate_turns
from ._views import SessionEventSuffix, SessionInspection
from ._write_behind import DEFAULT_MAX_DELAY_MS, MAX_DELAY_MS_LIMIT, WriteBehindController

if sys.version_info < (3, 11):  # pragma: no cover - exercised on 3.10 only
    from exceptiongroup import ExceptionGroup

__all__ = ["PersistenceCoordinator"]

_logger = logging.getLogger("dsh.session_persistence")

T = TypeVar("T")

#: How many times a cold load re-reads a log that keeps changing under it before giving up (§2.3 #9).
MAX_COLD_ATTEMPTS = 32


# ----------------------------------------------------------------------------------------------------------------
# Small state holders


class _Ticket:
    """One caller's place in an id's FIFO chain; ``done`` is set when it leaves (finished or cancelled)."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = anyio.Event()


class _Outcome:
    """A one-shot result shared by several waiters (initialization, retirement)."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: BaseException | None = None

    def settle(self, error: BaseException | None = None) -> None:
        self.error = error
        self.done.set()

    async def wait(self) -> None:
        await self.done.wait()
        if self.error is not None:
            raise self.error


@dataclass(eq=False)
class _State:
    """Durable bookkeeping of one id (§2.2): what durable writes use, and who owns it."""

    storage: StorageMetadata
    cursor: int
    materialized: bool
    owner: Session | None


@dataclass(eq=False)
class _Live:
    """One live Session's persistence: its initialization and its write-behind controller."""

    init: _Outcome
    writes: WriteBehindController[SessionEvent]


@dataclass(frozen=True)
class _Prepared:
    """A validated cold read: the stored prefix, its closers and the inspection (stored + closers)."""

    stored: StoredPrefix
    closers: list[SessionEvent]
    inspection: SessionInspection


class _Hooks:
    """The host plugin: the coordinator's session lifecycle hook implementations."""

    def __init__(self, owner: PersistenceCoordinator) -> None:
        self._owner = owner

    @hookimpl
    def session_created(self, session: Session) -> None:
        self._owner._on_created(session)

    @hookimpl
    def session_event(self, session: Session, event: SessionEvent) -> None:
        self._owner._ensure_live(session).writes.enqueue(event)

    @hookimpl
    def session_flush(self, session: Session) -> Awaitable[None]:
        return self._owner._flush(session)

    @hookimpl
    def session_disposed(self, session: Session) -> None:
        self._owner._on_disposed(session)


# ----------------------------------------------------------------------------------------------------------------
# Helpers


def _wrap_corruption(session_id: str, exc: Exception) -> SessionPersistenceCorruptionError:
    error = SessionPersistenceCorruptionError(f'stored session "{session_id}" failed validation: {exc}')
    error.__cause__ = exc
    return error


_seq_of = operator.attrgetter("seq")


def _check_contiguous(events: Sequence[SessionEvent], start: int = 0) -> None:
    # One C-level comparison for the common (valid) case; the loop only runs to name the first bad index.
    if list(map(_seq_of, events)) == list(range(start, start + len(events))):
        return
    for index, event in enumerate(events):
        if event.seq != start + index:
            raise ValueError(f"stored event at index {start + index} has seq {event.seq}")


def _same_events(left: Sequence[SessionEvent], right: Sequence[SessionEvent]) -> bool:
    """JSON equality of two event lists (what storage would hold for each)."""
    if len(left) != len(right):
        return False
    return all(a is b or event_to_builtins(a) == event_to_builtins(b) for a, b in zip(left, right, strict=True))


def _check_cut(session_id: str, cut: object, stored: int) -> None:
    if not is_safe_int(cut) or cut < 0:  # type: ignore[operator]
        raise ValueError(f"inherited event count {cut!r} is not a non-negative safe integer")
    if cut > stored:  # type: ignore[operator]
        raise ValueError(f'session "{session_id}" inherited event count exceeds its stored event count')


def _show_cwd(cwd: object) -> str:
    return "none" if cwd is UNSET else str(cwd)


def _check_offset(value: object) -> int:
    if not is_safe_int(value) or value < 0:  # type: ignore[operator]
        raise TypeError(f"SessionLogOffset must be a non-negative safe integer, got {value!r}")
    return value  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------------------------


class PersistenceCoordinator:
    """The session persistence service: durable, serialized, validated storage of live and cold sessions.

    :param host: the plugin host; its ``sessions`` store (if any) tells which ids are live.
    :param backend: the storage primitives (:class:`~dsh.session_persistence.SessionBackend`).
    :param write_batch_max_delay_ms: the write-behind window, an integer in ``1..2147483647`` (default 200).
    :param prepared_session_cache_size: validated for forward compatibility (the cache is not implemented yet).
    :param scheduler: timers for the write-behind windows; defaults to tasks sleeping in the coordinator's task
        group (tests pass a :class:`~dsh.session_persistence._scheduling.ManualScheduler`).

    Use it as an async context manager: entering starts the task group and registers the hooks (initializing
    sessions that are already live), leaving runs :meth:`aclose`.
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
        self._delay_ms = write_batch_max_delay_ms
        self._scheduler = scheduler
        self._name: str = getattr(backend, "NAME", None) or type(backend).__name__
        self._hooks = _Hooks(self)
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._running = False
        self._closed = False
        # §2.2 maps; tests assert they drain to empty.
        self._states: dict[str, _State] = {}
        self._live: dict[Session, _Live] = {}
        self._retirements: dict[str, _Outcome] = {}
        self._chains: dict[str, deque[_Ticket]] = {}
        # In-flight cold loads: they will commit state for the id, so publication of a Session is vetoed.
        self._reservations: dict[str, int] = {}

    # ------------------------------------------------------------------------------------------------------------
    # Lifecycle

    @property
    def backend(self) -> SessionBackend:
        """The storage backend."""
        return self._backend

    @property
    def name(self) -> str:
        """The backend's name (used in log lines and the teardown error group)."""
        return self._name

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
        if self._running or self._closed:
            raise RuntimeError("a PersistenceCoordinator can be started only once")
        stack = AsyncExitStack()
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        if self._scheduler is None:
            self._scheduler = TaskGroupScheduler(self._spawn)
        self._host.register(self._hooks, name=f"dsh-session-persistence-{id(self):x}")
        self._running = True
        store = self._host.sessions
        if store is not None:
            for session in store.list():
                self._ensure_live(session)

    async def aclose(self) -> None:
        """Stop admission, drain every controller and chain, then close the backend (§5.5).

        Raises ``ExceptionGroup("<backend> dispose failed", errors)`` if a final flush failed; the backend is
        closed in every case (its own close error is raised only when the drain succeeded).
        """
        if self._closed:
            return
        self._closed = True
        if self._running:
            self._running = False
            if self._host.is_registered(self._hooks):
                self._host.unregister(self._hooks)
        errors: builtins.list[Exception] = []
        try:
            await self._drain(errors)
        finally:
            close = getattr(self._backend, "aclose", None)
            close_error: Exception | None = None
            if close is not None:
                try:
                    await close()
                except Exception as exc:
                    close_error = exc
        if errors:
            raise ExceptionGroup(f"{self._name} dispose failed", errors)
        if close_error is not None:
            raise close_error

    async def _drain(self, errors: builtins.list[Exception]) -> None:
        results: dict[int, Exception] = {}

        async def flush_one(index: int, session: Session) -> None:
            try:
                await self._flush(session)
            except Exception as exc:
                results[index] = exc

        sessions = list(self._live)
        if sessions:
            async with anyio.create_task_group() as tg:
                for index, session in enumerate(sessions):
                    tg.start_soon(flush_one, index, session)
        errors.extend(results[i] for i in sorted(results))
        # Wait until every chain is idle; new ops (retirements, detached appends) may enqueue meanwhile.
        while self._retirements or self._chains:
            if self._retirements:
                await next(iter(self._retirements.values())).done.wait()
            else:
                await next(iter(self._chains.values()))[-1].done.wait()

    def _require_open(self) -> None:
        if self._closed:
            raise SessionPersistenceError(f"{self._name} persistence coordinator is closed")

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

    # ------------------------------------------------------------------------------------------------------------
    # Per-id FIFO chain (Appendix A)

    def _take_ticket(self, session_id: str) -> _Ticket:
        ticket = _Ticket()
        self._chains.setdefault(session_id, deque()).append(ticket)
        return ticket

    def _release(self, session_id: str, ticket: _Ticket) -> None:
        queue = self._chains.get(session_id)
        if queue is not None:
            with suppress(ValueError):
                queue.remove(ticket)
            if not queue:
                del self._chains[session_id]
        ticket.done.set()

    async def _serialized(self, session_id: str, func: Callable[[], Awaitable[T]], ticket: _Ticket | None = None) -> T:
        """Run ``func`` when every earlier ticket of ``session_id`` has left the chain.

        The ticket is taken before the first suspension, so call order is queue order. A ticket cancelled while
        queued leaves at once (followers re-check their predecessor); a failure never blocks the chain.
        """
        if ticket is None:
            ticket = self._take_ticket(session_id)
        try:
            while True:
                queue = self._chains[session_id]
                index = queue.index(ticket)
                if index == 0:
                    break
                await queue[index - 1].done.wait()
            return await func()
        finally:
            self._release(session_id, ticket)

    # ------------------------------------------------------------------------------------------------------------
    # Public surface

    def locate(self, meta: SessionHeader) -> SessionLocation | None:
        """The backend's artifact location for ``meta`` (no I/O, nothing created), ``None`` without one."""
        locate = getattr(self._backend, "locate", None)
        if locate is None:
            return None
        location: SessionLocation | None = locate(meta)
        return location

    @property
    def supports_raw_artifacts(self) -> bool:
        """Whether :meth:`read_raw` can return the backend's artifact text."""
        return bool(getattr(self._backend, "supports_raw_artifacts", False)) and hasattr(self._backend, "read_raw")

    async def read_raw(self, session_id: str) -> Any:
        """The stored artifact verbatim (a ``RawArtifact``), ``None`` if supported but absent."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        if not self.supports_raw_artifacts:
            raise UnsupportedOperationError("this session persistence backend does not expose raw artifacts")
        await self._wait_retirement(session_id)
        return await self._backend.read_raw(session_id)  # type: ignore[attr-defined]

    async def create(self, meta: SessionHeader | Mapping[str, Any], inherited_event_count: int | None = None) -> None:
        """Register a session lazily: nothing is written until its first append (§1.2 #3)."""
        self._require_open()
        raw = header_to_builtins(meta) if isinstance(meta, SessionHeader) else meta
        try:
            data = snapshot_json(dict(raw) if isinstance(raw, Mapping) else raw, "session metadata")
        except NotLosslessJsonError as exc:
            raise TypeError("session metadata must be losslessly JSON-serializable") from exc
        if not isinstance(data, dict):
            raise TypeError("session metadata must be a JSON object")
        created_at = data.get("createdAt")
        if not is_safe_int(created_at) or created_at < 0:  # type: ignore[operator]
            raise TypeError("session metadata createdAt must be a non-negative safe integer")
        seeded = data.get("isSeeded") is True
        if seeded and inherited_event_count is None:
            raise TypeError("seeded session metadata requires an inherited event count")
        cut = 0 if inherited_event_count is None else _check_offset(inherited_event_count)
        if not seeded and cut != 0:
            raise TypeError("unseeded session metadata inherited event count must be 0")
        try:
            header = meta if isinstance(meta, SessionHeader) else msgspec.convert(data, SessionHeader)
        except msgspec.ValidationError as exc:
            raise TypeError(f"session metadata is not a session header: {exc}") from exc
        session_id = header.id
        storage = StorageMetadata(header, cut)

        async def core() -> None:
            if session_id in self._states or self._reservations.get(session_id):
                raise SessionAlreadyExistsError(f'session "{session_id}" already exists in this backend')
            if await self._backend.read_stored_revision(session_id) is not None:
                raise SessionAlreadyExistsError(
                    f'session "{session_id}" already has a persisted log on disk; load/resume it instead of creating'
                )
            self._states[session_id] = _State(storage, 0, False, None)

        await self._serialized(session_id, core)

    async def ensure_materialized(self, session: Session) -> None:
        """Make an empty live session durable and listable without inventing an event (§1.2 #4)."""
        self._require_open()
        await self._flush(session)
        session_id = session.id

        async def core() -> None:
            state = self._states.get(session_id)
            if state is None:
                raise SessionPersistenceError(f'session "{session_id}" is not registered for persistence')
            if state.materialized:
                return
            materialize = getattr(self._backend, "materialize_header", None)
            if materialize is None:
                raise UnsupportedOperationError("session persistence backend cannot materialize an empty session")
            with anyio.CancelScope(shield=True):
                await materialize(state.storage)
                state.materialized = True

        await self._serialized(session_id, core)

    async def append(self, session_id: str, events: Sequence[SessionEvent | Mapping[str, Any]]) -> None:
        """Durably persist one contiguous batch; returns only once the backend made it durable (§1.2 #5)."""
        self._require_open()
        batch = self._snapshot_batch(events)

        async def core() -> None:
            if not batch:
                return
            state = self._states.get(session_id)
            if state is None:
                await self._cold_commit(session_id)
                state = self._states[session_id]
            await self._append_core(session_id, state, batch)

        await self._serialized(session_id, core)

    async def load(self, session_id: str) -> SessionInspection:
        """A balanced view of the session; commits cold crash repair (§1.2 #6, §5)."""
        self._require_open()
        await anyio.lowlevel.checkpoint_if_cancelled()
        await self._wait_retirement(session_id)
        session = self._live_session(session_id)
        if session is not None:
            return await self._load_live(session)
        self._reservations[session_id] = self._reservations.get(session_id, 0) + 1
        try:
            inspection = await self._serialized(session_id, lambda: self._cold_commit(session_id))
        finally:
            left = self._reservations[session_id] - 1
            if left:
                self._reservations[session_id] = left
            else:
                del self._reservations[session_id]
        return inspection

    async def inspect(self, session_id: str) -> SessionInspection:
        """A logical view that never writes: cold logs get in-memory closers, a live session its own events."""
        self._require_open()
        await anyio.lowlevel.checkpoint_if_cancelled()
        await self._wait_retirement(session_id)
        session = self._live_session(session_id)
        if session is not None:
            return self._live_view(session)
        prepared = await self._serialized(session_id, lambda: self._prepare(session_id))
        session = self._live_session(session_id)
        if session is not None:
            # Published while we read: the live Session wins.
            return self._live_view(session)
        return prepared.inspection

    async def read_from(self, session_id: str, from_seq: int) -> SessionEventSuffix:
        """The stored events with ``seq >= from_seq`` (storage only: no closers, no repair, no live events)."""
        self._require_open()
        offset = _check_offset(from_seq)
        await anyio.lowlevel.checkpoint_if_cancelled()
        await self._wait_retirement(session_id)
        return await self._serialized(session_id, lambda: self._read_from_core(session_id, offset))

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
        """Durably cut a live, owned session's log to ``length`` events (turn-tail deletion, §1.2 #13).

        Only after this returns may the caller cut the in-memory Session (``session.truncate(length)``). No events
        may be appended to the session while this runs.
        """
        self._require_open()
        _check_offset(length)
        session_id = session.id
        not_owned = f'session "{session_id}" is not owned by this persistence coordinator'
        if session not in self._live:
            raise SessionPersistenceError(not_owned)
        await self._flush(session)

        async def core() -> None:
            state = self._states.get(session_id)
            if state is None or state.owner is not session:
                raise SessionPersistenceError(not_owned)
            events = session.events
            if state.cursor != len(events):
                raise SessionPersistenceError(
                    f'session "{session_id}" changed while destructive deletion was preparing'
                )
            if length > len(events) or length < state.storage.inherited_event_count:
                raise ValueError(f"session truncation length {length} is outside the writable log prefix")
            rewrite = getattr(self._backend, "rewrite", None)
            if rewrite is None:
                raise UnsupportedOperationError(f"{self._name} does not support destructive session deletion")
            with anyio.CancelScope(shield=True):
                await rewrite(state.storage, list(events[:length]))
                state.cursor = length
                state.materialized = True

        await self._serialized(session_id, core)

    async def flush(self, session: Session) -> None:
        """Make everything appended to the live ``session`` so far durable (the ``session_flush`` barrier)."""
        self._require_open()
        await self._flush(session)

    # ------------------------------------------------------------------------------------------------------------
    # Cold path (§5.2)

    def _location(self, meta: SessionHeader) -> str | None:
        try:
            location = self.locate(meta)
        except Exception:
            return None
        return None if location is None else location.path

    async def _prepare(self, session_id: str) -> _Prepared:
        """Read and validate the stored log and compute its closers (no writes). Runs serialized."""
        stored = await self._backend.load_stored(session_id)
        if stored is None:
            raise SessionNotFoundError(session_id)
        return self._validate(session_id, stored)

    def _validate(self, session_id: str, stored: StoredPrefix) -> _Prepared:
        meta = stored.meta
        if meta.id != session_id:
            raise _wrap_corruption(
                session_id,
                ValueError(f'stored session identity mismatch: requested "{session_id}", header contains "{meta.id}"'),
            )
        location = self._location(meta)
        check_format_version(session_id, meta.version, location)
        events = stored.events
        try:
            _check_contiguous(events)
            validator = validate_turns(events)
        except Exception as exc:
            raise _wrap_corruption(session_id, exc) from exc
        refuse_unknown_events(session_id, events, location)
        cut = stored.inherited_event_count
        try:
            _check_cut(session_id, cut, len(events))
            header_from_builtins(header_to_builtins(meta), expected_id=session_id)
            closers = interrupted_turn_closers(events)
            # One pass: the validator that checked the stored events continues over the closers, so the
            # balanced view is proven valid without re-validating (or re-building) the whole log.
            for closer in closers:
                validator.check(closer)
        except Exception as exc:
            raise _wrap_corruption(session_id, exc) from exc
        inspection = SessionInspection(meta=meta, inherited_event_count=cut, events=(*events, *closers))
        return _Prepared(stored=stored, closers=closers, inspection=inspection)

    async def _cold_commit(self, session_id: str) -> SessionInspection:
        """Reserve + commit a cold session (§5.2 steps 1-2): repair, re-read, record ownerless state. Serialized."""
        for _ in range(MAX_COLD_ATTEMPTS):
            prepared = await self._prepare(session_id)
            state = self._states.get(session_id)
            if state is not None and state.owner is not None:
                raise SessionLiveError(f'session "{session_id}" already has a live persistence owner')
            stored = prepared.stored
            if await self._backend.read_stored_revision(session_id) != stored.revision:
                continue  # an external writer moved the log: never pair the old view with a new revision
            storage = StorageMetadata(stored.meta, stored.inherited_event_count)
            if stored.torn_marker is not None or prepared.closers:
                with anyio.CancelScope(shield=True):
                    await self._backend.commit_repair(storage, stored.torn_marker, prepared.closers)
                continue  # re-read: the committed view is what storage now holds
            if state is None:
                self._states[session_id] = _State(storage, len(stored.events), True, None)
            else:
                state.storage = storage
                state.cursor = len(stored.events)
                state.materialized = True
            return prepared.inspection
        raise SessionPersistenceError(
            f'stored session "{session_id}" kept changing while it was being loaded ({MAX_COLD_ATTEMPTS} attempts)'
        )

    async def _read_from_core(self, session_id: str, from_seq: int) -> SessionEventSuffix:
        seek = getattr(self._backend, "load_stored_from", None)
        if seek is not None:
            suffix = await seek(session_id, from_seq)
            if suffix is None:
                raise SessionNotFoundError(session_id)
            meta, cut, events = suffix.meta, suffix.inherited_event_count, list(suffix.events)
            checked: Sequence[SessionEvent] = events
            if events:
                _check_contiguous(events, events[0].seq)
                if events[0].seq != from_seq:
                    raise SessionPersistenceCorruptionError(
                        f'stored session "{session_id}" suffix starts at seq {events[0].seq}, expected {from_seq}'
                    )
        else:
            stored = await self._backend.load_stored(session_id)
            if stored is None:
                raise SessionNotFoundError(session_id)
            meta, cut = stored.meta, stored.inherited_event_count
            _check_contiguous(stored.events)
            events = stored.events[from_seq:]
            checked = stored.events
        if meta.id != session_id:
            raise SessionPersistenceCorruptionError(
                f'stored session identity mismatch: requested "{session_id}", header contains "{meta.id}"'
            )
        location = self._location(meta)
        check_format_version(session_id, meta.version, location)
        refuse_unknown_events(session_id, checked, location)
        return SessionEventSuffix(meta=meta, inherited_event_count=cut, from_seq=from_seq, events=tuple(events))

    # ------------------------------------------------------------------------------------------------------------
    # Append core

    @staticmethod
    def _snapshot_batch(events: Sequence[SessionEvent | Mapping[str, Any]]) -> builtins.list[SessionEvent]:
        """Copy the batch through the lossless JSON boundary now, so later caller mutations are invisible."""
        message = (
            "session event batch is not losslessly JSON-serializable because it contains non-JSON-serializable data"
        )
        plain: builtins.list[object] = []
        try:
            for event in list(events):
                if isinstance(event, Mapping):
                    plain.append(snapshot_json(dict(event), "session event"))
                else:
                    data = getattr(event, "data", None)
                    if type(data) in (dict, list):
                        # Opaque payloads are plain containers: check them before msgspec would coerce them.
                        snapshot_json(data, f'session event "{event.type}"')
                    plain.append(snapshot_json(event_to_builtins(event), f'session event "{event.type}"'))
        except (NotLosslessJsonError, TypeError) as exc:
            raise TypeError(f"{message}: {exc}") from exc
        return [decode_event(obj) for obj in plain]

    async def _append_core(self, session_id: str, state: _State, batch: Sequence[SessionEvent]) -> None:
        """Contiguity, inherited-prefix gate, then one durable ``append_batch``. Runs serialized."""
        cursor = state.cursor
        for index, event in enumerate(batch):
            if event.seq != cursor + index:
                raise SeqMismatchError(
                    f'append seq mismatch for "{session_id}": expected {cursor + index} at index {index}, '
                    f"got {event.seq}"
                )
        if not state.materialized and cursor + len(batch) < state.storage.inherited_event_count:
            raise IncompleteInheritedPrefixError(
                f'session "{session_id}" cannot materialize before its inherited prefix is complete'
            )
        with anyio.CancelScope(shield=True):
            await self._backend.append_batch(state.storage, batch, state.materialized)
            state.materialized = True
            state.cursor = cursor + len(batch)

    # ------------------------------------------------------------------------------------------------------------
    # Live path (§5.3)

    def _live_session(self, session_id: str) -> Session | None:
        store = self._host.sessions
        return None if store is None else store.get(session_id)

    @staticmethod
    def _live_view(session: Session) -> SessionInspection:
        return SessionInspection(
            meta=session.header, inherited_event_count=session.inherited_event_count, events=session.events
        )

    async def _load_live(self, session: Session) -> SessionInspection:
        session_id = session.id
        snapshot = session.events
        await self._flush(session)
        state = self._states.get(session_id)
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

    async def _wait_retirement(self, session_id: str) -> None:
        record = self._retirements.get(session_id)
        if record is not None:
            await record.done.wait()

    def _on_created(self, session: Session) -> None:
        if self._reservations.get(session.id):
            raise SessionReservedError(
                f'cannot publish session "{session.id}": persisted state already owns this identity'
            )
        self._ensure_live(session)

    def _ensure_live(self, session: Session) -> _Live:
        """Get or create the Session's controller and start its initialization (idempotent per Session)."""
        live = self._live.get(session)
        if live is not None:
            return live
        if not self._running:
            raise SessionPersistenceError(f"{self._name} persistence coordinator is not running")
        assert self._scheduler is not None
        session_id = session.id

        async def write(batch: builtins.list[SessionEvent]) -> None:
            await live_entry.init.wait()
            await self._serialized(session_id, lambda: self._write_live(session, batch))

        def report(error: BaseException) -> None:
            _logger.warning(
                '%s: background write for session "%s" failed (buffered events retained): %s',
                self._name,
                session_id,
                error,
            )

        controller: WriteBehindController[SessionEvent] = WriteBehindController(
            write=write,
            report_background_failure=report,
            scheduler=self._scheduler,
            spawn=self._spawn,
            max_delay_ms=self._delay_ms,
        )
        live_entry = _Live(init=_Outcome(), writes=controller)
        self._live[session] = live_entry
        # The seed is what the Session holds now; later events reach the controller through session_event.
        seed = session.events
        ticket = self._take_ticket(session_id)

        async def run_init() -> None:
            try:
                await self._serialized(session_id, lambda: self._init(session, seed), ticket)
            except Exception as exc:
                live_entry.init.settle(exc)
            except BaseException:
                live_entry.init.settle(SessionPersistenceError(f'session "{session_id}" initialization was cancelled'))
                raise
            else:
                live_entry.init.settle()

        try:
            self._spawn(run_init)
        except BaseException:
            self._release(session_id, ticket)
            del self._live[session]
            raise
        return live_entry

    async def _init(self, session: Session, seed: tuple[SessionEvent, ...]) -> None:
        """Initialization cases 1-4 of §5.3. Runs serialized."""
        session_id = session.id
        header = session.header
        cut = session.inherited_event_count
        state = self._states.get(session_id)
        if state is not None and state.owner is session:
            return
        if state is not None and state.owner is not None:
            other = self._live.get(state.owner)
            if state.materialized or (other is not None and other.writes.has_work):
                raise SessionIdCollisionError(
                    f'session "{session_id}" is already bound to a different live session in this backend '
                    "(id collision)"
                )
            del self._states[session_id]  # an abandoned lazy id is reclaimable
            state = None
        if state is not None:
            # Case 2: claim ownerless state (from create, load or a storage-only append).
            self._check_identity(session_id, state.storage, header, cut)
            if state.cursor > 0:
                stored = await self._backend.load_stored(session_id)
                if stored is None or not _same_events(stored.events[: state.cursor], seed[: state.cursor]):
                    raise SessionIdCollisionError(
                        f'session "{session_id}" is already persisted with {state.cursor} event(s) that do not '
                        "match this live session (id collision)"
                    )
            state.owner = session
            if len(seed) > state.cursor:
                await self._append_core(session_id, state, seed[state.cursor :])
            return
        stored = await self._backend.load_stored(session_id)
        if stored is not None:
            # Case 3: hot-reload adoption of a stored log by the Session that wrote it.
            if stored.meta.id != session_id:
                raise _wrap_corruption(
                    session_id,
                    ValueError(
                        f'stored session identity mismatch: requested "{session_id}", header contains '
                        f'"{stored.meta.id}"'
                    ),
                )
            storage = StorageMetadata(stored.meta, stored.inherited_event_count)
            self._check_identity(session_id, storage, header, cut)
            location = self._location(stored.meta)
            check_format_version(session_id, stored.meta.version, location)
            refuse_unknown_events(session_id, stored.events, location)
            if len(stored.events) > len(seed) or not _same_events(stored.events, seed[: len(stored.events)]):
                raise SessionIdCollisionError(
                    f'session "{session_id}" already has a persisted log on disk that does not match this live '
                    "session (id collision)"
                )
            state = _State(storage, len(stored.events), True, session)
            if stored.torn_marker is not None:
                # Truncate only: a live turn is never closed by repair.
                with anyio.CancelScope(shield=True):
                    await self._backend.commit_repair(storage, stored.torn_marker, [])
                    self._states[session_id] = state
            else:
                self._states[session_id] = state
        else:
            # Case 4: a new session.
            state = _State(StorageMetadata(header, cut), 0, False, session)
            self._states[session_id] = state
        if len(seed) > state.cursor:
            await self._append_core(session_id, state, seed[state.cursor :])

    @staticmethod
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

    async def _write_live(self, session: Session, batch: builtins.list[SessionEvent]) -> None:
        """The write-behind sink (§3.4): skip what initialization already wrote, then append. Runs serialized."""
        session_id = session.id
        state = self._states.get(session_id)
        if state is None or state.owner is not session:
            raise SessionIdCollisionError(
                f'session "{session_id}" is already bound to a different live session in this backend (id collision)'
            )
        fresh = [event for event in batch if event.seq >= state.cursor]
        if fresh:
            await self._append_core(session_id, state, fresh)

    async def _flush(self, session: Session) -> None:
        """Coordinator flush (§3.4): init first, then the controller's quiescence barrier."""
        live = self._live.get(session)
        if live is None:
            store = self._host.sessions
            if store is None or not store.is_live(session):
                raise SessionPersistenceError(f'session "{session.id}" is not registered for persistence')
            live = self._ensure_live(session)
        live.writes.cancel_automatic_wait()
        try:
            await live.init.wait()
        except BaseException:
            live.writes.cancel_automatic_wait()
            raise
        await live.writes.flush()

    # ------------------------------------------------------------------------------------------------------------
    # Retirement (§5.5)

    def _on_disposed(self, session: Session) -> None:
        if session not in self._live:
            return
        record = _Outcome()
        self._retirements[session.id] = record

        async def retire() -> None:
            try:
                await self._retire(session)
            except Exception as exc:
                _logger.warning('%s: session "%s" retirement failed: %s', self._name, session.id, exc)
            finally:
                if self._retirements.get(session.id) is record:
                    del self._retirements[session.id]
                record.settle()

        try:
            self._spawn(retire)
        except BaseException:
            del self._retirements[session.id]
            record.settle()
            raise

    async def _retire(self, session: Session) -> None:
        await self._flush(session)
        session_id = session.id

        async def core() -> None:
            self._live.pop(session, None)
            state = self._states.get(session_id)
            if state is not None and state.owner is session:
                del self._states[session_id]

        await self._serialized(session_id, core)

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
            self, limit=limit, cursor=cursor, order=order, cwd=cwd, parent=parent, since=since
        )

    async def delete(self, session_id: str, *, expected_revision: str | None = None) -> None:
        """Durably delete a stored session; refused for a live one (``SessionLiveError``), unknown ids raise
        ``SessionNotFoundError``, a revision other than ``expected_revision`` raises ``SessionChangedError``."""
        await _lifecycle.delete(self, session_id, expected_revision)

    async def compact(self, session_id: str) -> _lifecycle.CompactResult:
        """Rewrite a closed, cold session's log as one batch, atomically and under a revision check."""
        return await _lifecycle.compact(self, session_id)

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
            self, older_than=older_than, keep_last=keep_last, dry_run=dry_run, now=now, progress=progress
        )
