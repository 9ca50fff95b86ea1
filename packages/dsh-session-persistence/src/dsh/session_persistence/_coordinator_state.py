"""What the coordinator keeps per session id and shares between its parts (FIFO chain, cold path, live path,
retirement, durable writes): the durable bookkeeping of each id and the backend with its resolved primitives.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import anyio

from ._backend import SessionBackend, StorageMetadata
from ._capabilities import Capabilities
from ._events import SessionEvent
from ._fifo import FifoChains
from ._header import SessionHeader
from ._host import Host
from ._lease_table import LeaseTable
from ._session import Session

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


class CoordinatorCore:
    """The state every part of the coordinator reads and updates (one instance per coordinator)."""

    def __init__(self, host: Host, backend: SessionBackend) -> None:
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
        #: Starts a task in the coordinator's task group (set once it runs): durable writes outlive their callers.
        self.spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], object] | None = None
        #: Durable writes still running (a caller left at its deadline): the coordinator closes after them.
        self.running_writes: set[anyio.Event] = set()

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
