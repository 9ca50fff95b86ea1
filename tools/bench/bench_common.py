"""What every section of ``tools/bench`` shares: the run's configuration, the report, medians and runs."""

from __future__ import annotations

import datetime
import gc
import os
import platform
import shutil
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zstandard
from dsh.session_persistence_jsonl import JsonlBackend

# --------------------------------------------------------------------------------------------------------------
# Shared by the sections


@dataclass
class WriteRun:
    seconds: float
    events: int
    bytes: int
    reload_s: float | None = None
    partial: str | None = None
    #: ``load`` right after an ``inspect`` of the same session on the same coordinator (the preparation cache).
    resume_s: float | None = None
    #: Process CPU (user + system, every thread) of the write phase, where the run measures it.
    cpu_s: float | None = None


def process_cpu_s() -> float:
    """User + system CPU of this process so far (every thread)."""
    return time.process_time()


def _jsonl(root: str, *, pack_chunks: bool = True) -> Any:
    """A ``JsonlBackend`` typed loosely: its ``NAME`` ClassVar does not match the protocol's instance attribute."""
    return JsonlBackend(root, compression="zstd", pack_chunks=pack_chunks)


def _size_of(paths: list[str]) -> int:
    return sum(os.path.getsize(p) for p in paths if os.path.exists(p))


def _tree_size(root: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total


# --------------------------------------------------------------------------------------------------------------


@dataclass
class Config:
    turns: int
    reps: int
    peer_reps: int
    langgraph_budget_s: float
    load_sizes: list[tuple[str, int]]
    flush_idle_n: int
    flush_pending_n: int
    list_count: int
    list_reps: int
    many_sessions: int = 1000
    many_seconds: float = 10.0


FULL = Config(200, 5, 3, 20.0, [("10MB", 10_000_000), ("100MB", 100_000_000)], 2000, 200, 10_000, 5)
QUICK = Config(20, 2, 1, 3.0, [("10MB", 1_000_000), ("100MB", 2_000_000)], 200, 30, 2_000, 1, 100, 2.0)


def median(values: list[float]) -> float:
    return statistics.median(values)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.date.today().isoformat(),
        "msgspec": msgspec.__version__,
        "zstandard": zstandard.__version__,
    }


@dataclass
class Report:
    figures: dict[str, Any] = field(default_factory=dict)
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def row(self, what: str, value: str, note: str = "") -> None:
        self.rows.append((what, value, note))
        print(f"  {what:<44} {value:>16}  {note}", flush=True)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "unavailable" if value is None else format(value, spec)


async def _timed_reps(
    label: str, reps: int, runs: list[tuple[str, Callable[[str], Awaitable[WriteRun]]]], scratch: str
) -> dict[str, list[WriteRun]]:
    out: dict[str, list[WriteRun]] = {name: [] for name, _ in runs}
    for rep in range(reps):
        for name, run in runs:
            where = os.path.join(scratch, f"{label}-{name}-{rep}")
            gc.collect()
            out[name].append(await run(where))
            shutil.rmtree(where, ignore_errors=True)
    return out


# The package directory: ``python <it> --_x-child ...`` starts a measurement in a fresh process.
ENTRY = os.path.dirname(os.path.abspath(__file__))
