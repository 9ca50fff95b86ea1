"""The storage-level kit cases (``StorageContractConformance``) against the memory backend.

They bypass the coordinator's cursor: two backend instances over one ``MemoryStore`` (a stale second writer),
and two coordinators on one session. ``tests-integration/test_sqlite_variants.py`` shows them catching a
backend that trusts the caller's seqs.
"""

from __future__ import annotations

import pytest
from dsh.session_persistence import MemoryBackend, MemoryStore
from dsh.session_persistence.testing import BackendFactory, StorageContractConformance


class TestMemoryStorageContract(StorageContractConformance):
    @pytest.fixture
    def backend_factory(self) -> BackendFactory:
        store = MemoryStore()
        return lambda: MemoryBackend(store)
