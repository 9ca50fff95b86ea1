"""Issues #34's and #35's targets, read off one run's figures: what each target asks, the figure, and whether it held.

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


def target_rows(figures: dict[str, Any]) -> list[Target]:
    """Every target of issues #34 (the commit path) and #35 (reads) this bench measures, in the issues' order.

    Each speed target is a ratio to a baseline measured in the same run: the async floor (DESIGN §12) for the
    commit path, a raw decode for reads.
    """
    rows: list[Target] = []

    def add(figure: str, target: str, value: Any, test: Callable[[float], bool]) -> None:
        rows.append(Target(figure, target, *_check(value, test)))

    commit = ("commit", "ratio")
    add(
        "#34 durable commit CPU dsh/async floor",
        "<= 1.3 (goal 1.1)",
        _get(figures, *commit, "cpu_dsh_vs_floor"),
        lambda v: v <= 1.3,
    )
    add("#34 durable commit wall dsh/async floor", "<= 1.2", _get(figures, *commit, "wall_dsh_vs_floor"), _le(1.2))
    add(
        "#34 durable commit SQLiteSession/dsh",
        ">= 1.25",
        _get(figures, *commit, "sqlitesession_vs_dsh"),
        lambda v: v >= 1.25,
    )
    add("#34 Session.append / msgspec encode", "<= 10", _get(figures, "commit", "append", "ratio"), _le(10))
    add(
        "#34 agent loop: persistence CPU per turn / (barriers x floor)",
        "<= 1.3",
        _get(figures, "agent_loop", "persistence_cpu_vs_floor"),
        _le(1.3),
    )
    ratios = _get(figures, "fleet", "ratios") or {}
    for loop in ("asyncio", "trio"):
        prefix = f"#34 fleet {loop}, N = 1,000"
        add(
            f"{prefix}, realistic: served dsh/floor",
            ">= 1",
            ratios.get(f"{loop}/realistic/n=1000 dsh/floor served"),
            lambda v: v >= 1,
        )
        add(
            f"{prefix}, realistic: CPU per barrier dsh/floor",
            "<= 1.3",
            ratios.get(f"{loop}/realistic/n=1000 dsh/floor cpu"),
            _le(1.3),
        )
        add(
            f"{prefix}, realistic: p99 dsh/floor",
            "<= 2",
            ratios.get(f"{loop}/realistic/n=1000 dsh/floor p99"),
            _le(2),
        )
        add(
            f"{prefix}, aggressive: served dsh/floor",
            ">= 1",
            ratios.get(f"{loop}/aggressive/n=1000 dsh/floor served"),
            lambda v: v >= 1,
        )
    # The reads figures (``--reads-only``, or a full run's reads rows) have 4x the reloads of section 2's: preferred.
    reads = ("reads", "ratio") if "reads" in figures else commit
    add("#35 reload dsh/raw decode", "<= 1.2 (goal 1.0)", _get(figures, *reads, "reload_dsh_vs_raw"), _le(1.2))
    for size in ("10MB", "100MB"):
        add(f"#35 load dsh/raw at {size}", ">= 0.8", _get(figures, "load", size, "ratio"), lambda v: v >= 0.8)
    add(
        "#35 sealed JSONL reload / plaintext",
        "<= 1.15",
        _get(figures, "reads_sealed" if "reads_sealed" in figures else "sealed", "ratio", "reload_sealed_vs_plaintext"),
        _le(1.15),
    )
    add(
        "#35 sealed PostgreSQL load / plaintext (MB/s)",
        ">= 0.7",
        _get(figures, "postgres", "sealed", "load", "ratio"),
        lambda v: v >= 0.7,
    )
    add(
        "#35 resume after a preview / cold reload",
        "<= 0.2",
        _get(figures, *reads, "resume_after_preview_vs_reload"),
        _le(0.2),
    )
    stream_rss = _get(figures, "big", "stream", "peak_rss")
    add(
        "#35 iter_events over 1,000,000 events: peak RSS MB",
        "< 64 (bounded, as in 0.3)",
        None if stream_rss is None else stream_rss / MB,
        lambda v: v < 64,
    )
    tail = _get(figures, "big", "tail", "bytes_read")
    add(
        "#35 read_from(last 100) of 1,000,000 events: MB read",
        "< 1 (bounded, as in 0.3)",
        None if tail is None else tail / MB,
        lambda v: v < 1,
    )
    return rows


def _le(bound: float) -> Callable[[float], bool]:
    return lambda v: v <= bound


def print_targets(rows: list[Target]) -> None:
    print("\nissue #34 and #35 targets (this run)", flush=True)
    for row in rows:
        value = "unavailable" if row.value is None else f"{row.value:.2f}"
        print(f"  {row.figure:<66} {value:>10}  {row.target:<40} {row.verdict}", flush=True)
