"""The persistence coordinator: the ``SessionPersistence`` service over a small backend.

A backend implements durable primitives only; the coordinator owns what every backend would otherwise get
wrong. It is built from parts, each a module readable on its own:

* :mod:`._fifo`: the per-id FIFO chain (one storage operation per id at a time, in call order);
* :mod:`._cold_path`: cold reads, crash repair with a revision check, the storage-only suffix read;
* :mod:`._live_path`: live Sessions: initialization (claim, adoption, new), write-behind writes, the flush;
* :mod:`._retirement`: disposal of live Sessions and the quiescent teardown;
* :mod:`._durable` and :mod:`._in_doubt`: every mutating primitive, shielded, under the writer lease
  (:mod:`._lease_table`), with a failed write settled by reading the stored state back;
* :mod:`._stored_log`: the one validation of a stored log that every reader uses;
* :mod:`._capabilities`: the backend's optional primitives, resolved once here.

It plugs into the :class:`~dsh.session_persistence.Host` through the four session lifecycle hooks, which it
registers when it starts (``async with PersistenceCoordinator(host, backend) as persistence:``) and unregisters
first thing on close. Background work (write-behind timers and writes, initialization, retirement) runs in a
task group the coordinator owns, so a caller that is cancelled abandons only its own wait.

Not implemented yet: the preparation cache, ``prepare`` and ``borrow_session``.
"""

from __future__ import annotations

import builtins
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import AsyncExitStack
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
from anyio.abc import TaskGroup

from . import _lifecycle
from ._backend import RawArtifact, SessionBackend, SessionLocation, SessionSnapshot, StorageMetadata
from ._cold_path import cold_commit, iter_from, prepare, read_from
from ._coordinator_state import CoordinatorCore, SessionState
from ._durable import append, materialize, rewrite
from ._errors import (
    SessionAlreadyExistsError,
    SessionPersistenceError,
    UnsupportedOperationError,
)
from ._event_codec import decode_event, event_to_builtins
from ._events import SessionEvent
from ._header import SessionHeader, check_header_cwd, header_to_builtins
from ._host import Host, hookimpl
from ._json import NotLosslessJsonError, is_safe_int, snapshot_json
from ._listing import SessionPage
from ._live_path import LivePath, live_view
from ._retirement import Retirement
from ._scheduling import Scheduler, TaskGroupScheduler
from ._session import Session
from ._views import SessionEventSuffix, SessionInspection
from ._write_behind import DEFAULT_MAX_DELAY_MS, MAX_DELAY_MS_LIMIT

if sys.version_info < (3, 11):  # pragma: no cover - exercised on 3.10 only
    from exceptiongroup import ExceptionGroup

__all__ = ["PersistenceCoordinator"]

_logger = logging.getLogger("dsh.session_persistence")

_LOSSY_BATCH = "session event batch is not losslessly JSON-serializable because it contains non-JSON-serializable data"


class _Hooks:
    """The host plugin: the coordinator's session lifecycle hook implementations."""

    def __init__(self, owner: PersistenceCoordinator) -> None:
        self._owner = owner

    @hookimpl
    def session_created(self, session: Session) -> None:
        self._owner._livepath.on_created(session)

    @hookimpl
    def session_event(self, session: Session, event: SessionEvent) -> None:
        self._owner._livepath.ensure_live(session).writes.enqueue(event)

    @hookimpl
    def session_flush(self, session: Session) -> Awaitable[None]:
        return self._owner._livepath.flush(session)

    @hookimpl
    def session_disposed(self, session: Session) -> None:
        self._owner._retirement.on_disposed(session)


def _check_offset(value: object) -> int:
    if not is_safe_int(value) or value < 0:  # type: ignore[operator]
        raise TypeError(f"SessionLogOffset must be a non-negative safe integer, got {value!r}")
    return value  # type: ignore[return-value]


def _snapshot_batch(events: Sequence[SessionEvent | Mapping[str, Any]]) -> builtins.list[SessionEvent]:
    """Copy the batch through the lossless JSON boundary now, so later caller mutations are invisible."""
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
    except NotLosslessJsonError as exc:
        # The same typed error the live path raises (it names the offending value's path).
        raise NotLosslessJsonError(f"{_LOSSY_BATCH}: {exc.what}", exc.reason, exc.path) from exc
    except TypeError as exc:
        raise TypeError(f"{_LOSSY_BATCH}: {exc}") from exc
    return [decode_event(obj) for obj in plain]


