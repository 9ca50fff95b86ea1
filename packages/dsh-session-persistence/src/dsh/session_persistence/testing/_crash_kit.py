"""``CrashStateConformance``: the opt-in crash-state case of the conformance kit for file-based backends.

"Durable" is checked, not assumed: a real session runs in a child process under the LD_PRELOAD trace shim,
and every state a power loss may leave (every byte not fsynced lost, cut, zero-filled, reordered or replaced
by garbage) is rebuilt and loaded through a new backend instance. Each must load to the acknowledged log (or
a prefix of the write in flight that keeps every acknowledged batch), or be refused as damage
(``SessionPersistenceCorruptionError``) where the crash left a hole or garbage. A subclass provides::

    class TestMyCrashStates(CrashStateConformance):
        @pytest.fixture
        def crash_backend(self):
            return CrashBackend("my_package:MyBackend", kwargs={"compression": "zstd"})

The factory is called as ``callable(root, **kwargs)`` in the child and in the checking process, so it must be
importable by name (``sys_path`` adds directories). Needs Linux and a C compiler (skipped otherwise, with
the reason). ``DSH_LONG=1`` checks every state and cuts every byte (the default checks a seeded sample), and
also sweeps "this call and every later one fails" (a dead disk) over the first append.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ._crash_states import CrashStateReport, check_crash_states, record_session
from ._shim import ShimUnavailableError, build_shim

__all__ = ["CrashBackend", "CrashStateConformance", "shim_or_skip"]


@dataclass(frozen=True)
class CrashBackend:
    """How the harness builds the backend under test: ``module:callable`` plus keyword arguments."""

    factory: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    sys_path: Sequence[str] = ()
    #: The async library the recorded session runs on.
    async_backend: str = "asyncio"


def shim_or_skip(tmp_path: Path) -> Path:
    """Build the LD_PRELOAD shim into ``tmp_path``, or skip the test with the reason it cannot be built."""
    try:
        return build_shim(tmp_path / "shim")
    except ShimUnavailableError as exc:
        pytest.skip(str(exc))


class CrashStateConformance:
    """Opt-in kit case: replayed crash states never lose an acknowledged batch (see the module docstring)."""

    #: The last report, for subclasses that assert more (state counts, outcomes).
    last_report: CrashStateReport | None = None

    @pytest.fixture
    def crash_backend(self) -> CrashBackend:
        """Override: the backend factory the harness runs (the default skips the case)."""
        pytest.skip("no crash_backend fixture: the crash-state harness is opt-in for file-based backends")

    @staticmethod
    def _shim(tmp_path: Path) -> Path:
        return shim_or_skip(tmp_path)

    def test_crash_states_keep_every_acknowledged_batch(self, crash_backend: CrashBackend, tmp_path: Path) -> None:
        shim = self._shim(tmp_path)
        long = os.environ.get("DSH_LONG") == "1"
        recording = record_session(
            crash_backend.factory,
            tmp_path / "run",
            sys_path=crash_backend.sys_path,
            kwargs=crash_backend.kwargs,
            shim=shim,
            backend=crash_backend.async_backend,
        )
        assert len(recording.epochs) >= 5, "the recorded session must acknowledge every step"
        assert len(recording.ack_points()) == len(recording.epochs), "an acknowledgement was not traced"
        report = check_crash_states(
            recording,
            crash_backend.factory,
            tmp_path / "run",
            sys_path=crash_backend.sys_path,
            kwargs=crash_backend.kwargs,
            long=long,
            # The failure message shows 20 states; by default a failing backend is not checked further.
            max_failures=None if long else 20,
        )
        type(self).last_report = report
        print(f"crash states ({crash_backend.factory} {dict(crash_backend.kwargs)}): {report.line()}")
        assert report.checked > 0
        assert report.violations == [], "\n".join(report.violations[:20])
        assert report.refused_clean == [], "\n".join(report.refused_clean[:20])
