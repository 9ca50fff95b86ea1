"""The conformance rig: fresh backend instances over one storage, coordinators opened over them, and the kit's
shared base (the fixtures and hooks a backend's test class overrides, and the helpers every group of cases uses).

A new backend instance over the same storage stands for a process restart: whatever it reads is what survived.
The base lives here, not in a module of its own over the rig, so the kit's groups of cases stand one module above
the rig (``tools/import-graph``). This module needs pytest: ``testing`` imports it on first use only.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from .._backends.protocol import SessionBackend, SessionSnapshot, StorageMetadata, StoredPrefix, SupportsRewrite
from .._coordinator.service import PersistenceCoordinator
from .._host.host import Host
from .._host.session import Session, SessionStore
from .._model.errors import SessionDisposeError
from .._model.events import SessionEvent
from .._model.header import SessionHeader, header_to_builtins
from .fixtures import ANYIO_BACKENDS

__all__ = ["BackendFactory", "ConformanceRig", "Opened", "_KitBase", "aclose_backend"]

#: Builds a new backend instance over the test's one storage (a new instance = a process restart).
BackendFactory = Callable[[], SessionBackend]

#: The longest write-behind window the coordinator accepts: "never expires during a test".
NEVER_MS = 2_147_483_647


@dataclass
class Opened:
    """One running persistence stack: the host, its session store, the coordinator and its backend."""

    host: Host
    store: SessionStore
    persistence: PersistenceCoordinator
    backend: SessionBackend
    #: The close must fail with an ``ExceptionGroup`` containing this type (settable inside the block).
    drain_failure: type[Exception] | None = None


async def aclose_backend(backend: SessionBackend) -> None:
    """Close a backend that was used without a coordinator (``aclose`` is optional)."""
    aclose = getattr(backend, "aclose", None)
    if aclose is not None:
        await aclose()


class ConformanceRig:
    """What every kit test uses to reach the backend under test through public API only."""

    def __init__(self, factory: BackendFactory, plant: Callable[..., Awaitable[None]]) -> None:
        self._factory = factory
        self._plant = plant

    def new_backend(self) -> SessionBackend:
        """A new backend instance over the test's storage (a restart of the process that owns it)."""
        return self._factory()

    @asynccontextmanager
    async def backend(self) -> AsyncIterator[SessionBackend]:
        """A new backend instance, closed afterwards."""
        backend = self.new_backend()
        try:
            yield backend
        finally:
            await aclose_backend(backend)

    @asynccontextmanager
    async def open(
        self,
        backend: SessionBackend | None = None,
        *,
        host: Host | None = None,
        delay_ms: int = 200,
        drain_failure: type[Exception] | None = None,
    ) -> AsyncIterator[Opened]:
        """Start a coordinator over ``backend`` (default: a new instance) on ``host`` (default: a new one).

        Leaving the block closes the coordinator (final drain, then ``backend.aclose``). With ``drain_failure``
        the close must fail with a ``SessionDisposeError`` one of whose ``errors`` is of that type (buffered
        events that can never be written, e.g. after an id collision). A failure inside the block always wins
        over a close failure, so a failed assertion is never masked by the close error it leaves behind.
        """
        if host is None:
            host = Host()
        store = host.sessions if host.sessions is not None else SessionStore(host)
        if backend is None:
            backend = self.new_backend()
        coordinator = PersistenceCoordinator(host, backend, write_batch_max_delay_ms=delay_ms)
        await coordinator.__aenter__()
        opened = Opened(host, store, coordinator, backend, drain_failure)
        try:
            yield opened
        except BaseException as exc:
            # The body's failure is the one to report (the close often re-raises it inside its dispose error).
            with contextlib.suppress(BaseException):
                await coordinator.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        drain_failure = opened.drain_failure
        if drain_failure is None:
            await coordinator.__aexit__(None, None, None)
            return
        try:
            await coordinator.__aexit__(None, None, None)
        except SessionDisposeError as error:
            if not any(isinstance(e, drain_failure) for e in error.errors):
                raise
        else:
            raise AssertionError(f"expected the coordinator's final drain to fail with {drain_failure.__name__}")

    async def stored(self, session_id: str) -> StoredPrefix | None:
        """What a restarted process finds: ``load_stored`` through a new backend instance (nothing repaired)."""
        async with self.backend() as backend:
            return await backend.load_stored(session_id)

    async def stored_events(self, session_id: str) -> list[SessionEvent] | None:
        """The stored events seen by a new instance, or ``None`` when nothing is materialized."""
        prefix = await self.stored(session_id)
        return None if prefix is None else list(prefix.events)

    async def revision(self, session_id: str) -> str | None:
        """The current revision as ``list_snapshots`` reports it through a new instance."""
        async with self.backend() as backend:
            snapshots: Sequence[SessionSnapshot] = await backend.list_snapshots()
            for snapshot in snapshots:
                if snapshot.header.id == session_id:
                    return snapshot.revision
        return None

    async def listed_ids(self) -> list[str]:
        """Ids ``list()`` reports through a new instance."""
        async with self.backend() as backend:
            headers: Sequence[SessionHeader] = await backend.list()
            return [header.id for header in headers]

    async def plant(self, meta: SessionHeader, events: list[SessionEvent], inherited_event_count: int = 0) -> None:
        """Store ``meta`` and ``events`` verbatim, bypassing every coordinator check (the suite's ``plant_raw``)."""
        async with self.backend() as backend:
            await self._plant(backend, StorageMetadata(meta, inherited_event_count), events)


