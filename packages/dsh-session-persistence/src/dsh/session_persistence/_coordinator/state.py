"""What the coordinator keeps per session id and shares between its parts (FIFO chain, cold path, live path,
retirement, durable writes): the durable bookkeeping of each id and the backend with its resolved primitives.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import anyio

from .._backends.capabilities import Capabilities
from .._backends.protocol import SessionBackend, StorageMetadata
from .._host.host import Host
from .._host.session import Session
from .._model.errors import SessionPersistenceError
from .._model.events import SessionEvent
from .._model.header import SessionHeader
from .fifo import FifoChains
from .leases import LeaseTable
from .preparations import PreparationCache

__all__ = ["CoordinatorCore", "Outcome", "PendingWrite", "SessionState"]


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
    owner: Session | None
    doubt: PendingWrite | None = None
    settled: tuple[SessionEvent, ...] = field(default=())
    running: anyio.Event | None = None


class Outcome:
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

    def settled(self) -> bool:
        """``True`` if already settled (raising its error, as :meth:`wait` would), ``False`` if still pending.

        For the per-commit paths: waiting on an event that is already set still yields to the event loop once,
        and a durable write waits on its session's initialization at least twice.
        """
        if not self.done.is_set():
            return False
        if self.error is not None:
            raise self.error
        return True


def _prepared_size(prepared: Any) -> int:
    return len(prepared.inspection.events)


class CoordinatorCore:
    """The state every part of the coordinator reads and updates (one instance per coordinator)."""

    def __init__(self, host: Host, backend: SessionBackend, prepared_sessions: int = 5) -> None:
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

    def require_open(self) -> None:
        """Refuse work once the coordinator has closed."""
        if self.closed:
            raise SessionPersistenceError(f"{self.name} persistence coordinator is closed")

    async def wait_retired(self, session_id: str) -> None:
        """Wait for a pending retirement of ``session_id`` (readers must not race its final drain)."""
        record = self.retirements.get(session_id)
        if record is not None:
            await record.done.wait()

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

    def live_session(self, session_id: str) -> Session | None:
        """The host's live Session with this id, if any."""
        store = self.host.sessions
        return None if store is None else store.get(session_id)
