"""Smoke test for ``tools/bench``: the quick run completes and writes every figure (no timing assertions).

The bench runs in a subprocess with this interpreter (the workspace Python), peers skipped (they are installed only
in the ``bench`` hatch environment) and the PostgreSQL section skipped (keeps the smoke run fast and independent of a
server; ``hatch run bench:run --quick`` measures it). What is checked is the shape of the JSON report, so a
refactor that breaks a measurement (or silently drops a figure) fails here, whatever the machine's speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench"


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("bench")
    out = work / "out.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-peers", "--no-postgres", "--json", str(out), "--dir", str(work)],
        capture_output=True,
        text=True,
        timeout=240,  # a hang guard, never a timing check: sections 11 (~10 s) and 12 (~5-8 s) came on top of ~50 s
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(out.read_text())
    # The table went to stdout too.
    assert "write events/s [dsh]" in proc.stdout
    # Scratch data is removed when the run ends: only the report stays.
    assert sorted(p.name for p in work.iterdir()) == ["out.json"]
    return result


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


@pytest.mark.parametrize(
    "path",
    [
        ("write_events_per_s", "dsh"),
        ("write_events_per_s", "dsh_nopack"),
        ("write_events_per_s", "raw"),
        ("write_ratio", "dsh_vs_raw"),
        ("reload_s", "dsh"),
        ("load_mb_per_s", "dsh"),
        ("load_mb_per_s", "raw"),
        ("load_ratio",),
        ("load_peak_vs_raw_json",),
        ("bytes_on_disk", "dsh"),
        ("bytes_on_disk", "dsh_nopack"),
        ("bytes_on_disk", "raw"),
        ("bytes_per_event", "dsh"),
        ("bytes_vs_raw_json", "dsh"),
        ("bytes_vs_raw_json", "dsh_nopack"),
        ("list_10k_s",),
        ("flush_idle_us", "median"),
        ("flush_idle_us", "p99"),
        ("flush_one_pending_us", "median"),
        ("flush_one_pending_us", "p99"),
        ("commit", "ms_per_commit", "dsh"),
        ("commit", "ms_per_commit", "raw"),
        ("commit", "ratio", "dsh_vs_raw"),
        ("commit", "ratio", "cpu_dsh_vs_floor"),
        ("commit", "ratio", "wall_dsh_vs_floor"),
        ("commit", "cpu_us_per_commit", "floor"),
        ("commit", "append", "ratio"),
        ("commit", "reload_ms", "dsh"),
        ("commit", "reload_ms", "raw"),
        ("commit", "resume_after_preview_ms"),
        ("commit", "ratio", "resume_after_preview_vs_reload"),
        ("many_sessions", "asyncio-1", "p99_ms"),
        ("many_sessions", "asyncio-100", "p99_ms"),
        ("many_sessions", "trio-100", "p99_ms"),
        ("many_sessions", "trio-100", "cpu_us_per_barrier"),
        ("agent_loop", "events_per_turn"),
        ("agent_loop", "ms_per_turn", "none"),
        ("agent_loop", "ms_per_turn", "memory"),
        ("agent_loop", "ms_per_turn", "jsonl"),
        ("workload", "events"),
        ("workload", "durable_points"),
        ("machine", "nproc"),
        ("sealed", "ms_per_commit", "plaintext"),
        ("sealed", "ms_per_commit", "sealed"),
        ("sealed", "reload_ms", "sealed"),
        ("sealed", "load", "mb_per_s", "sealed"),
        ("sealed", "ratio", "commit_sealed_vs_plaintext"),
        ("sealed", "ratio", "reload_sealed_vs_plaintext"),
        ("sealed", "ratio", "load_mb_per_s_sealed_vs_plaintext"),
        ("sealed", "ratio", "bytes_sealed_vs_plaintext"),
    ],
    ids=lambda path: ".".join(path),
)
def test_figure_is_positive(figures: dict[str, Any], path: tuple[str, ...]) -> None:
    value: Any = figures
    for key in path:
        assert key in value, f"missing {'.'.join(path)}"
        value = value[key]
    assert _positive(value), f"{'.'.join(path)} = {value!r}"


def test_skipped_peers_are_reported_unavailable_not_zero(figures: dict[str, Any]) -> None:
    assert figures["peers"] == {"sqlitesession": "skipped", "langgraph": "skipped"}
    for name in ("sqlitesession", "langgraph"):
        assert name in figures["write_events_per_s"]
        assert figures["write_events_per_s"][name] is None
        assert figures["bytes_on_disk"][name] is None
    assert figures["write_ratio"]["dsh_vs_sqlitesession"] is None


def test_both_load_sizes_and_machine_are_reported(figures: dict[str, Any]) -> None:
    assert set(figures["load"]) == {"10MB", "100MB"}
    for entry in figures["load"].values():
        assert entry["events"] > 0
        assert entry["raw_json_bytes"] > entry["file_bytes"] > 0
    assert figures["mode"] == "quick"
    assert {"cpu", "python", "date"} <= set(figures["machine"])


def test_skipped_postgres_is_reported_unavailable_not_zero(figures: dict[str, Any]) -> None:
    assert figures["postgres"]["status"] == "skipped"
    assert figures["write_events_per_s"]["postgres"] is None
    assert figures["reload_s"]["postgres"] is None
    assert figures["load_mb_per_s"]["postgres"] is None
    assert set(figures["postgres_ratio"].values()) == {None}
    # The JSONL load figures are untouched by the postgres key.
    assert "postgres" not in figures["load"]["100MB"]["mb_per_s"]


def test_a_full_run_also_measures_the_reads_rows(figures: dict[str, Any]) -> None:
    # Issue #35's reloads with the reads section's repetitions, beside section 2's and section 11's own figures.
    assert _positive(figures["reads"]["ratio"]["reload_dsh_vs_raw"])
    assert _positive(figures["reads"]["ratio"]["resume_after_preview_vs_reload"])
    assert _positive(figures["reads_sealed"]["ratio"]["reload_sealed_vs_plaintext"])
    assert _positive(figures["commit"]["ratio"]["reload_dsh_vs_raw"])  # section 2's own, kept


def test_agent_loop_reports_persistence_per_turn_for_both_backends(figures: dict[str, Any]) -> None:
    # A difference of two timings: its sign is the machine's business, so only its presence and type are checked.
    for key in ("persistence_ms_per_turn", "persistence_cpu_ms_per_turn"):
        added = figures["agent_loop"][key]
        assert set(added) == {"memory", "jsonl"}
        assert all(isinstance(value, float) for value in added.values())
    assert figures["agent_loop"]["turns"] > 0


def test_fleet_reports_every_system_rate_and_loop(figures: dict[str, Any]) -> None:
    # Peers are skipped in the smoke run, so the fleet measures dsh and both raw floors, on asyncio and trio.
    fleet = figures["fleet"]
    (n,) = fleet["sessions"]
    for loop in ("asyncio", "trio"):
        for rate in ("realistic", "aggressive"):
            for system in ("dsh", "floor", "raw_thread", "raw_inline"):
                cell = fleet["cells"][f"{loop}/{rate}/n={n}/{system}"]
                assert "error" not in cell, cell
                assert cell["sessions"] == n
                assert cell["barriers"] > 0
                for key in ("p50_ms", "p99_ms", "served_per_s", "demanded_per_s", "cpu_us_per_barrier"):
                    assert _positive(cell[key]), f"{loop}/{rate}/{system}.{key} = {cell[key]!r}"
                assert cell["p99_ms"] >= cell["p50_ms"]
                if system == "dsh":  # its durable writes are counted: at least one per barrier's batch in all
                    assert _positive(cell["writes_per_barrier"]), cell
                else:
                    assert cell["writes_per_barrier"] is None
            assert isinstance(fleet["ratios"][f"{loop}/{rate}/n={n} dsh/floor p99"], float)
    assert not any(key.endswith(("sqlite_file", "sqlite_shared")) for key in fleet["cells"])


def test_reads_only_measures_the_read_figures_and_their_targets(tmp_path: Path) -> None:
    # --reads-only: issue #35's read figures under the keys a full run uses, so the targets table reads them.
    out = tmp_path / "reads.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--quick",
            "--reads-only",
            "--no-postgres",
            "--json",
            str(out),
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,  # a hang guard, never a timing check (~10 s)
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(out.read_text())
    for path in (
        ("commit", "reload_ms", "dsh"),
        ("commit", "reload_ms", "raw"),
        ("commit", "ratio", "reload_dsh_vs_raw"),
        ("commit", "ratio", "resume_after_preview_vs_reload"),
        ("load", "10MB", "ratio"),
        ("load", "100MB", "ratio"),
        ("sealed", "reload_ms", "sealed"),
        ("sealed", "ratio", "reload_sealed_vs_plaintext"),
    ):
        value: Any = result
        for key in path:
            value = value[key]
        assert _positive(value), f"{'.'.join(path)} = {value!r}"
    assert "write_events_per_s" not in result and "fleet" not in result  # nothing but reads was measured
    rows = [line.strip() for line in proc.stdout.splitlines()]
    assert any(row.startswith("#35 reload dsh/raw decode") for row in rows)
    assert not any(row.startswith("#34") for row in rows)  # the commit path's targets are not measured here
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reads.json"]


def test_the_window_probe_writes_only_at_barriers(tmp_path: Path) -> None:
    """``dsh_nowindow`` (``--fleet-window-probe``) pushes the write-behind window past the cell: every durable write
    is a barrier's (at most one each), where dsh's own 200 ms window also writes during a step's 500 ms stream."""
    cells = [{"system": system, "rate": "realistic", "n": 1} for system in ("dsh", "dsh_nowindow")]
    spec = json.dumps({"loop": "asyncio", "cells": cells, "seconds": 1.0, "scale": 1.0, "where": str(tmp_path)})
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--_fleet-child", spec], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dsh, probe = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert "error" not in dsh and "error" not in probe, (dsh, probe)
    assert dsh["barriers"] == probe["barriers"] == 4  # one step: pre-step, before the stream, two tool calls
    assert 0 < probe["writes_per_barrier"] <= 1.0
    assert dsh["writes_per_barrier"] > 1.0
