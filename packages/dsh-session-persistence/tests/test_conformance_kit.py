"""The backend conformance kit, proved both ways.

1. ``TestMemoryConformance`` runs the whole kit against :class:`MemoryBackend` (it must pass).
2. pytester runs the kit against deliberately broken backends (it must fail, in the tests that guard against
   exactly that breakage).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from dsh.session_persistence._backends.memory import MemoryBackend, MemoryStore
from dsh.session_persistence._backends.protocol import SessionBackend
from dsh.session_persistence.testing import BackendConformance, BackendFactory


class TestMemoryConformance(BackendConformance):
    lifecycle_required = True

    @pytest.fixture
    def backend_factory(self) -> BackendFactory:
        store = MemoryStore()
        return lambda: MemoryBackend(store)

    @pytest.fixture
    def other_backend_factory(self) -> BackendFactory:
        store = MemoryStore()
        return lambda: MemoryBackend(store)

    async def set_activity(self, backend: SessionBackend, session_id: str, updated_at_ms: int) -> None:
        assert isinstance(backend, MemoryBackend)
        backend.store.set_updated_at(session_id, updated_at_ms)

    async def inject_torn_tail(self, backend: SessionBackend, session_id: str) -> None:
        assert isinstance(backend, MemoryBackend)
        backend.store.inject_torn_tail(session_id)


# ----------------------------------------------------------------------------------------------------------
# The kit must catch broken backends.

_BROKEN_BACKENDS = '''
from __future__ import annotations

import pytest

from dsh.session_persistence._backends.memory import MemoryBackend, MemoryStore
from dsh.session_persistence.testing import BackendConformance


class DropsLastEvent(MemoryBackend):
    """Silently loses the last event of every batch."""

    async def append_batch(self, storage, events, is_materialized):
        await super().append_batch(storage, list(events)[:-1], is_materialized)


class AcknowledgesBeforeDurability(MemoryBackend):
    """Acknowledges every batch but keeps it only in this instance: a restart (new instance) loses it."""

    def __init__(self, shared: MemoryStore) -> None:
        super().__init__(MemoryStore())


class TestDropsLastEvent(BackendConformance):
    @pytest.fixture
    def backend_factory(self):
        store = MemoryStore()
        return lambda: DropsLastEvent(store)


class TestAcknowledgesBeforeDurability(BackendConformance):
    @pytest.fixture
    def backend_factory(self):
        store = MemoryStore()
        return lambda: AcknowledgesBeforeDurability(store)
'''

_INI = """
[pytest]
addopts = -p no:cacheprovider
filterwarnings = error
timeout = 120
"""


def _failed(result: pytest.RunResult) -> set[str]:
    names: set[str] = set()
    for line in result.outlines:
        if line.startswith("FAILED "):
            names.add(line.split()[1].split(" - ")[0])
    return names


def _assert_failed(result: pytest.RunResult, cls: str, tests: Sequence[str], backends: Sequence[str]) -> None:
    failed = _failed(result)
    for test in tests:
        for backend in backends:
            node = f"test_broken.py::{cls}::{test}[{backend}]"
            assert node in failed, f"{node} did not fail; failures were:\n" + "\n".join(sorted(failed))


def test_kit_fails_broken_backends(pytester: pytest.Pytester) -> None:
    """One subprocess run of the kit against both broken backends (the run is the expensive part).

    The hypothesis property (which shrinks on failure, the slow part) runs once, on trio, against the backend
    that drops events.
    """
    pytester.makeini(_INI)
    pytester.makepyfile(test_broken=_BROKEN_BACKENDS)
    result = pytester.runpytest_subprocess(
        "-rf", "-q", "--tb=no", "-k", "not property or (TestDropsLastEvent and property and trio)"
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("errors", 0) == 0, result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str()
    both = ("asyncio", "trio")
    # A backend that loses the last event of each batch.
    _assert_failed(
        result,
        "TestDropsLastEvent",
        [
            "test_round_trip",
            "test_restart_lists_and_adopts_without_create",
            "test_live_session_flush_persists",
            "test_read_from",
            "test_concurrent_appends_across_sessions",
        ],
        both,
    )
    _assert_failed(result, "TestDropsLastEvent", ["test_property_random_batch_splits_round_trip"], ["trio"])
    # A backend that acknowledges before the batch is durable (a new instance does not see it).
    _assert_failed(
        result,
        "TestAcknowledgesBeforeDurability",
        [
            "test_round_trip",
            "test_restart_lists_and_adopts_without_create",
            "test_close_drains_unflushed_events",
            "test_resume_in_a_new_instance",
            "test_same_id_race_between_instances",
        ],
        both,
    )
