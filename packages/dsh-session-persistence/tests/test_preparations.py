"""The preparation cache: a load right after a preview reuses the validated read while storage reports the same
revision, reads afresh after any other write, and stays bounded in sessions and events."""

from __future__ import annotations

import pytest
from dsh.session_persistence import Host, MemoryBackend, PersistenceCoordinator
from dsh.session_persistence._coordinator.preparations import PreparationCache
from dsh.session_persistence.backend import StoredPrefix
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn

pytestmark = pytest.mark.anyio


class CountingBackend(MemoryBackend):
    """The memory backend, counting its whole-log reads."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[str] = []
        self.revisions: list[str] = []

    async def load_stored(self, session_id: str) -> StoredPrefix | None:
        self.loads.append(session_id)
        return await super().load_stored(session_id)

    async def read_stored_revision(self, session_id: str) -> str | None:
        self.revisions.append(session_id)
        return await super().read_stored_revision(session_id)


async def _stored(backend: MemoryBackend, session_id: str, events: list) -> None:  # type: ignore[type-arg]
    async with PersistenceCoordinator(Host(), backend) as writer:
        await writer.create(meta(session_id))
        await writer.append(session_id, events)


async def test_a_load_after_inspect_reuses_the_read() -> None:
    backend = CountingBackend()
    await _stored(backend, "s", one_turn_log())
    async with PersistenceCoordinator(Host(), backend) as coordinator:
        backend.loads.clear()
        preview = await coordinator.inspect("s")
        loaded = await coordinator.load("s")
        assert loaded.events == preview.events
        assert backend.loads == ["s"]  # one read for the preview and the load together
        assert len(coordinator._core.preparations) == 0  # committed: the entry is handed over, not kept


async def test_an_interrupted_log_is_repaired_from_the_cached_read_and_read_back() -> None:
    backend = CountingBackend()
    cut = [*one_turn_log(), *simple_turn(6, 2)[:2]]  # turn 2 open: load repairs it
    await _stored(backend, "s", cut)
    async with PersistenceCoordinator(Host(), backend) as coordinator:
        backend.loads.clear()
        preview = await coordinator.inspect("s")
        loaded = await coordinator.load("s")
        assert loaded.events == preview.events
        # The repair wrote: the committed view is read back from storage, never served from the cache.
        assert backend.loads.count("s") >= 2


async def test_a_log_written_by_another_coordinator_after_the_preview_is_read_afresh() -> None:
    backend = CountingBackend()
    await _stored(backend, "s", one_turn_log())
    async with PersistenceCoordinator(Host(), backend) as reader:
        preview = await reader.inspect("s")
        async with PersistenceCoordinator(Host(), backend) as other:
            await other.load("s")
            await other.append("s", simple_turn(6, 2))
        backend.loads.clear()
        loaded = await reader.load("s")
        assert backend.loads == ["s"]
        assert list(loaded.events) == [*preview.events, *simple_turn(6, 2)]


async def test_the_cache_keeps_at_most_its_size_in_sessions() -> None:
    backend = CountingBackend()
    for name in ("a", "b", "c"):
        await _stored(backend, name, one_turn_log())
    async with PersistenceCoordinator(Host(), backend, prepared_session_cache_size=2) as coordinator:
        for name in ("a", "b", "c"):
            await coordinator.inspect(name)
        backend.loads.clear()
        await coordinator.load("c")
        await coordinator.load("b")
        assert backend.loads == []
        await coordinator.load("a")  # evicted by "c"
        assert backend.loads == ["a"]


def test_the_event_budget_bounds_what_is_kept() -> None:
    cache: PreparationCache[list[int]] = PreparationCache(10, len, max_events=5)
    cache.put("big", "r1", [0] * 6)
    assert len(cache) == 0  # larger than the whole budget: never kept
    cache.put("x", "r1", [0] * 3)
    cache.put("y", "r1", [0] * 2)
    assert cache.cached_events == 5
    cache.put("z", "r1", [0] * 1)  # over budget: the least recently used ("x") goes
    assert cache.take("x", "r1") is None
    assert cache.cached_events == 3
    assert cache.take("y", "r2") is None  # another revision: stale, dropped
    assert cache.take("z", "r1") == [0]
    assert cache.cached_events == 1


async def test_a_preview_of_an_absent_session_caches_nothing() -> None:
    backend = CountingBackend()
    async with PersistenceCoordinator(Host(), backend) as coordinator:
        with pytest.raises(Exception, match="not found"):
            await coordinator.inspect("absent")
        assert len(coordinator._core.preparations) == 0


async def test_a_cold_load_is_one_read_and_a_reused_preview_one_revision_read() -> None:
    backend = CountingBackend()
    await _stored(backend, "s", one_turn_log())
    async with PersistenceCoordinator(Host(), backend) as coordinator:
        backend.loads.clear()
        backend.revisions.clear()
        await coordinator.load("s")
        assert (backend.loads, backend.revisions) == (["s"], [])  # the read carries its revision
    async with PersistenceCoordinator(Host(), backend) as coordinator:
        await coordinator.inspect("s")
        backend.loads.clear()
        backend.revisions.clear()
        await coordinator.load("s")
        assert (backend.loads, backend.revisions) == ([], ["s"])  # the cached read, validated once
