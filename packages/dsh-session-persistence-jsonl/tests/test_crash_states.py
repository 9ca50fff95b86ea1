"""Replayed power-loss crash states of a real JSONL session (the kit's opt-in crash-state case), both encodings.

A session (materialize with the first batch, two appends, cold repair of an open turn, adoption, truncate,
append) runs under the LD_PRELOAD trace shim; every state a crash may leave is rebuilt and loaded through a
new ``JsonlBackend``. Quick mode checks a seeded sample of the states, ``DSH_LONG=1`` all of them.
"""

from __future__ import annotations

import pytest
from dsh.session_persistence.testing import CrashBackend, CrashStateConformance

pytestmark = pytest.mark.slow


class TestJsonlCrashStates(CrashStateConformance):
    @pytest.fixture(params=["zstd", "none"])
    def crash_backend(self, request: pytest.FixtureRequest) -> CrashBackend:
        return CrashBackend("dsh.session_persistence_jsonl:JsonlBackend", kwargs={"compression": request.param})
