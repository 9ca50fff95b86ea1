"""The lifecycle cases' shared part: the suite hooks (``set_activity``, ``other_backend_factory``,
``lifecycle_required``), the retention clock and the helpers that store sessions and read their listing."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from .._backends.listing import SessionListing
from .._backends.protocol import (
    SessionBackend,
    SupportsListPage,
)
from .._model.events import SessionEvent
from .._model.header import SessionHeader, header_to_builtins
from ._rig import BackendFactory, ConformanceRig

__all__ = ["DAY_MS", "NOW_MS", "_LifecycleBase", "_ids", "_key", "_listing"]

#: A fixed "now" for retention: 2026-01-31T00:00:00Z, in milliseconds.
NOW_MS = 1_769_817_600_000
DAY_MS = 86_400_000


def _key(header: SessionHeader) -> dict[str, Any]:
    data = header_to_builtins(header)
    data.setdefault("delegationDepth", 0)
    return data


def _ids(rows: Any) -> list[str]:
    return [row.header.id for row in rows]


class _LifecycleBase:
    """What every lifecycle case uses: the hooks a suite may override and the helpers to store sessions."""

    #: Set ``True`` in a suite whose backend must implement every lifecycle primitive.
    lifecycle_required: ClassVar[bool] = False

    @pytest.fixture
    def other_backend_factory(self) -> BackendFactory | None:
        """Override: a factory over another, empty storage (``None`` skips the cross-storage cursor test)."""
        return None

    async def set_activity(self, backend: SessionBackend, session_id: str, updated_at_ms: int) -> None:
        """Override: make ``session_id``'s last activity read as ``updated_at_ms``."""
        pytest.skip("backend cannot set a session's activity time")

    def _need(self, backend: SessionBackend, kind: type) -> None:
        if not isinstance(backend, kind):
            if self.lifecycle_required:
                pytest.fail(f"{type(backend).__name__} must implement {kind.__name__}")
            pytest.skip(f"{type(backend).__name__} does not implement {kind.__name__}")

    async def _store(
        self, conformance: ConformanceRig, sessions: list[tuple[SessionHeader, list[SessionEvent], int]]
    ) -> None:
        """Persist each (header, events, activity ms) through the coordinator, then stamp its activity."""
        async with conformance.open() as p:
            for header, events, _at in sessions:
                await p.persistence.create(header)
                await p.persistence.append(header.id, events)
        async with conformance.backend() as backend:
            for header, _events, at in sessions:
                await self.set_activity(backend, header.id, at)


async def _listing(persistence: Any, session_id: str) -> SessionListing | None:
    if not isinstance(persistence.backend, SupportsListPage):
        return None
    for row in (await persistence.list_page()).entries:
        if row.header.id == session_id:
            row_: SessionListing = row
            return row_
    return None
