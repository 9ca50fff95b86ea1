"""The Agents SDK integration under a real SIGKILL: a tool call is durable before its body runs, and the next run
hands the model the call with a ``TOOL_OUTCOME_UNKNOWN`` output instead of running the tool again. Also: a second
writer on the same session (another process) is refused by the writer lease."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dsh.session_openai_agents import DshSession
from dsh.session_persistence import SessionLockedError, open_sessions
from dsh.session_persistence.repair import TOOL_OUTCOME_UNKNOWN_TEXT

pytestmark = pytest.mark.anyio

CHILD = Path(__file__).resolve().parent / "openai_agents_child.py"


def start(mode: str, root: Path, ledger: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    return subprocess.Popen(
        [sys.executable, str(CHILD), mode, str(root), str(ledger)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_ready(child: subprocess.Popen[str]) -> None:
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], 120)
    assert ready, "the child never became ready"
    line = child.stdout.readline()
    assert line.strip() == "ready", (line, child.stderr.read() if child.stderr else "")


def kill(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)  # reaps it and closes the pipes
    assert child.returncode == -signal.SIGKILL


def test_sigkill_mid_tool_then_the_model_sees_outcome_unknown_and_the_tool_is_not_rerun(tmp_path: Path) -> None:
    root, ledger = tmp_path / "sessions", tmp_path / "ledger.txt"
    child = start("crash", root, ledger)
    try:
        wait_ready(child)  # the tool body ran its side effect and is blocked
    finally:
        kill(child)
    assert ledger.read_text(encoding="utf-8").splitlines() == ["sent to bob@example.com"]
    resumed = start("resume", root, ledger)
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    items = report["input"]
    calls = [i for i in items if i.get("type") == "function_call"]
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert [(c["call_id"], c["name"]) for c in calls] == [("call-1", "send_email")]
    assert outputs == [{"type": "function_call_output", "call_id": "call-1", "output": TOOL_OUTCOME_UNKNOWN_TEXT}]
    assert items[0] == {"role": "user", "content": "Email Bob."}
    assert items[-1] == {"role": "user", "content": "Did it go out?"}
    assert report["output"].startswith("I could not confirm")
    # The tool body ran exactly once, before the kill.
    assert ledger.read_text(encoding="utf-8").splitlines() == ["sent to bob@example.com"]
    shown = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "dsh-sessions"), "--root", str(root), "show", "agents-crash"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "send_email" in shown.stdout and "turn 1 ended: interrupted" in shown.stdout


def test_without_the_hooks_the_child_is_warned_before_the_tool_runs(tmp_path: Path) -> None:
    # Without DurableRunHooks the SDK hands the call to the session only after the tool: not durable mid-tool.
    # The session says so, once, in our warning category, before the model is even asked.
    root, ledger = tmp_path / "sessions", tmp_path / "ledger.txt"
    child = start("crash-nohooks", root, ledger)
    try:
        wait_ready(child)
    finally:
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert err.count("NotDurableWarning") == 1, err
    assert "hooks=DurableRunHooks(session)" in err


async def test_a_second_writer_is_refused_by_the_writer_lease(tmp_path: Path) -> None:
    root, ledger = tmp_path / "sessions", tmp_path / "ledger.txt"
    child = start("hold", root, ledger)
    try:
        wait_ready(child)
        async with open_sessions(root) as sessions:
            session = DshSession(sessions, "agents-crash")
            with pytest.raises(SessionLockedError):
                await session.get_items()
    finally:
        kill(child)
    async with open_sessions(root) as sessions, DshSession(sessions, "agents-crash") as session:
        assert await session.get_items() == [{"role": "user", "content": "held"}]  # the kernel freed the lease
