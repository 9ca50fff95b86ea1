"""The crash-state harness for file-based backends: record a real session's syscalls, replay every crash state.

:func:`record_session` runs the harness's session (``_crash_driver``) in a child process with the trace shim
preloaded; :func:`check_crash_states` rebuilds every state a power loss may leave (see ``_crash_trace``), opens
a new backend over each and checks what it reads:

* nothing stored is fine only before the first acknowledgement;
* a loaded log must be the acknowledged log, or a prefix of the log in flight that still holds every
  acknowledged event (for a rewrite in flight: the old log or the new one, exactly);
* a refusal must be ``SessionPersistenceCorruptionError``, and is acceptable only for a state with bytes a
  crash did not simply cut short: a hole inside the unacknowledged tail (``drop-page``, ``only-page``) or a
  garbage tail. Refusing a state where the unacknowledged tail is merely missing, cut, or zeros to the end
  (``synced``, ``all``, ``names``, ``prefix``, ``zero-tail``, ``zero-sectors``: its size reached the disk, its
  data did not) is counted in ``refused_clean``: such a session must load (the tail is torn, never damage).
  ``refused_by_kind`` counts every refusal;
* anything else (another exception, events that were never written, a lost acknowledged batch) is a violation.

The comparison is byte for byte on each event's wire JSON.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from .._model.errors import SessionPersistenceCorruptionError
from .._wire.codec import encode_event
from ._crash_common import SESSION_ID, load_factory
from ._crash_trace import CrashState, TraceRecord, crash_states, read_trace
from ._shim import build_shim, shim_environment

__all__ = ["CrashStateReport", "Recording", "check_crash_states", "record_session"]

#: State kinds that only lose or cut unacknowledged bytes: refusing one of them is a failure to recover.
CLEAN_KINDS = frozenset({"synced", "all", "names", "prefix", "zero-tail", "zero-sectors"})
#: States checked in quick mode (a seeded sample; every ``synced`` and ``all`` state is always checked).
QUICK_SAMPLE = 400


@dataclass(frozen=True)
class Recording:
    """A recorded session: its trace, the acknowledged epochs, and the root it ran in."""

    root: str
    acks_path: str
    records: list[TraceRecord]
    epochs: list[dict[str, Any]]

    def ack_points(self) -> list[int]:
        """For each epoch, how many traced calls had happened when it was acknowledged (its ack write's index)."""
        points = []
        for index, record in enumerate(self.records):
            if record.op == "W" and record.path == self.acks_path:
                points.append(index)
        return points


@dataclass
class CrashStateReport:
    """What the replay found (``violations`` must be empty)."""

    trace_calls: int = 0
    generated: int = 0
    checked: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    refused_clean: list[str] = field(default_factory=list)
    refused_by_kind: Counter[str] = field(default_factory=Counter)
    #: The check ended at ``max_failures`` failing states (the backend fails either way).
    stopped_early: bool = False

    def line(self) -> str:
        outcomes = " ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items()))
        refused = ",".join(f"{k}:{v}" for k, v in sorted(self.refused_by_kind.items())) or "-"
        return (
            f"calls={self.trace_calls} states={self.generated} checked={self.checked} {outcomes} "
            f"refused_by_kind={refused} refused_clean={len(self.refused_clean)} violations={len(self.violations)}"
            + (" (stopped early)" if self.stopped_early else "")
        )


def record_session(
    factory: str,
    workdir: str | os.PathLike[str],
    *,
    sys_path: Sequence[str] = (),
    kwargs: Mapping[str, Any] | None = None,
    shim: str | os.PathLike[str] | None = None,
    backend: str = "asyncio",
) -> Recording:
    """Run the harness session in a child with the trace shim (built into ``workdir`` unless given)."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    for stale in ("root", "acks", "epochs.json", "trace", "states"):
        path = work / stale
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    library = Path(shim) if shim is not None else build_shim(work / "shim")
    root, acks, epochs, trace = (str(work / name) for name in ("root", "acks", "epochs.json", "trace"))
    env = shim_environment(library, record=trace, record_under=[root, acks])
    argv = [sys.executable, "-m", "dsh.session_persistence.testing._crash_driver", factory, root, acks, epochs]
    for entry in sys_path:
        argv += ["--sys-path", entry]
    argv += ["--kwargs", json.dumps(dict(kwargs or {}))]
    argv.append(f"--backend={backend}")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the recorded session failed:\n{proc.stdout}{proc.stderr}")
    return Recording(root, acks, read_trace(trace), json.loads(Path(epochs).read_text()))


def _window(points: list[int], point: int) -> int:
    """How many epochs were acknowledged once ``point`` traced calls had happened."""
    return sum(1 for ack in points if ack < point)


def _verdict(loaded: list[str] | None, epochs: list[dict[str, Any]], acked: int) -> str | None:
    """``None`` when ``loaded`` is acceptable after ``acked`` acknowledged epochs, else what is wrong."""
    current = epochs[acked - 1]["events"] if acked else None
    in_flight = epochs[acked] if acked < len(epochs) else None
    if loaded is None:
        return None if current is None else f"nothing stored after {acked} acknowledgement(s)"
    if current is not None and loaded == current:
        return None
    if in_flight is not None:
        target = in_flight["events"]
        if in_flight["kind"] == "rewrite":
            if loaded == target:
                return None
        elif loaded == target[: len(loaded)] and len(loaded) >= len(current or []):
            return None
    have = len(current or [])
    return f"loaded {len(loaded)} event(s) that are not the acknowledged log ({have}) or a prefix in flight"


def _materialize(state: CrashState, recorded_root: str, target: Path) -> None:
    prefix = recorded_root.rstrip(os.sep) + os.sep
    for path, content in state.files.items():
        if not path.startswith(prefix):
            continue
        out = target / path[len(prefix) :]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(content)


def _select(states: list[CrashState], long: bool, seed: int) -> list[CrashState]:
    if long or len(states) <= QUICK_SAMPLE:
        return states
    always = [s for s in states if s.kind in ("synced", "all")]
    rest = [s for s in states if s.kind not in ("synced", "all")]
    picked = random.Random(seed).sample(rest, max(0, QUICK_SAMPLE - len(always)))
    return always + picked


async def _load(make: Callable[[str], Any], root: Path) -> tuple[str, list[str] | None, str]:
    backend = make(str(root))
    try:
        stored = await backend.load_stored(SESSION_ID)
    except SessionPersistenceCorruptionError as exc:
        return "refused", None, str(exc)
    except Exception as exc:  # judged by the caller: never acceptable
        return "error", None, f"{type(exc).__name__}: {exc}"
    finally:
        close = getattr(backend, "aclose", None)
        if close is not None:
            await close()
    if stored is None:
        return "empty", None, ""
    wire = [encode_event(e).decode() for e in stored.events]
    return ("torn" if stored.torn_marker is not None else "loaded"), wire, ""


def check_crash_states(
    recording: Recording,
    factory: str,
    workdir: str | os.PathLike[str],
    *,
    sys_path: Sequence[str] = (),
    kwargs: Mapping[str, Any] | None = None,
    long: bool = False,
    seed: int = 0,
    max_failures: int | None = None,
) -> CrashStateReport:
    """Rebuild the crash states of ``recording`` and check each through a new backend (see the module doc).

    ``max_failures`` ends the check once that many states failed (violations and clean states refused): a
    failing backend's report then counts only the states checked so far.
    """
    make = load_factory(factory, sys_path, kwargs)
    points = recording.ack_points()
    report = CrashStateReport(trace_calls=len(recording.records))
    unique: dict[tuple[str, int], CrashState] = {}
    for state in crash_states(recording.records, cuts="all" if long else "sample", seed=seed):
        unique.setdefault((state.digest(), _window(points, state.point)), state)
    report.generated = len(unique)
    selected = _select(list(unique.values()), long, seed)
    scratch = Path(workdir) / "states"

    async def check_all() -> None:
        for number, state in enumerate(selected):
            if max_failures is not None and len(report.violations) + len(report.refused_clean) >= max_failures:
                report.stopped_early = True
                return
            target = scratch / f"state-{number}"
            _materialize(state, recording.root, target)
            outcome, loaded, detail = await _load(make, target)
            shutil.rmtree(target, ignore_errors=True)
            acked = _window(points, state.point)
            report.checked += 1
            report.kinds[state.kind] += 1
            report.outcomes[outcome] += 1
            where = f"state {state.kind} after {state.point}/{len(recording.records)} calls, {acked} acked"
            if outcome == "error":
                report.violations.append(f"{where}: {detail}")
            elif outcome == "refused":
                report.refused_by_kind[state.kind] += 1
                if state.kind in CLEAN_KINDS:
                    report.refused_clean.append(f"{where}: {detail}")
            else:
                problem = _verdict(loaded, recording.epochs, acked)
                if problem is not None:
                    report.violations.append(f"{where}: {problem}")

    anyio.run(check_all)
    return report
