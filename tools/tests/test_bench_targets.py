"""``tools/bench``'s issue #24 target table: each target reads its figure and says met, missed or not measured.

Pure logic over a figures dict (no timing): a figure on the right side of its bound is met, on the wrong side
missed, and one the run did not measure is ``not measured`` (never met). ``--targets-from`` prints the table of a
saved run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench"


@pytest.fixture(scope="module")
def targets() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        import bench_targets
    finally:
        sys.path.remove(str(BENCH))
    return bench_targets


def _figures(commit: float, served: float) -> dict[str, Any]:
    return {
        "commit": {"ratio": {"dsh_vs_raw": commit, "sqlitesession_vs_dsh": 2.0, "reload_dsh_vs_raw": 1.1}},
        "load": {"10MB": {"ratio": 0.8}},
        "fleet": {
            "cells": {
                "asyncio/realistic/n=1000/dsh": {"demanded_per_s": 100.0, "served_per_s": served},
                "asyncio/realistic/n=1000/raw_thread": {"demanded_per_s": 100.0, "served_per_s": 100.0},
            },
            "ratios": {"asyncio/realistic/n=1000 dsh/floor p99": 2.5},
        },
        "big": {"stream": {"peak_rss": 10 * 1024 * 1024}},
    }


def _verdicts(targets: ModuleType, figures: dict[str, Any]) -> dict[str, str]:
    return {row.figure: row.verdict for row in targets.target_rows(figures)}


def test_each_target_is_met_missed_or_not_measured(targets: ModuleType) -> None:
    verdicts = _verdicts(targets, _figures(commit=1.4, served=99.5))
    assert verdicts["durable commit dsh/raw"] == "met"
    assert verdicts["durable commit SQLiteSession/dsh"] == "met"
    assert verdicts["reload dsh/raw"] == "met"
    assert verdicts["load dsh/raw at 10MB"] == "met"
    assert verdicts["load dsh/raw at 100MB"] == "not measured"
    assert verdicts["fleet asyncio, N = 1,000, realistic: served/demanded (the floor served 1.00)"] == "met"
    assert verdicts["fleet asyncio, N = 1,000, realistic: p99 dsh/floor"] == "missed"
    assert verdicts["fleet trio, N = 1,000, realistic: p99 dsh/floor"] == "not measured"
    assert verdicts["iter_events over 1,000,000 events: peak RSS MB"] == "met"
    assert verdicts["read_from(last 100) of 1,000,000 events: MB read"] == "not measured"


def test_a_figure_past_its_bound_is_missed(targets: ModuleType) -> None:
    verdicts = _verdicts(targets, _figures(commit=1.6, served=90.0))
    assert verdicts["durable commit dsh/raw"] == "missed"
    assert verdicts["fleet asyncio, N = 1,000, realistic: served/demanded (the floor served 1.00)"] == "missed"


def test_targets_from_prints_a_saved_run(tmp_path: Path) -> None:
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(_figures(commit=1.4, served=99.5)))
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--targets-from", str(saved)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "durable commit dsh/raw" in line]
    assert len(lines) == 1 and lines[0].rstrip().endswith("met") and "1.40" in lines[0]
