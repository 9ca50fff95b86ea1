"""Real crashes around the resumed turn: SIGKILL inside a tool, inside a reconciliation check, inside the continuation.

A child (``continue_child.py``) runs a payment agent on the JSONL backend with the checkpoint policy; the parent kills
it with SIGKILL at a marker, then starts a fresh child that resumes: ``AgentLoop.resume`` reconciles unknown outcomes
against the ledger, ``continue_interrupted`` carries on the cut turn. Checked from outside: the ledger and the
outbox (one file per call id, created O_EXCL), what each model request showed (``requests.jsonl``), and the stored
log read back by a fresh reader (balanced, valid, every event stored before a kill still there byte for byte).
POSIX only; every phase runs on asyncio and trio and on both JSONL encodings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh.session_persistence import Host
from dsh.session_persistence.backend import encode_event
from dsh.session_persistence.loop import TOOL_RECONCILED_HAPPENED_TEXT
from dsh.session_persistence.repair import TOOL_OUTCOME_UNKNOWN_TEXT

pytestmark = pytest.mark.skipif(os.name != "posix", reason="needs POSIX signals")

CHILD = Path(__file__).resolve().parent / "continue_child.py"
SESSION_ID = "continue-crash"
READY_TIMEOUT_S = 60.0
COMBOS = [("asyncio", "none"), ("trio", "zstd"), ("asyncio", "zstd"), ("trio", "none")]


def child(
    root: Path, phase: str, backend: str, compression: str, *, kill_in: str = "nowhere", check: str = "ok"
) -> int:
    """Run one child phase; with ``kill_in`` SIGKILL it at that marker. Returns its exit status."""
    marker = root / "marker"
    marker.write_bytes(b"")
    argv = [sys.executable, str(CHILD), phase, str(root), str(marker), f"--backend={backend}"]
    argv += [f"--compression={compression}", f"--kill-in={kill_in}", f"--check={check}"]
    with (root / "child.stderr").open("ab") as stderr:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while kill_in != "nowhere" and marker.read_text() != kill_in:
            if proc.poll() is not None:
                raise AssertionError(f"child exited {proc.returncode} before {kill_in}: {_stderr(root)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"child never reached {kill_in}: {_stderr(root)}")
            time.sleep(0.01)
        if kill_in != "nowhere":
            proc.kill()
        return proc.wait(timeout=READY_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _stderr(root: Path) -> str:
    return (root / "child.stderr").read_text(errors="replace")[-3000:]


def stored(root: Path, compression: str) -> list[Any]:
    """The stored events as a fresh 0.3 reader decodes and validates them (read-only, no repair)."""

    async def read() -> list[Any]:
        host = Host()
        host.load_entrypoints()
        backend: Any = host.dsh_session_backends()["jsonl"](root / "sessions", compression=compression)
        log = await backend.load_stored(SESSION_ID)
        return list(log.events)

    return anyio.run(read)


def requests(root: Path) -> list[list[dict[str, Any]]]:
    return [json.loads(line) for line in (root / "requests.jsonl").read_text().splitlines()]


def result(root: Path) -> dict[str, Any]:
    return json.loads((root / "result.json").read_text())  # type: ignore[no-any-return]


def charge_texts(request: list[dict[str, Any]]) -> list[str]:
    """The texts the model was shown as the result of call ``charge-1``."""
    out = []
    for message in request:
        for block in message["content"]:
            if block.get("toolCallId") == "charge-1":
                out.append(" ".join(b.get("text", "") for b in block["content"]))
    return out


def assert_prefix(before: list[Any], after: list[Any]) -> None:
    """Every event stored before is stored after, byte for byte (nothing acknowledged lost or rewritten)."""
    assert [encode_event(e) for e in after[: len(before)]] == [encode_event(e) for e in before]


@pytest.mark.parametrize(("backend", "compression"), COMBOS)
def test_continued_turn_completes_without_a_second_charge(tmp_path: Path, backend: str, compression: str) -> None:
    assert child(tmp_path, "start", backend, compression, kill_in="charge") == -9
    assert sorted(os.listdir(tmp_path / "ledger")) == ["charge-1"]
    before = stored(tmp_path, compression)
    assert child(tmp_path, "resume", backend, compression) == 0, _stderr(tmp_path)
    outcome = result(tmp_path)
    [finding] = outcome["findings"]
    assert (finding["callId"], finding["outcome"]) == ("charge-1", "happened")
    assert outcome["continued"] == [{"turn": 2, "reason": "completed", "text": "Paid once and notified."}]
    # The model's first request after the crash shows the finding in the charge's place, not "unknown".
    first_after = requests(tmp_path)[1]
    [text] = charge_texts(first_after)
    assert text.startswith(TOOL_RECONCILED_HAPPENED_TEXT) and "charged 20 EUR" in text
    assert TOOL_OUTCOME_UNKNOWN_TEXT not in json.dumps(first_after)
    assert first_after[0]["content"][0]["text"].startswith("Charge the 20 EUR")
    assert not any(m["role"] == "user" and m["source"]["kind"] == "user" for m in first_after[1:])  # no new message
    assert sorted(os.listdir(tmp_path / "ledger")) == ["charge-1"]  # charged once
    assert len(os.listdir(tmp_path / "outbox")) == 1
    after = stored(tmp_path, compression)
    assert_prefix(before, after)
    types = [e.type for e in after]
    assert types.count("turn/continue") == 1 and types[-1] == "turn/end"
    start = types.index("turn/continue")
    assert types[start - 1] == "turn/start" and types.index("tool/reconcile") < start - 1


@pytest.mark.parametrize(("backend", "compression"), COMBOS[:2])
def test_crash_during_reconciliation_then_during_continuation_repairs_and_continues(
    tmp_path: Path, backend: str, compression: str
) -> None:
    assert child(tmp_path, "start", backend, compression, kill_in="charge") == -9
    first = stored(tmp_path, compression)
    # Killed inside the charge check: nothing was recorded, nothing is lost; the next resume checks again.
    assert child(tmp_path, "resume", backend, compression, kill_in="check") == -9
    second = stored(tmp_path, compression)
    assert_prefix(first, second)
    assert "tool/reconcile" not in [e.type for e in second]
    # Killed inside the continuation's notify: the finding and the continuation start were flushed before.
    assert child(tmp_path, "resume", backend, compression, kill_in="notify") == -9
    third = stored(tmp_path, compression)
    assert_prefix(second, third)
    assert [e.type for e in third].count("tool/reconcile") == 1 and "turn/continue" in [e.type for e in third]
    assert child(tmp_path, "resume", backend, compression) == 0, _stderr(tmp_path)
    outcome = result(tmp_path)
    # The notify of turn 2 was reconciled too (its check found the outbox entry), and turn 3 continued turn 2.
    assert [(f["callId"], f["outcome"]) for f in outcome["findings"]] == [
        ("charge-1", "happened"),
        ("notify-4", "happened"),
    ]
    assert outcome["continued"] == [{"turn": 3, "reason": "completed", "text": "Paid once and notified."}]
    assert sorted(os.listdir(tmp_path / "ledger")) == ["charge-1"]
    assert sorted(os.listdir(tmp_path / "outbox")) == ["notify-4"]  # notified once, never re-run
    final = stored(tmp_path, compression)
    assert_prefix(third, final)
    continues = [e.data for e in final if e.type == "turn/continue"]
    assert [(c.turn, c.interrupted_turn) for c in continues] == [(2, 1), (3, 2)]


@pytest.mark.parametrize("check", ["raise", "hang", "cannot-tell"])
@pytest.mark.parametrize(("backend", "compression"), COMBOS[:2])
def test_a_check_that_cannot_tell_leaves_the_unknown_outcome_text(
    tmp_path: Path, backend: str, compression: str, check: str
) -> None:
    assert child(tmp_path, "start", backend, compression, kill_in="charge") == -9
    assert child(tmp_path, "resume", backend, compression, check=check) == 0, _stderr(tmp_path)
    [finding] = result(tmp_path)["findings"]
    assert finding["outcome"] == "unknown" and "message" not in finding
    assert {"raise": "ConnectionError", "hang": "within 0.5s", "cannot-tell": "migrated"}[check] in finding["detail"]
    [text] = charge_texts(requests(tmp_path)[1])
    assert text == TOOL_OUTCOME_UNKNOWN_TEXT
    assert sorted(os.listdir(tmp_path / "ledger")) == ["charge-1"]


def test_a_tool_without_a_check_is_not_reconciled(tmp_path: Path) -> None:
    assert child(tmp_path, "start", "asyncio", "none", kill_in="charge") == -9
    assert child(tmp_path, "resume", "asyncio", "none", check="none") == 0, _stderr(tmp_path)
    assert result(tmp_path)["findings"] == []
    [text] = charge_texts(requests(tmp_path)[1])
    assert text == TOOL_OUTCOME_UNKNOWN_TEXT


@pytest.mark.parametrize(("backend", "compression"), COMBOS[:2])
def test_findings_are_durable_when_resume_returns(tmp_path: Path, backend: str, compression: str) -> None:
    assert child(tmp_path, "start", backend, compression, kill_in="charge") == -9
    assert child(tmp_path, "resume", backend, compression, kill_in="resumed") == -9
    [finding] = [e for e in stored(tmp_path, compression) if e.type == "tool/reconcile"]
    assert (finding.data.call_id, finding.data.outcome) == ("charge-1", "happened")
