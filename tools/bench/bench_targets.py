"""Issue #24's targets, read off one run's figures: what each target asks, the figure, and whether it held.

A module of the ``tools/bench`` package (``python tools/bench`` runs ``__main__.py``). :func:`target_rows` is pure (a
figures dict in, rows out), so ``python tools/bench --targets-from out.json`` prints the table of an earlier run
and the smoke test checks it without timing anything. A figure the run did not measure (a skipped section, a peer
that is not installed) is ``None`` and its target ``not measured``, never met.

The first page over 100,000 sessions is measured by ``tools/bench-listing`` (it builds its own root), not here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Target", "target_rows"]

MB = 1024 * 1024


@dataclass(frozen=True)
class Target:
    figure: str
    target: str
    value: float | None
    met: bool | None  # None: not measured in this run

    @property
    def verdict(self) -> str:
        return "not measured" if self.met is None else ("met" if self.met else "missed")


def _get(figures: dict[str, Any], *path: str) -> Any:
    value: Any = figures
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _check(value: Any, test: Callable[[float], bool]) -> tuple[float | None, bool | None]:
    if not isinstance(value, (int, float)):
        return None, None
    return float(value), bool(test(float(value)))


def _served_share(figures: dict[str, Any], loop: str, rate: str, system: str) -> float | None:
    cell = _get(figures, "fleet", "cells", f"{loop}/{rate}/n=1000/{system}")
    if not isinstance(cell, dict) or not cell.get("demanded_per_s"):
        return None
    return float(cell["served_per_s"]) / float(cell["demanded_per_s"])


def target_rows(figures: dict[str, Any]) -> list[Target]:
    """Every target of issue #24 this bench measures, in the issue's order."""
    rows: list[Target] = []

    def add(figure: str, target: str, value: Any, test: Callable[[float], bool]) -> None:
        rows.append(Target(figure, target, *_check(value, test)))

    add(
        "durable commit dsh/raw",
        "<= 1.5 (goal 1.25)",
        _get(figures, "commit", "ratio", "dsh_vs_raw"),
        lambda v: v <= 1.5,
    )
    add(
        "durable commit SQLiteSession/dsh",
        ">= 1.5 (goal 2)",
        _get(figures, "commit", "ratio", "sqlitesession_vs_dsh"),
        lambda v: v >= 1.5,
    )
    add("reload dsh/raw", "<= 1.2", _get(figures, "commit", "ratio", "reload_dsh_vs_raw"), lambda v: v <= 1.2)
    add(
        "resume after a preview / cold reload",
        "<= 0.2",
        _get(figures, "commit", "ratio", "resume_after_preview_vs_reload"),
        lambda v: v <= 0.2,
    )
    for size in ("10MB", "100MB"):
        add(f"load dsh/raw at {size}", ">= 0.7", _get(figures, "load", size, "ratio"), lambda v: v >= 0.7)
    add(
        "agent loop: persistence ms per turn (JSONL)",
        "<= 2 (goal 1)",
        _get(figures, "agent_loop", "persistence_ms_per_turn", "jsonl"),
        lambda v: v <= 2,
    )
    for loop in ("asyncio", "trio"):
        prefix = f"fleet {loop}, N = 1,000"
        floor = _served_share(figures, loop, "realistic", "raw_thread")
        note = "" if floor is None else f" (the floor served {floor:.2f})"
        add(
            f"{prefix}, realistic: served/demanded{note}",
            "every demanded barrier served (>= 0.99)",
            _served_share(figures, loop, "realistic", "dsh"),
            lambda v: v >= 0.99,
        )
        ratios = _get(figures, "fleet", "ratios") or {}
        add(
            f"{prefix}, realistic: p99 dsh/floor",
            "<= 2",
            ratios.get(f"{loop}/realistic/n=1000 dsh/floor p99"),
            lambda v: v <= 2,
        )
        add(
            f"{prefix}, realistic: CPU per barrier dsh/floor",
            "<= 1.5 (goal 1.2)",
            ratios.get(f"{loop}/realistic/n=1000 dsh/floor cpu"),
            lambda v: v <= 1.5,
        )
        add(
            f"{prefix}, aggressive: served dsh/floor",
            ">= 1",
            ratios.get(f"{loop}/aggressive/n=1000 dsh/floor served"),
            lambda v: v >= 1,
        )
    stream_rss = _get(figures, "big", "stream", "peak_rss")
    add(
        "iter_events over 1,000,000 events: peak RSS MB",
        "< 64 (bounded, as in 0.2)",
        None if stream_rss is None else stream_rss / MB,
        lambda v: v < 64,
    )
    tail = _get(figures, "big", "tail", "bytes_read")
    add(
        "read_from(last 100) of 1,000,000 events: MB read",
        "< 1 (bounded, as in 0.2)",
        None if tail is None else tail / MB,
        lambda v: v < 1,
    )
    return rows


def print_targets(rows: list[Target]) -> None:
    print("\nissue #24 targets (this run)", flush=True)
    for row in rows:
        value = "unavailable" if row.value is None else f"{row.value:.2f}"
        print(f"  {row.figure:<66} {value:>10}  {row.target:<40} {row.verdict}", flush=True)
