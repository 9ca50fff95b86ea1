"""The storage-level kit cases (``StorageContractConformance``) against JsonlBackend, both encodings.

They bypass the coordinator's cursor and lease: two backend instances over one root, a stale second writer's
append and a stale repair (closers computed from an old read) must each be a ``SeqMismatchError``, never a
duplicate seq on disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dsh.session_persistence.testing import BackendFactory, StorageContractConformance
from dsh.session_persistence_jsonl import JsonlBackend


@pytest.fixture(params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


class TestJsonlStorageContract(StorageContractConformance):
    @pytest.fixture
    def backend_factory(self, tmp_path: Path, compression: str) -> BackendFactory:
        return lambda: JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
