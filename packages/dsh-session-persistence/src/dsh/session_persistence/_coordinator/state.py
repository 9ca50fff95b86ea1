"""What the coordinator keeps per session id and shares between its parts (FIFO chain, cold path, live path,
retirement, durable writes): the durable bookkeeping of each id, the backend with its resolved primitives
(:class:`Capabilities`) and the writer leases it holds (:class:`LeaseTable`).

Leases: the coordinator takes a session's lease before its first write or adoption (and before a cold load
commits repair or a rewrite runs) and keeps it until the session is disposed or the coordinator closes, so a
second writer, in this process or another, is refused with :class:`SessionLockedError` before it writes
anything. A backend without the lease primitive (see
:class:`~dsh.session_persistence.backend.SupportsWriterLease`) keeps the 0.1 behaviour: every lease call is then
a no-op and only the backend's own checks stop a second writer.

Both live here, not in modules of their own, so the core object sits few layers above the model (the import
graph's depth is measured by ``tools/import-graph``). For the same reason the core reaches the host and the durable
writes through two small protocols (:class:`SessionHost`, :class:`Writes`): it imports neither ``_host`` nor
``durable``, and the cold path, the live path and ``durable`` all sit one layer over it, side by side.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard

import anyio

from .._backends.protocol import (
    RawArtifact,
    SessionBackend,
    SessionLocation,
    StorageMetadata,
    StoredSuffix,
    SupportsAclose,
    SupportsLocate,
    SupportsMaterializeHeader,
    SupportsRawArtifacts,
    SupportsRewrite,
    SupportsSeek,
    SupportsStreamingRead,
    SupportsSubmitAppend,
    SupportsWriterLease,
    WriterLease,
)
from .._model.errors import SessionPersistenceError, SessionStorageError
from .._model.events import SessionEvent
from .._model.header import SessionHeader
from .fifo import FifoChains
from .preparations import PreparationCache
from .waits import CompletionPort

__all__ = [
    "Capabilities",
    "CoordinatorCore",
    "LeaseTable",
    "LiveSessions",
    "Outcome",
    "PendingWrite",
    "SessionHost",
    "SessionState",
    "Writes",
    "is_refusal",
    "succeeded",
]

_logger = logging.getLogger("dsh.session_persistence")


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The optional primitives of one backend (``None`` where it has none), resolved once when the coordinator
    is built: each is a ``runtime_checkable`` protocol of :mod:`.._backends.protocol`, and keeping the bound
    methods spares a ``getattr`` probe per call."""

    seek: Callable[[str, int], Awaitable[StoredSuffix | None]] | None
    stream: Callable[[str, int], AsyncIterator[StoredSuffix]] | None
    materialize_header: Callable[[StorageMetadata], Awaitable[None]] | None
    rewrite: Callable[[StorageMetadata, Sequence[SessionEvent]], Awaitable[None]] | None
    locate: Callable[[SessionHeader], SessionLocation | None] | None
    read_raw: Callable[[str], Awaitable[RawArtifact | None]] | None
    aclose: Callable[[], Awaitable[None]] | None
    acquire_writer_lease: Callable[[SessionHeader], Awaitable[WriterLease]] | None
    #: ``append_batch`` started without an await, its end reported through a callback (the live commit path).
    submit_append: Callable[..., None] | None = None

    @classmethod
    def of(cls, backend: SessionBackend) -> Capabilities:
        """Resolve every optional primitive of ``backend`` now."""
        raw = backend.read_raw if isinstance(backend, SupportsRawArtifacts) and backend.supports_raw_artifacts else None
        return cls(
            seek=backend.load_stored_from if isinstance(backend, SupportsSeek) else None,
            stream=backend.iter_stored if isinstance(backend, SupportsStreamingRead) else None,
            materialize_header=backend.materialize_header if isinstance(backend, SupportsMaterializeHeader) else None,
            rewrite=backend.rewrite if isinstance(backend, SupportsRewrite) else None,
            locate=backend.locate if isinstance(backend, SupportsLocate) else None,
            read_raw=raw,
            aclose=backend.aclose if isinstance(backend, SupportsAclose) else None,
            acquire_writer_lease=(backend.acquire_writer_lease if isinstance(backend, SupportsWriterLease) else None),
            submit_append=backend.submit_append_batch if _submits_its_own_append(backend) else None,
        )


def _submits_its_own_append(backend: SessionBackend) -> TypeGuard[SupportsSubmitAppend]:
    """Whether ``backend``'s ``submit_append_batch`` is the same append as its ``append_batch``.

    A subclass or wrapper that changes ``append_batch`` (a fault injector, a metrics layer) but not the submit
    primitive must not be bypassed by the live commit: the submit counts only where the class that defines it is the
    one that defines ``append_batch``, or a subclass of it (not an attribute forwarded by ``__getattr__``).
    """
    if not isinstance(backend, SupportsSubmitAppend):
        return False
    mro = type(backend).__mro__
    submitter = next((cls for cls in mro if "submit_append_batch" in vars(cls)), None)
    appender = next((cls for cls in mro if "append_batch" in vars(cls)), None)
    return submitter is not None and appender is not None and issubclass(submitter, appender)


