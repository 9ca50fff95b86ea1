"""``PrimitiveFaultConformance``: faults and cancellation *inside* a backend's primitive (opt-in, file-based).

The coordinator-level fault cases wrap a backend and fail around its primitives; a bug that lives inside
one (a first batch committed in two steps, an error that escapes untyped, a write that keeps running after
its caller was cancelled) passes them. These cases reach inside through the LD_PRELOAD shim, in a child
process: every durable call of a first append fails in turn, and a second append is cancelled while the
shim holds its write. A subclass provides the same ``crash_backend`` fixture as
:class:`CrashStateConformance`::

    class TestMyPrimitiveFaults(PrimitiveFaultConformance):
        @pytest.fixture
        def crash_backend(self):
            return CrashBackend("my_package:MyBackend")

Needs Linux and a C compiler (skipped otherwise, with the reason).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

import pytest

from ._crash_kit import CrashBackend, shim_or_skip
from ._primitive_faults import FaultSweepReport, cancel_inside_write, sweep_first_append

__all__ = ["PrimitiveFaultConformance"]


class PrimitiveFaultConformance:
    """Opt-in kit cases: faults and cancellation inside a primitive (see the module docstring)."""

    #: Fault sweeps already run in this session, by backend (two tests judge one sweep).
    _sweeps: ClassVar[dict[str, FaultSweepReport]] = {}

    @pytest.fixture
    def crash_backend(self) -> CrashBackend:
        """Override: the backend factory the harness runs (the default skips the cases)."""
        pytest.skip("no crash_backend fixture: faults inside a primitive are opt-in for file-based backends")

    def _sweep(self, crash_backend: CrashBackend, tmp_path: Path) -> FaultSweepReport:
        key = f"{type(self).__qualname__} {crash_backend!r}"
        if key not in self._sweeps:
            self._sweeps[key] = sweep_first_append(
                shim_or_skip(tmp_path),
                crash_backend.factory,
                tmp_path / "sweep",
                sys_path=crash_backend.sys_path,
                kwargs=crash_backend.kwargs,
                dead_disk=os.environ.get("DSH_LONG") == "1",
                stop_at_first_violation=os.environ.get("DSH_LONG") != "1",
            )
        return self._sweeps[key]

    def test_fault_inside_the_first_append_is_all_or_nothing(self, crash_backend: CrashBackend, tmp_path: Path) -> None:
        """Each durable call of a first append fails in turn: the session is then absent or whole, never listed
        without its first batch, and an append that returned stored it."""
        report = self._sweep(crash_backend, tmp_path)
        print(f"first-append fault sweep ({crash_backend.factory} {dict(crash_backend.kwargs)}): {report.line()}")
        assert report.violations == [], "\n".join(report.violations)
        assert report.durable_calls > 0 and report.runs in (report.durable_calls, 2 * report.durable_calls)

    def test_fault_inside_the_first_append_raises_typed_errors(
        self, crash_backend: CrashBackend, tmp_path: Path
    ) -> None:
        """Every failure a storage fault causes is a ``SessionPersistenceError`` (``SessionStorageError``)."""
        report = self._sweep(crash_backend, tmp_path)
        assert report.untyped == [], "\n".join(report.untyped)

    def test_a_cancelled_write_finishes_its_step_before_returning(
        self, crash_backend: CrashBackend, tmp_path: Path
    ) -> None:
        """Cancelled while its write is held inside the primitive, ``append_batch`` must not return before the
        step ends; afterwards the store holds the old log or the old log plus the whole batch."""
        report = cancel_inside_write(
            shim_or_skip(tmp_path),
            crash_backend.factory,
            tmp_path / "cancel",
            sys_path=crash_backend.sys_path,
            kwargs=crash_backend.kwargs,
        )
        assert report.paused, f"the shim never held a write of the second append: {report}"
        assert not report.returned_while_paused, "append_batch returned while its write was still in progress"
        assert report.stored in (report.expected_before, report.expected_after), report