class PersistenceCoordinator:
    """The session persistence service: durable, serialized, validated storage of live and cold sessions.

    :param host: the plugin host; its ``sessions`` store (if any) tells which ids are live.
    :param backend: the storage primitives (:class:`~dsh.session_persistence.backend.SessionBackend`); its
        optional primitives are resolved once, here.
    :param write_batch_max_delay_ms: the write-behind window, an integer in ``1..2147483647`` (default 200).
    :param prepared_session_cache_size: validated for forward compatibility (the cache is not implemented yet).
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
        self._core = core = CoordinatorCore(host, backend)
        self._livepath = LivePath(core, self._spawn, write_batch_max_delay_ms)
        self._livepath.scheduler = scheduler
        self._retirement = Retirement(core, self._livepath, self._spawn)
        self._hooks = _Hooks(self)
        self._stack: AsyncExitStack | None = None
        self._tg: TaskGroup | None = None
        self._closed = False
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
        if self._livepath.running or self._closed:
            raise RuntimeError("a PersistenceCoordinator can be started only once")
        stack = AsyncExitStack()
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        if self._livepath.scheduler is None:
            self._livepath.scheduler = TaskGroupScheduler(self._spawn)
        self._host.register(self._hooks, name=f"dsh-session-persistence-{id(self):x}")
        self._livepath.running = True
        store = self._host.sessions
        if store is not None:
            for session in store.list():
                self._livepath.ensure_live(session)

    async def aclose(self) -> None:
        """Stop admission, drain every controller and chain, release the writer leases, close the backend.

        Raises ``ExceptionGroup("<backend> dispose failed", errors)`` if a final flush failed; the backend is
        closed in every case (its own close error is raised only when the drain succeeded).
        """
        if self._closed:
            return
        self._closed = True
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
                await self._core.leases.release_all()
                close = self._core.caps.aclose
                if close is not None:
                    await close()
            except Exception as exc:
                close_error = exc
        if errors:
            raise ExceptionGroup(f"{self.name} dispose failed", errors)
        if close_error is not None:
            raise close_error

    def _require_open(self) -> None:
        if self._closed:
            raise SessionPersistenceError(f"{self.name} persistence coordinator is closed")

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

    async def _take_writer_lease(self, meta: SessionHeader) -> None:
        """Hold ``meta.id``'s writer lease until this coordinator closes (the CLI's ``repair`` is a writer even
        when nothing needs repair). Raises ``SessionLockedError`` while another writer holds it."""
        core = self._core
        await core.chains.run(meta.id, lambda: core.leases.acquire(meta))

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
        await anyio.lowlevel.checkpoint_if_cancelled()
        read_raw = self._core.caps.read_raw
        if read_raw is None:
            raise UnsupportedOperationError("this session persistence backend does not expose raw artifacts")
        await self._retirement.wait(session_id)
        return await read_raw(session_id)

    async def create(self, meta: SessionHeader | Mapping[str, Any], inherited_event_count: int | None = None) -> None:
        """Register a session lazily: nothing is written until its first append."""
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
        if "cwd" in data:
            check_header_cwd(data["cwd"])  # the live path's rule and message (a relative cwd is never listable)
        try:
            header = meta if isinstance(meta, SessionHeader) else msgspec.convert(data, SessionHeader)
        except msgspec.ValidationError as exc:
            raise TypeError(f"session metadata is not a session header: {exc}") from exc
        session_id = header.id
        storage = StorageMetadata(header, cut)
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
            await materialize(core, session_id, state)

        await core.chains.run(session_id, run)

    async def append(self, session_id: str, events: Sequence[SessionEvent | Mapping[str, Any]]) -> None:
        """Durably persist one contiguous batch; returns only once the backend made it durable."""
        self._require_open()
        batch = _snapshot_batch(events)
        core = self._core

        async def run() -> None:
            if not batch:
                return
            state = core.states.get(session_id)
            if state is None or (state.owner is None and state.materialized and not core.leases.holds(session_id)):
                # Adopt the stored log (committing any pending crash repair) under the writer lease.
                await cold_commit(core, session_id, for_write=True)
                state = core.states[session_id]
            await append(core, session_id, state, batch)

        await core.chains.run(session_id, run)

    async def load(self, session_id: str) -> SessionInspection:
        """A balanced view of the session; commits cold crash repair (under the writer lease)."""
        self._require_open()
        await anyio.lowlevel.checkpoint_if_cancelled()
        await self._retirement.wait(session_id)
        core = self._core
        session = core.live_session(session_id)
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
        await anyio.lowlevel.checkpoint_if_cancelled()
        await self._retirement.wait(session_id)
        core = self._core
        session = core.live_session(session_id)
        if session is not None:
            return live_view(session)
        prepared = await core.chains.run(session_id, lambda: prepare(core, session_id))
        session = core.live_session(session_id)
        if session is not None:
            # Published while we read: the live Session wins.
            return live_view(session)
        return prepared.inspection

    async def read_from(self, session_id: str, from_seq: int) -> SessionEventSuffix:
        """The stored events with ``seq >= from_seq`` (storage only: no closers, no repair, no live events)."""
        self._require_open()
        offset = _check_offset(from_seq)
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
        offset = _check_offset(from_seq)
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
        _check_offset(length)
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
            await rewrite(core, session_id, state, events, events[:length])

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
            self, limit=limit, cursor=cursor, order=order, cwd=cwd, parent=parent, since=since
        )

    async def delete(self, session_id: str, *, expected_revision: str | None = None) -> None:
        """Durably delete a stored session; refused for a live one (``SessionLiveError``) or one whose writer
        lease another writer holds (``SessionLockedError``); unknown ids raise ``SessionNotFoundError``."""
        await _lifecycle.delete(self, session_id, expected_revision)

    async def compact(self, session_id: str) -> _lifecycle.CompactResult:
        """Rewrite a closed, cold session's log as one batch, atomically, under its writer lease."""
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


def coordinators_of(host: Host) -> builtins.list[PersistenceCoordinator]:
    """The open coordinators registered in ``host`` (in registration order)."""
    return [
        p._owner
        for p in host.get_plugins()
        if isinstance(p, _Hooks) and p._owner._livepath.running and not p._owner._closed
    ]