Acquire = Callable[[SessionHeader], Awaitable[WriterLease]]


class LeaseTable:
    """Leases held by one coordinator, keyed by session id."""

    def __init__(self, acquire: Acquire | None) -> None:
        self._acquire = acquire
        self.held: dict[str, WriterLease] = {}

    @property
    def supported(self) -> bool:
        """Whether the backend has a lease primitive at all."""
        return self._acquire is not None

    def holds(self, session_id: str) -> bool:
        """Whether this coordinator holds ``session_id``'s lease (always true without a lease primitive)."""
        return self._acquire is None or session_id in self.held

    async def acquire(self, meta: SessionHeader) -> bool:
        """Take the lease of ``meta.id`` unless already held; ``True`` when it was taken just now.

        Raises :class:`~dsh.session_persistence.SessionLockedError` when another writer holds it.
        """
        if self.holds(meta.id):
            return False
        assert self._acquire is not None
        with anyio.CancelScope(shield=True):
            # Shielded: a lease taken by a cancelled caller must still be recorded, or nobody would release it.
            self.held[meta.id] = await self._acquire(meta)
        return True

    async def release(self, session_id: str) -> None:
        """Give the lease of ``session_id`` back (no-op when not held). A failed release is logged, not raised:
        the lease is then released when the process exits."""
        lease = self.held.pop(session_id, None)
        if lease is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await lease.release()
            except Exception as exc:
                _logger.warning('writer lease of session "%s" could not be released: %s', session_id, exc)

    async def release_all(self) -> None:
        """Release every lease still held (coordinator teardown)."""
        for session_id in list(self.held):
            await self.release(session_id)


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """A mutating primitive that failed after it may have reached storage: what it was meant to leave there.

    ``start`` is the stored length before the write. An append (or a header materialization, ``events == ()``)
    meant to add ``events`` at ``start``; a rewrite (``replaced``) meant to replace the ``start`` stored events
    with ``events``. ``materializing`` says the write also created the artifact (header and cut).
    """

    action: str
    start: int
    events: tuple[SessionEvent, ...]
    materializing: bool
    replaced: bool = False


@dataclass(eq=False)
class SessionState:
    """Durable bookkeeping of one id: what durable writes use, and who owns it.

    ``cursor`` is the stored length (the next seq). ``doubt`` is a write whose outcome is still unknown: no
    other write runs before a read-back settles it. ``settled`` is the last batch a read-back acknowledged, so
    a caller retrying exactly that batch is acknowledged instead of refused. ``running`` is set while a durable
    write runs (its caller may have left at its deadline): the next write waits for it first.
    """

    storage: StorageMetadata
    cursor: int
    materialized: bool
    #: The live ``Session`` writing this id (compared by identity only), ``None`` while ownerless.
    owner: object | None
    doubt: PendingWrite | None = None
    settled: tuple[SessionEvent, ...] = field(default=())
    running: anyio.Event | None = None


class Outcome:
    """A one-shot result shared by several waiters (initialization, retirement).

    Its event is made only when someone waits before it is settled, and dropped once it is: a live session keeps its
    initialization's outcome for its whole life, and at 1,000 sessions an event each (three tracked objects) is
    oldest-generation weight every full collection traverses.
    """

    __slots__ = ("_event", "_settled", "error")

    def __init__(self) -> None:
        self._event: anyio.Event | None = None
        self._settled = False
        self.error: BaseException | None = None

    def settle(self, error: BaseException | None = None) -> None:
        self.error = error
        self._settled = True
        event, self._event = self._event, None
        if event is not None:
            event.set()

    def is_set(self) -> bool:
        """Whether :meth:`settle` has been called (whatever its error)."""
        return self._settled

    async def wait_settled(self) -> None:
        """Return once settled, without raising its error (a checkpoint even when already settled, as an event's
        ``wait`` is)."""
        if self._settled:
            await anyio.lowlevel.checkpoint()
            return
        event = self._event
        if event is None:
            event = self._event = anyio.Event()
        await event.wait()

    async def wait(self) -> None:
        await self.wait_settled()
        if self.error is not None:
            raise self.error

    def settled(self) -> bool:
        """``True`` if already settled (raising its error, as :meth:`wait` would), ``False`` if still pending.

        For the per-commit paths: waiting on an event that is already set still yields to the event loop once,
        and a durable write waits on its session's initialization at least twice.
        """
        if not self._settled:
            return False
        if self.error is not None:
            raise self.error
        return True


class LiveSessions(Protocol):
    """The host's live-session store, as the coordinator's parts ask it (``_host.session.SessionStore``)."""

    def get(self, session_id: str, /) -> object | None: ...

    def is_live(self, session: Any, /) -> bool: ...


