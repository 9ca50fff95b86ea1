"""Storage faults injected below Python (an LD_PRELOAD shim built here) into a real coordinator + JSONL session.

Each scenario (``fault_child.py``) runs in its own process with the shim preloaded: EIO or ENOSPC on write,
fsync, link, the directory fsync after link, rename, and ftruncate during the rollback of a failed append,
with and without the call having landed first. After the child is done, a fresh backend (no shim) reloads the
session and the checks are:

* nothing acknowledged is lost: every event a returned flush covered is stored, byte for byte;
* nothing is duplicated and the log is consistent: the reload succeeds with contiguous seqs;
* nothing is wedged: once the fault is gone, the next flush succeeds;
* every failure the application sees is a ``SessionStorageError`` (a ``SessionPersistenceError``), never a bare
  ``OSError`` or ``ExceptionGroup``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh.session_persistence.backend import encode_event
from dsh.session_persistence.testing import shim_environment, shim_or_skip
from dsh.session_persistence_jsonl import JsonlBackend
from fault_child import PERSISTENT, SESSION_ID, scenarios

HERE = Path(__file__).resolve().parent
CHILD = HERE / "fault_child.py"
SCENARIOS = sorted(scenarios("/d", "f"))
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the LD_PRELOAD shim needs Linux")


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shim_or_skip(tmp_path_factory.mktemp("shim"))


def run_child(shim: Path, root: Path, compression: str, scenario: str, backend: str) -> dict[str, Any]:
    report = root.parent / f"report-{scenario}.json"
    log = root.parent / "faults.log"
    env = shim_environment(shim, log=log)
    argv = [sys.executable, str(CHILD), str(root), compression, scenario, str(report), f"--backend={backend}"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data: dict[str, Any] = json.loads(report.read_text())
    data["faults"] = log.read_text().splitlines() if log.exists() else []
    return data


def stored_wire(root: Path, compression: str) -> list[str]:
    async def load() -> list[str]:
        backend = JsonlBackend(root, compression=compression)  # type: ignore[arg-type]
        stored = await backend.load_stored(SESSION_ID)
        assert stored is not None, "nothing stored"
        assert [e.seq for e in stored.events] == list(range(len(stored.events)))
        return [encode_event(e).decode() for e in stored.events]

    return anyio.run(load)


@pytest.fixture(scope="module", params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def reports(shim: Path, compression: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run every scenario once per encoding (asyncio and trio alternate), keep each report and reload."""
    out: dict[str, Any] = {}
    for index, scenario in enumerate(SCENARIOS):
        work = tmp_path_factory.mktemp(f"{compression}-{scenario}")
        root = work / "root"
        report = run_child(shim, root, compression, scenario, ["asyncio", "trio"][index % 2])
        try:
            report["stored"] = stored_wire(root, compression)
            report["reload_error"] = None
        except Exception as exc:  # judged by the tests below
            report["stored"] = None
            report["reload_error"] = f"{type(exc).__name__}: {exc}"
        out[scenario] = report
    return out


def explain(report: dict[str, Any]) -> str:
    steps = [{k: v for k, v in s.items() if k != "traceback"} for s in report["steps"]]
    tracebacks = "\n".join(s.get("traceback", "") for s in report["steps"])
    return json.dumps({"steps": steps, "faults": report["faults"], "reload": report["reload_error"]}, indent=1) + (
        "\n" + tracebacks
    )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_fault_was_injected(reports: dict[str, Any], scenario: str) -> None:
    """A control: the shim really failed a call in every scenario (the coordinator may then settle it)."""
    report = reports[scenario]
    assert report["faults"], explain(report)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_nothing_acknowledged_is_lost_or_duplicated(reports: dict[str, Any], scenario: str) -> None:
    report = reports[scenario]
    assert report["reload_error"] is None, explain(report)
    stored, acked = report["stored"], report["acked"]
    assert stored[: len(acked)] == acked, explain(report)
    assert len(stored) == len(set(stored)), explain(report)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_session_is_wedged_once_the_fault_is_gone(reports: dict[str, Any], scenario: str) -> None:
    report = reports[scenario]
    last = report["steps"][-1]
    assert last["step"] == "turn3" and last["ok"], explain(report)
    assert len(report["acked"]) == 9, explain(report)
    assert report["stored"] == report["acked"], explain(report)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_failure_is_a_typed_storage_error(reports: dict[str, Any], scenario: str) -> None:
    report = reports[scenario]
    for step in report["steps"]:
        if not step["ok"]:
            assert "SessionStorageError" in step["mro"], explain(report)
            assert "SessionPersistenceError" in step["mro"], explain(report)


def test_the_shim_builds_from_the_shipped_source(shim: Path) -> None:
    assert shim.is_file() and os.access(shim, os.R_OK)


@pytest.mark.parametrize("scenario", sorted(PERSISTENT))
def test_a_write_no_sync_covered_is_never_acknowledged(reports: dict[str, Any], scenario: str) -> None:
    """While every sync of the write fails (file fsync with a failing rollback, or the directory fsync after the
    link), the page cache holds it but proves nothing: the flush and its armed retry fail typed, and the write is
    acknowledged only once a sync succeeded (after the fault is healed)."""
    report = reports[scenario]
    armed = [s for s in report["steps"] if s["step"] in ("turn1", "turn1-armed-again", "turn2", "turn2-armed-again")]
    failed = [s for s in armed if not s["ok"]]
    assert len(failed) == 2, explain(report)
    for step in failed:
        assert "SessionWriteInDoubtError" in step["mro"], explain(report)
    retry = next(s for s in report["steps"] if s["step"] == "retry")
    assert retry["ok"], explain(report)
