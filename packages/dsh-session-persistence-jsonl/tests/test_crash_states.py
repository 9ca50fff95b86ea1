"""Replayed power-loss crash states and faults inside the primitives of a real JSONL session, both encodings.

The kit's opt-in cases for file-based backends: a session (materialize with the first batch, two appends, cold
repair of an open turn, adoption, truncate, append) runs under the LD_PRELOAD trace shim and every state a
crash may leave is rebuilt and loaded through a new ``JsonlBackend``; every durable call of a first append
fails in turn; a second append is cancelled while the shim holds its write. Quick mode checks a seeded sample
of the states, ``DSH_LONG=1`` all of them.
"""

from __future__ import annotations

import pytest
from dsh.session_persistence.testing import CrashBackend, CrashStateConformance, PrimitiveFaultConformance

pytestmark = pytest.mark.slow


class TestJsonlCrashStates(CrashStateConformance, PrimitiveFaultConformance):
    @pytest.fixture(params=["zstd", "none"])
    def crash_backend(self, request: pytest.FixtureRequest) -> CrashBackend:
        return CrashBackend("dsh.session_persistence_jsonl:JsonlBackend", kwargs={"compression": request.param})
