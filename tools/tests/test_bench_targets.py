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


def _figures(cpu: float, served: float) -> dict[str, Any]:
    return {
        "commit": {
            "ratio": {"cpu_dsh_vs_floor": cpu, "sqlitesession_vs_dsh": 2.0, "reload_dsh_vs_raw": 1.1},
            "append": {"ratio": 9.0},
        },
        "load": {"10MB": {"ratio": 0.8}},
        "fleet": {
            "cells": {},
            "ratios": {
                "asyncio/realistic/n=1000 dsh/floor p99": 2.5,
                "asyncio/realistic/n=1000 dsh/floor served": served,
            },
        },
        "big": {"stream": {"peak_rss": 10 * 1024 * 1024}},
    }


def _verdicts(targets: ModuleType, figures: dict[str, Any]) -> dict[str, str]:
    return {row.figure: row.verdict for row in targets.target_rows(figures)}


def test_each_target_is_met_missed_or_not_measured(targets: ModuleType) -> None:
    verdicts = _verdicts(targets, _figures(cpu=1.2, served=1.0))
    assert verdicts["#34 durable commit CPU dsh/async floor"] == "met"
    assert verdicts["#34 durable commit wall dsh/async floor"] == "not measured"
    assert verdicts["#34 durable commit SQLiteSession/dsh"] == "met"
    assert verdicts["#34 Session.append / msgspec encode"] == "met"
    assert verdicts["#35 reload dsh/raw decode"] == "met"
    assert verdicts["#35 load dsh/raw at 10MB"] == "met"
    assert verdicts["#35 load dsh/raw at 100MB"] == "not measured"
    assert verdicts["#34 fleet asyncio, N = 1,000, realistic: served dsh/floor"] == "met"
    assert verdicts["#34 fleet asyncio, N = 1,000, realistic: p99 dsh/floor"] == "missed"
    assert verdicts["#34 fleet trio, N = 1,000, realistic: p99 dsh/floor"] == "not measured"
    assert verdicts["#35 iter_events over 1,000,000 events: peak RSS MB"] == "met"
    assert verdicts["#35 read_from(last 100) of 1,000,000 events: MB read"] == "not measured"


def test_the_reads_rows_are_preferred_to_section_2s_single_reloads(targets: ModuleType) -> None:
    # A full run measures the reloads twice: section 2 once per rep, the reads rows 4x as often. The table reads
    # the latter when present, for the plaintext and the sealed reload alike.
    figures = _figures(cpu=1.2, served=1.0)
    figures["commit"]["ratio"]["reload_dsh_vs_raw"] = 1.3
    figures["sealed"] = {"ratio": {"reload_sealed_vs_plaintext": 1.2}}
    verdicts = _verdicts(targets, figures)
    assert verdicts["#35 reload dsh/raw decode"] == "missed"
    assert verdicts["#35 sealed JSONL reload / plaintext"] == "missed"
    figures["reads"] = {"ratio": {"reload_dsh_vs_raw": 1.15, "resume_after_preview_vs_reload": 0.05}}
    figures["reads_sealed"] = {"ratio": {"reload_sealed_vs_plaintext": 1.1}}
    verdicts = _verdicts(targets, figures)
    assert verdicts["#35 reload dsh/raw decode"] == "met"
    assert verdicts["#35 sealed JSONL reload / plaintext"] == "met"
    assert verdicts["#35 resume after a preview / cold reload"] == "met"


def test_a_figure_past_its_bound_is_missed(targets: ModuleType) -> None:
    verdicts = _verdicts(targets, _figures(cpu=1.31, served=0.9))
    assert verdicts["#34 durable commit CPU dsh/async floor"] == "missed"
    assert verdicts["#34 fleet asyncio, N = 1,000, realistic: served dsh/floor"] == "missed"


def test_targets_from_prints_a_saved_run(tmp_path: Path) -> None:
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(_figures(cpu=1.25, served=1.0)))
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--targets-from", str(saved)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "durable commit CPU dsh/async floor" in line]
    assert len(lines) == 1 and lines[0].rstrip().endswith("met") and "1.25" in lines[0]