class SessionHost(Protocol):
    """What the core object needs of the plugin host (``_host.host.Host``): its live sessions, when it has a store.

    A protocol, so the core sits below the host's modules; the service, which registers hooks, holds the host itself.
    """

    @property
    def sessions(self) -> LiveSessions | None: ...


class Writes(Protocol):
    """The coordinator's durable writes (:class:`.durable.DurableWrites`), reached as ``core.writes``.

    Typed here, so the cold and live paths call them through the one core object and sit beside ``durable``.
    Each runs serialized on the session's FIFO chain; settlement of an in-doubt write runs once per write.
    """

    async def settle_doubt(self, session_id: str, state: SessionState) -> None: ...

    async def settle_failed(
        self, session_id: str, state: SessionState, pending: PendingWrite, exc: Exception
    ) -> None: ...

    async def append(self, session_id: str, state: SessionState, batch: Sequence[SessionEvent]) -> None: ...

    async def append_settled(
        self, session_id: str, state: SessionState, batch: Sequence[SessionEvent], *, own_task: bool = False
    ) -> None: ...

    async def materialize(self, session_id: str, state: SessionState) -> None: ...

    async def rewrite(
        self, session_id: str, state: SessionState, expected: Sequence[SessionEvent], events: Sequence[SessionEvent]
    ) -> None: ...

    async def repair(
        self, session_id: str, storage: StorageMetadata, marker: object | None, closers: Sequence[SessionEvent]
    ) -> None: ...


def _prepared_size(prepared: Any) -> int:
    return len(prepared.inspection.events)


class CoordinatorCore:
    """The state every part of the coordinator reads and updates (one instance per coordinator)."""

    def __init__(
        self,
        host: SessionHost,
        backend: SessionBackend,
        writes: Callable[[CoordinatorCore], Writes],
        prepared_sessions: int = 5,
    ) -> None:
        self.host = host
        self.backend = backend
        self.caps = Capabilities.of(backend)
        self.name: str = getattr(backend, "NAME", None) or type(backend).__name__
        self.states: dict[str, SessionState] = {}
        self.chains = FifoChains()
        # In-flight cold loads: they will commit state for the id, so publication of a Session is vetoed.
        self.reservations: dict[str, int] = {}
        self.retirements: dict[str, Outcome] = {}
        self.leases = LeaseTable(self.caps.acquire_writer_lease)
        self.closed = False
        # Cold reads kept for a resume right after a preview (values: cold_path.Prepared).
        self.preparations: PreparationCache[Any] = PreparationCache(prepared_sessions, _prepared_size)
        #: Starts a task in the coordinator's task group (set once it runs): durable writes outlive their callers.
        self.spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], object] | None = None
        #: Durable writes still running (a caller left at its deadline): the coordinator closes after them.
        self.running_writes: set[anyio.Event] = set()
        #: The running loop's completion port (set once the coordinator runs): backend threads report through it.
        self.port: CompletionPort | None = None
        #: The durable writes, built last: they read the core's backend, capabilities and leases.
        self.writes = writes(self)

    def require_open(self) -> None:
        """Refuse work once the coordinator has closed."""
        if self.closed:
            raise SessionPersistenceError(f"{self.name} persistence coordinator is closed")

    async def wait_retired(self, session_id: str) -> None:
        """Wait for a pending retirement of ``session_id`` (readers must not race its final drain)."""
        record = self.retirements.get(session_id)
        if record is not None:
            await record.wait_settled()

    async def hold_writer_lease(self, meta: SessionHeader) -> None:
        """Hold ``meta.id``'s writer lease until the coordinator closes (the CLI's ``repair`` is a writer even
        when nothing needs repair). Raises ``SessionLockedError`` while another writer holds it."""
        await self.chains.run(meta.id, lambda: self.leases.acquire(meta))

    def location(self, meta: SessionHeader) -> str | None:
        """The artifact path of ``meta`` for error messages (``None`` without one, or if ``locate`` fails)."""
        locate = self.caps.locate
        if locate is None:
            return None
        try:
            location = locate(meta)
        except Exception:
            return None
        return None if location is None else location.path

    def live_session(self, session_id: str) -> object | None:
        """The host's live Session with this id, if any."""
        store = self.host.sessions
        return None if store is None else store.get(session_id)


def is_refusal(exc: BaseException) -> bool:
    """Whether a primitive refused before writing (a persistence error other than a storage failure, or bad
    input): nothing reached storage, so there is nothing to read back."""
    if isinstance(exc, SessionStorageError):
        return False
    return isinstance(exc, (SessionPersistenceError, TypeError, ValueError))


def succeeded(state: SessionState, pending: PendingWrite) -> None:
    """Record that ``pending``'s primitive returned: durable, nothing in doubt."""
    state.doubt = None
    state.settled = ()
    state.materialized = True
    state.cursor = len(pending.events) if pending.replaced else pending.start + len(pending.events)
