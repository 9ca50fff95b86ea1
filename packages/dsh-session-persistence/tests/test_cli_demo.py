"""``dsh-sessions demo`` end to end, once: a real child process, a real SIGKILL mid-tool, a real resume.

Then the commands the demo tells the user to run, with the exact ``--root`` it printed. POSIX only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the demo needs SIGKILL")

SCRIPT = Path(sys.executable).with_name("dsh-sessions")  # the installed console script


def dsh_sessions(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert SCRIPT.exists(), f"the console script is not installed next to {sys.executable}"
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, timeout=100, check=False, env=env)


def test_demo_kills_resumes_and_explains(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    sessions = tmp_path / "sessions"
    env = {**os.environ, "DSH_SESSIONS_ROOT": str(sessions), "TMPDIR": str(temp)}
    result = dsh_sessions("demo", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    match = re.search(r"^root: (.+)$", out, re.MULTILINE)
    assert match is not None, out
    root = Path(match.group(1))
    assert root == sessions  # the root it was given, not a new folder under it
    found = re.search(r"^session: (demo-booking-\S+) ", out, re.MULTILINE)
    work_line = re.search(r"^work: (\S+) ", out, re.MULTILINE)
    assert found is not None and work_line is not None, out
    session_id, work = found.group(1), Path(work_line.group(1))
    assert work.parent == temp  # the agent's files live outside the session root
    assert "was killed with SIGKILL (exit status -9)" in out
    assert "append tool/result TOOL_OUTCOME_UNKNOWN for call call-deposit" in out
    assert "append tool/result TOOL_NOT_STARTED for call call-receipt" in out
    assert "pay_deposit [call-deposit]  [REPAIRED: TOOL_OUTCOME_UNKNOWN]" in out
    assert "send_receipt [call-receipt]  [REPAIRED: TOOL_NOT_STARTED]" in out
    assert "turn 2 ended: interrupted  [REPAIRED: closed by crash repair]" in out
    assert "--- resumed here" in out and "turn 3 ended: completed" in out
    assert "What the repairs mean:" in out
    # The side effect happened exactly once: the resumed agent checked instead of paying again.
    assert sorted(os.listdir(work / "ledger")) == ["call-deposit"]
    assert sorted(os.listdir(work / "outbox")) == ["call-receipt-retry"]
    # Printed with this installation's script (bare "dsh-sessions" when PATH finds it), then the exact --root.
    commands = re.findall(r"^  \S*dsh-sessions (--root .+)$", out, re.MULTILINE)
    assert commands == [f"--root {root} list", f"--root {root} show {session_id}", f"--root {root} verify"]
    for command in commands:
        follow = dsh_sessions(*command.split(), env=env)
        assert follow.returncode == 0, follow.stderr
    verify = dsh_sessions("--root", str(root), "verify", "--json")
    report = json.loads(verify.stdout)
    assert report["ok"] is True and [s["status"] for s in report["sessions"]] == ["ok"]
    listed = dsh_sessions("list", "--json", env=env)  # the same root, from the environment
    assert [s["id"] for s in json.loads(listed.stdout)["sessions"]] == [session_id]
    show = dsh_sessions("--root", str(root), "show", session_id, "--json")
    entries = json.loads(show.stdout)["entries"]
    repairs = [(e.get("callId"), e["repair"]) for e in entries if "repair" in e]
    assert repairs == [
        ("call-deposit", "TOOL_OUTCOME_UNKNOWN"),
        ("call-receipt", "TOOL_NOT_STARTED"),
        (None, "interrupted"),
    ]
    assert not any(e.get("pending") for e in entries)  # the resume committed the repair
