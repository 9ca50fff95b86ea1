"""``PersistenceCoordinator.iter_events`` on the memory backend (streaming primitive) and on a backend without
one (the ``read_from`` fallback): the same events as ``read_from`` from every position."""

from __future__ import annotations

import pytest
from dsh.session_persistence import Host, MemoryBackend, PersistenceCoordinator
from dsh.session_persistence.backend import SessionNotFoundError, SupportsStreamingRead
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn

pytestmark = pytest.mark.anyio


class NoStreaming(MemoryBackend):
    """The memory backend with its streaming primitive hidden (a backend that predates it): a ``None`` member
    does not satisfy a runtime-checkable protocol."""

    iter_stored = None  # type: ignore[assignment]


@pytest.mark.parametrize("backend_type", [MemoryBackend, NoStreaming])
async def test_iter_events_equals_read_from(backend_type: type[MemoryBackend]) -> None:
    backend = backend_type()
    assert isinstance(backend, SupportsStreamingRead) == (backend_type is MemoryBackend)
    events = one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)
    async with PersistenceCoordinator(Host(), backend) as coordinator:
        await coordinator.create(meta("s"))
        await coordinator.append("s", events)
        for from_seq in range(len(events) + 2):
            streamed = [e async for e in coordinator.iter_events("s", from_seq)]
            assert streamed == list((await coordinator.read_from("s", from_seq)).events) == events[from_seq:]
        with pytest.raises(SessionNotFoundError):
            [e async for e in coordinator.iter_events("absent")]