def backend_name_and_options(anyio_backend: Any) -> tuple[str, dict[str, Any]]:
    """Split an ``anyio_backend`` fixture value (``"trio"`` or ``("asyncio", {...})``)."""
    if isinstance(anyio_backend, str):
        return anyio_backend, {}
    name, options = anyio_backend
    return str(name), dict(options)


_ids = itertools.count()


def _seqs(events: Sequence[SessionEvent]) -> list[int]:
    return [e.seq for e in events]


def _append_live(session: Session, events: Sequence[SessionEvent]) -> None:
    for e in events:
        session.append_event(e)


def _header_key(header: SessionHeader) -> dict[str, Any]:
    # Absent and 0 both mean "top level"; a backend may always write the depth (JSONL does, spec/jsonl.md).
    key = header_to_builtins(header)
    key.setdefault("delegationDepth", 0)
    return key


def _same_header(left: SessionHeader, right: SessionHeader) -> bool:
    """Header equality modulo ``delegationDepth`` absent == 0."""
    return _header_key(left) == _header_key(right)


def _same_headers(left: Sequence[SessionHeader], right: Sequence[SessionHeader]) -> bool:
    return [_header_key(h) for h in left] == [_header_key(h) for h in right]


def _ids_of(headers: Sequence[Any]) -> list[str]:
    return [h.id for h in headers]


class _KitBase:
    """Fixtures and hooks of :class:`~dsh.session_persistence.testing.BackendConformance` (see its doc)."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    #: ``None`` detects the optional ``rewrite`` primitive; set ``False`` to assert the unsupported error.
    supports_truncate: ClassVar[bool | None] = None
    #: Examples the hypothesis property test runs per async backend.
    property_max_examples: ClassVar[int] = 25

    # ------------------------------------------------------------------------------------------------------
    # Fixtures and hooks a subclass provides or overrides

    @pytest.fixture(scope="class", params=ANYIO_BACKENDS)
    @classmethod
    def anyio_backend(cls, request: pytest.FixtureRequest) -> Any:
        """Every async test runs on asyncio (debug mode) and trio."""
        return request.param

    @pytest.fixture
    def backend_factory(self) -> BackendFactory:
        """Override: return a zero-argument callable building a new backend instance over one empty storage."""
        pytest.fail(f"{type(self).__name__} must override the backend_factory fixture")

    @pytest.fixture
    def conformance(self, backend_factory: BackendFactory) -> ConformanceRig:
        """The rig every kit test uses (built from ``backend_factory`` and ``plant_raw``)."""
        return ConformanceRig(backend_factory, self.plant_raw)

    async def inject_torn_tail(self, backend: SessionBackend, session_id: str) -> None:
        """Override: append a never-committed fragment after the stored log of ``session_id``."""
        pytest.skip("backend cannot inject torn tails")

    async def plant_raw(
        self, backend: SessionBackend, storage: StorageMetadata, events: Sequence[SessionEvent]
    ) -> None:
        """Store ``storage`` and ``events`` verbatim (headers and events a reader must refuse).

        The default uses the backend's own first-batch ``append_batch``; override it if the backend validates
        what it writes, or skip.
        """
        await backend.append_batch(storage, list(events), False)

    def _truncate_supported(self, backend: SessionBackend) -> bool:
        if self.supports_truncate is None:
            return isinstance(backend, SupportsRewrite)
        return self.supports_truncate
