"""``StorageContractConformance``: storage-level kit cases that bypass the coordinator's own cursor.

The coordinator checks seq contiguity before it calls a backend, so a backend that trusts the caller passes
every coordinator-level case; a second writer (another process, or a second coordinator in this one) has its
own, stale cursor, and only the backend's own check stands between it and a duplicated or gapped log. These
cases call the primitives directly through two backend instances over one storage, and run two coordinators
on one session. Every refusal must be a typed ``SessionPersistenceError`` (``SeqMismatchError`` for a seq the
store does not expect), and the stored log must stay exactly what was acknowledged.

Subclass it next to :class:`BackendConformance` (same ``backend_factory`` fixture)::

    class TestMyBackend(BackendConformance, StorageContractConformance):
        @pytest.fixture
        def backend_factory(self, tmp_path):
            return lambda: MyBackend(tmp_path)
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from .._backends.protocol import StorageMetadata
from .._model.errors import SeqMismatchError, SessionAlreadyExistsError, SessionPersistenceError
from ._logs import meta, one_turn_log, simple_turn
from ._rig import BackendFactory, ConformanceRig, aclose_backend
from .fixtures import ANYIO_BACKENDS

__all__ = ["StorageContractConformance"]


class StorageContractConformance:
    """Storage-level contract cases (see the module docstring); needs the ``backend_factory`` fixture."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    @pytest.fixture(scope="class", params=ANYIO_BACKENDS)
    @classmethod
    def anyio_backend(cls, request: pytest.FixtureRequest) -> Any:
        return request.param

    @pytest.fixture
    def storage_rig(self, backend_factory: BackendFactory) -> ConformanceRig:
        async def plant(backend: Any, storage: StorageMetadata, events: Any) -> None:
            await backend.append_batch(storage, list(events), False)

        return ConformanceRig(backend_factory, plant)

    async def test_stale_writer_append_is_a_seq_mismatch(self, storage_rig: ConformanceRig) -> None:
        """A second instance appending seqs the store already holds (or past its end) gets SeqMismatchError."""
        storage = StorageMetadata(meta("stale"), 0)
        async with storage_rig.backend() as first:
            await first.append_batch(storage, one_turn_log(), False)
        revision = await storage_rig.revision("stale")
        async with storage_rig.backend() as second:
            for batch in (one_turn_log()[:3], simple_turn(3, 2), simple_turn(9, 2)):
                with pytest.raises(SeqMismatchError):
                    await second.append_batch(storage, batch, True)
        assert await storage_rig.stored_events("stale") == one_turn_log()
        assert await storage_rig.revision("stale") == revision

    async def test_second_first_batch_is_already_exists(self, storage_rig: ConformanceRig) -> None:
        """A second writer's first batch (it believes the id is new) never overwrites the stored log."""
        storage = StorageMetadata(meta("twice"), 0)
        async with storage_rig.backend() as first:
            await first.append_batch(storage, one_turn_log(), False)
        async with storage_rig.backend() as second:
            with pytest.raises(SessionAlreadyExistsError):
                await second.append_batch(storage, simple_turn(0, 1, "other writer"), False)
        assert await storage_rig.stored_events("twice") == one_turn_log()

    async def test_stale_repair_is_a_seq_mismatch(self, storage_rig: ConformanceRig) -> None:
        """Closers computed from a stale read are refused, not appended after another writer's batch."""
        storage = StorageMetadata(meta("closers"), 0)
        async with storage_rig.backend() as first:
            await first.append_batch(storage, one_turn_log()[:3], False)
            await first.append_batch(storage, one_turn_log()[3:], True)
        async with storage_rig.backend() as second:
            with pytest.raises(SeqMismatchError):
                await second.commit_repair(storage, None, one_turn_log()[3:])
        assert await storage_rig.stored_events("closers") == one_turn_log()

    async def test_two_coordinators_on_one_session(self, storage_rig: ConformanceRig) -> None:
        """Two coordinators (two instances, one process) append the same next seqs: one wins, the other gets a
        typed error, and the stored log is exactly the winner's."""
        async with storage_rig.open() as p:
            await p.persistence.create(meta("shared"))
            await p.persistence.append("shared", one_turn_log())
        async with storage_rig.open() as a, storage_rig.open() as b:
            await a.persistence.load("shared")  # both coordinators now hold cursor 6
            await b.persistence.load("shared")
            await a.persistence.append("shared", simple_turn(6, 2, "writer a"))
            with pytest.raises(SessionPersistenceError):
                await b.persistence.append("shared", simple_turn(6, 2, "writer b"))
        assert await storage_rig.stored_events("shared") == one_turn_log() + simple_turn(6, 2, "writer a")
        backend = storage_rig.new_backend()
        try:
            stored = await backend.load_stored("shared")
            assert stored is not None and stored.torn_marker is None
        finally:
            await aclose_backend(backend)
