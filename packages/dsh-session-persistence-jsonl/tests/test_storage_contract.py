"""The storage-level kit cases (``StorageContractConformance``) against ``JsonlBackend``, both encodings.

Two backend instances over one root stand for a second process with a stale view: its appends and repairs at
seqs the log already holds (or past its end) must be refused with ``SeqMismatchError`` by the primitive itself,
and two coordinators on one session leave exactly the winner's log.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dsh.session_persistence.testing import BackendFactory, StorageContractConformance
from dsh.session_persistence_jsonl import JsonlBackend


class TestJsonlStorageContract(StorageContractConformance):
    @pytest.fixture(params=["zstd", "none"])
    def backend_factory(self, tmp_path: Path, request: pytest.FixtureRequest) -> BackendFactory:
        return lambda: JsonlBackend(tmp_path / "root", compression=request.param)
