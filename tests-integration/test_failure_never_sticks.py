"""A failure never sticks: one EIO below Python on the first append of a resumed, seeded or forked session.

Each case runs ``sticky_child.py`` in its own process with the LD_PRELOAD shim preloaded, on a real
``JsonlBackend``, under asyncio and under trio. The first ``write`` into the session's log (its staging file
for a new log) fails with EIO, once (transient) or on every attempt (persistent). Then a fresh backend, without
the shim, reads what is stored. The checks:

* transient: the next flush succeeds, later flushes and the resumed loop's turn succeed, closing is clean, and
  every event of the session is on disk, byte for byte (the failed write was retried, not stuck);
* persistent: every flush makes a new attempt (one more failed write each) and fails as a
  ``SessionStorageError``, closing raises ``SessionDisposeError`` (a ``SessionPersistenceError``, never an
  ``ExceptionGroup``), and what is stored is a prefix of the session: nothing unacknowledged was invented.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh.session_persistence.backend import encode_event
from dsh.session_persistence.testing import shim_environment, shim_or_skip
from dsh.session_persistence_jsonl import JsonlBackend
from sticky_child import SCENARIOS

HERE = Path(__file__).resolve().parent
CHILD = HERE / "sticky_child.py"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the LD_PRELOAD shim needs Linux")


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shim_or_skip(tmp_path_factory.mktemp("shim"))


def run_child(shim: Path, work: Path, scenario: str, backend: str, *, persistent: bool) -> dict[str, Any]:
    root, report, log = work / "root", work / "report.json", work / "faults.log"
    argv = [sys.executable, str(CHILD), str(root), scenario, str(report), f"--backend={backend}"]
    if persistent:
        argv.append("--persistent")
    proc = subprocess.run(argv, env=shim_environment(shim, log=log), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data: dict[str, Any] = json.loads(report.read_text())
    data["faults"] = log.read_text().splitlines() if log.exists() else []
    data["stored"] = stored_wire(root, data["target"])
    return data


def stored_wire(root: Path, session_id: str) -> list[str] | None:
    async def load() -> list[str] | None:
        stored = await JsonlBackend(root).load_stored(session_id)
        if stored is None:
            return None
        assert stored.torn_marker is None, "a torn tail was left behind"
        assert [e.seq for e in stored.events] == list(range(len(stored.events)))
        return [encode_event(e).decode() for e in stored.events]

    return anyio.run(load)


def explain(report: dict[str, Any]) -> str:
    steps = [{k: v for k, v in s.items() if k != "traceback"} for s in report["steps"]]
    tracebacks = "\n".join(s.get("traceback", "") for s in report["steps"])
    return json.dumps({"steps": steps, "faults": report["faults"]}, indent=1) + "\n" + tracebacks


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_one_eio_on_the_first_append_is_retried_by_the_next_flush(
    shim: Path, tmp_path: Path, scenario: str, backend: str
) -> None:
    report = run_child(shim, tmp_path, scenario, backend, persistent=False)
    assert len(report["faults"]) == 1, explain(report)  # the control: exactly one write failed, below Python
    for step in report["steps"]:
        assert step["ok"], explain(report)
    assert [s["step"] for s in report["steps"]][-1] == "close", explain(report)
    assert report["stored"] == report["events"], explain(report)
    # The session went on after its first write: more than the seed (or the resumed log) is on disk.
    assert len(report["events"]) > 4, explain(report)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_write_that_keeps_failing_is_retried_each_flush_and_closes_typed(
    shim: Path, tmp_path: Path, scenario: str, backend: str
) -> None:
    report = run_child(shim, tmp_path, scenario, backend, persistent=True)
    *flushes, close = report["steps"]
    assert flushes and close["step"] == "close", explain(report)
    for step in flushes:
        assert not step["ok"], explain(report)
        if step["step"] != "turn":  # a loop reports its flush failure in the turn's result instead
            assert "SessionStorageError" in step["mro"], explain(report)
    # Every flush tried the write again (the first failed write is the one started when the session bound).
    assert len(report["faults"]) >= 1 + len(flushes), explain(report)
    assert not close["ok"], explain(report)
    assert close["type"] == "SessionDisposeError", explain(report)
    assert "SessionPersistenceError" in close["mro"], explain(report)
    assert not any("ExceptionGroup" in name for name in close["mro"]), explain(report)
    stored = report["stored"] or []
    assert stored == report["events"][: len(stored)], explain(report)
