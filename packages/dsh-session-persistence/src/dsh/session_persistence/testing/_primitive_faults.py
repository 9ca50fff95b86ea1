"""Parent side of the kit's faults inside a primitive: sweep a fault over every durable call of a first
append, and cancel a write while it is paused inside the primitive (see ``_primitive_driver``).

:func:`sweep_first_append` first records a clean first append to count its durable calls (every write,
fsync, directory fsync, ftruncate, link, rename and unlink under the root), then fails each in turn, once
(a transient error) and from there on (a dead disk). After each, a fresh backend must show all or nothing:
the session absent and unlisted, or listed with exactly the batch; a primitive that returned must have
stored the batch; an error must be a ``SessionPersistenceError``.
:func:`cancel_inside_write` checks that a cancelled mutating primitive does not return while its write is
still in progress (it must wait for its step, then report the cancellation), and that what is stored
afterwards is the old log or the old log plus the whole batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from .._wire.codec import encode_event
from ._crash_common import SESSION_ID, load_factory
from ._crash_trace import read_trace
from ._logs import simple_turn
from ._shim import shim_environment

__all__ = ["CancelReport", "FaultSweepReport", "cancel_inside_write", "sweep_first_append"]

MODULE = "dsh.session_persistence.testing._primitive_driver"


@dataclass
class FaultSweepReport:
    """What the sweep found: ``violations`` (all or nothing broken) and ``untyped`` (raw errors) must be empty."""

    durable_calls: int = 0
    runs: int = 0
    absent: int = 0
    whole: int = 0
    violations: list[str] = field(default_factory=list)
    untyped: list[str] = field(default_factory=list)
    #: The sweep ended at its first violation (``stop_at_first_violation``): the backend fails either way.
    stopped_early: bool = False

    def line(self) -> str:
        return (
            f"durable_calls={self.durable_calls} runs={self.runs} absent={self.absent} whole={self.whole} "
            f"violations={len(self.violations)} untyped={len(self.untyped)}"
            + (" (stopped at the first violation)" if self.stopped_early else "")
        )


@dataclass
class CancelReport:
    """``returned_while_paused`` must be False; ``stored`` is what a fresh backend read afterwards."""

    paused: bool
    returned_while_paused: bool
    append: Any
    stored: list[str] | None
    expected_before: list[str]
    expected_after: list[str]


def _child(
    shim: Path,
    mode: str,
    factory: str,
    root: Path,
    report: Path,
    *,
    sys_path: Sequence[str],
    kwargs: Mapping[str, Any] | None,
    extra: Sequence[str] = (),
    record: Path | None = None,
) -> dict[str, Any]:
    env = shim_environment(shim, record=record, record_under=[root] if record is not None else ())
    argv = [
        sys.executable,
        "-m",
        MODULE,
        mode,
        factory,
        str(root),
        str(report),
        "--kwargs",
        json.dumps(dict(kwargs or {})),
    ]
    for entry in sys_path:
        argv += ["--sys-path", entry]
    argv += list(extra)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the primitive driver failed:\n{proc.stdout}{proc.stderr}")
    data: dict[str, Any] = json.loads(report.read_text())
    return data


async def _reload(factory: str, sys_path: Sequence[str], kwargs: Mapping[str, Any] | None, root: Path) -> Any:
    backend = load_factory(factory, sys_path, kwargs)(str(root))
    try:
        listed = SESSION_ID in [h.id for h in await backend.list()]
        try:
            stored = await backend.load_stored(SESSION_ID)
        except Exception as exc:  # judged by the caller
            return listed, f"{type(exc).__name__}: {exc}"
        return listed, None if stored is None else [encode_event(e).decode() for e in stored.events]
    finally:
        close = getattr(backend, "aclose", None)
        if close is not None:
            await close()


def sweep_first_append(
    shim: Path,
    factory: str,
    workdir: str | os.PathLike[str],
    *,
    sys_path: Sequence[str] = (),
    kwargs: Mapping[str, Any] | None = None,
    dead_disk: bool = True,
    stop_at_first_violation: bool = False,
) -> FaultSweepReport:
    """Fail each durable call of a first append in turn (see the module docstring).

    Each call fails once; with ``dead_disk`` each also fails together with every later call. With
    ``stop_at_first_violation`` a failing backend costs one child per call up to its first violation, not the
    whole sweep (a backend that passes runs every call either way).
    """
    work = Path(workdir)
    batch = [encode_event(e).decode() for e in simple_turn(0, 1, "first batch")]
    report = FaultSweepReport()
    clean_root = work / "clean"
    trace = work / "clean.trace"
    _child(
        shim, "first-append", factory, clean_root, work / "clean.json", sys_path=sys_path, kwargs=kwargs, record=trace
    )
    report.durable_calls = sum(1 for r in read_trace(trace) if r.op != "C")
    for count in (1, 0) if dead_disk else (1,):
        for nth in range(1, report.durable_calls + 1):
            root = work / f"fault-{nth}-{count}"
            run = _child(
                shim,
                "first-append",
                factory,
                root,
                work / f"fault-{nth}-{count}.json",
                sys_path=sys_path,
                kwargs=kwargs,
                extra=["--nth", str(nth), "--count", str(count)],
            )
            report.runs += 1
            outcome = run["append"]
            where = f"durable call {nth} failed ({'once' if count else 'and every later one'})"
            if not outcome["ok"] and "SessionPersistenceError" not in outcome["mro"]:
                report.untyped.append(f"{where}: raised {outcome['type']}: {outcome['text']}")
            listed, stored = anyio.run(_reload, factory, sys_path, kwargs, root)
            if isinstance(stored, str):
                report.violations.append(f"{where}: reload raised {stored}")
            elif stored is None and not listed:
                report.absent += 1
                if outcome["ok"]:
                    report.violations.append(f"{where}: the append returned but nothing is stored")
            elif listed and stored == batch:
                report.whole += 1
            else:
                have = "unlisted" if not listed else "listed"
                report.violations.append(f"{where}: {have}, stored {stored!r} instead of nothing or the batch")
            if stop_at_first_violation and report.violations:
                report.stopped_early = True
                return report
    return report


def cancel_inside_write(
    shim: Path,
    factory: str,
    workdir: str | os.PathLike[str],
    *,
    sys_path: Sequence[str] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> CancelReport:
    """Cancel an ``append_batch`` while the shim holds its first write (see the module docstring)."""
    work = Path(workdir)
    root = work / "cancel"
    release = work / "release"
    run = _child(
        shim,
        "cancel",
        factory,
        root,
        work / "cancel.json",
        sys_path=sys_path,
        kwargs=kwargs,
        extra=["--release", str(release)],
    )
    _listed, stored = anyio.run(_reload, factory, sys_path, kwargs, root)
    before = [encode_event(e).decode() for e in simple_turn(0, 1, "first batch")]
    after = before + [encode_event(e).decode() for e in simple_turn(3, 2, "second batch")]
    return CancelReport(
        paused=bool(run.get("paused")),
        returned_while_paused=bool(run.get("returned_while_paused")),
        append=run.get("append"),
        stored=stored if not isinstance(stored, str) else None,
        expected_before=before,
        expected_after=after,
    )
