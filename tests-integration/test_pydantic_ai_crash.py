"""pydantic-ai under a real SIGKILL mid-tool, after the tool's side effect: with ``DshDurability`` the resumed
process continues the cut run, the side effect stays at one and the model's next request carries the honest
result; on bare pydantic-ai (history saved after each run, as its docs show) the same program repeats the effect.
The README's own program goes through the same kill."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from dsh.session_persistence.loop import TOOL_RECONCILED_HAPPENED_TEXT
from dsh.session_persistence.repair import TOOL_OUTCOME_UNKNOWN_TEXT

CHILD = Path(__file__).resolve().parent / "pydantic_ai_child.py"
README = Path(__file__).resolve().parents[1] / "packages" / "dsh-session-pydantic-ai" / "README.md"
SENT = "sent to bob@example.com"
# The README program's tool body, given a side effect the test can count and, in the first process, a wait for the kill.
SIDE_EFFECT = """\
    import os
    with open(os.environ["LEDGER"], "a", encoding="utf-8") as out:
        out.write(f"sent to {to}\\n")
    if os.environ.get("CRASH"):
        print("ready", flush=True)
        await anyio.sleep_forever()"""


def run_child(mode: str, root: Path, ledger: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), mode, str(root), str(ledger)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_when_ready(child: subprocess.Popen[str]) -> None:
    """Wait until the child's tool body ran its side effect and blocks, then SIGKILL it."""
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 120)
        assert ready, "the child never became ready"
        line = child.stdout.readline()
        assert line.strip() == "ready", (line, child.stderr.read() if child.stderr else "")
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL


def crash(mode: str, root: Path, ledger: Path) -> None:
    kill_when_ready(run_child(mode, root, ledger))
    assert ledger.read_text(encoding="utf-8").splitlines() == [SENT]


def resume(mode: str, root: Path, ledger: Path) -> dict[str, Any]:
    child = run_child(mode, root, ledger)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report


def show(root: Path) -> str:
    cli = os.path.join(os.path.dirname(sys.executable), "dsh-sessions")
    shown = subprocess.run(
        [cli, "--root", str(root), "show", "pydantic-crash"], capture_output=True, text=True, timeout=60, check=False
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def test_sigkill_mid_tool_then_the_cut_run_continues_with_the_honest_result_and_no_second_effect(
    tmp_path: Path,
) -> None:
    root, ledger = tmp_path / "sessions", tmp_path / "ledger.txt"
    crash("crash", root, ledger)
    report = resume("resume", root, ledger)
    (part,) = report["request"]  # the model's next request: the cut call, answered honestly, and no new prompt
    assert (part["part_kind"], part["tool_name"], part["tool_call_id"]) == ("tool-return", "send_email", "call-1")
    assert part["content"] == TOOL_OUTCOME_UNKNOWN_TEXT
    assert report["output"] == f"send_email said: {TOOL_OUTCOME_UNKNOWN_TEXT}"
    assert ledger.read_text(encoding="utf-8").splitlines() == [SENT]  # the tool body ran once, before the kill
    shown = show(root)
    assert "turn 1 ended: interrupted" in shown
    assert "turn 2 ended: completed" in shown


def test_a_reconciliation_check_answers_the_cut_call_with_what_happened(tmp_path: Path) -> None:
    root, ledger = tmp_path / "sessions", tmp_path / "ledger.txt"
    crash("crash", root, ledger)
    report = resume("resume-check", root, ledger)
    (part,) = report["request"]
    assert part["tool_call_id"] == "call-1"
    assert part["content"] == f"{TOOL_RECONCILED_HAPPENED_TEXT}\n\n{SENT}"
    assert ledger.read_text(encoding="utf-8").splitlines() == [SENT]
    assert "reconciled send_email [call-1]: happened (found in the outbox)" in show(root)


def test_bare_pydantic_ai_repeats_the_side_effect_after_the_same_crash(tmp_path: Path) -> None:
    # The measured difference the README states: the same program, history kept the way pydantic-ai's docs show.
    root, ledger = tmp_path / "bare", tmp_path / "ledger.txt"
    crash("bare-crash", root, ledger)
    report = resume("bare-resume", root, ledger)
    assert ledger.read_text(encoding="utf-8").splitlines() == [SENT, SENT]  # the email went out twice
    (part,) = report["request"]
    assert part["part_kind"] == "tool-return"
    assert part["content"] == SENT  # the model is told the second send worked, nothing of the first


def test_the_readme_program_survives_sigkill_mid_tool(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^```python\n(.*?)^```$", text[text.index("<!-- example: durable-agent -->") :], re.M | re.S)
    assert match is not None
    assert "    ...  # the side effect" in match.group(1)
    script = tmp_path / "durable_agent.py"
    script.write_text(match.group(1).replace("    ...  # the side effect", SIDE_EFFECT), encoding="utf-8")
    ledger, root = tmp_path / "ledger.txt", str(tmp_path / "sessions")
    env = {**os.environ, "LEDGER": str(ledger)}
    first = subprocess.Popen(
        [sys.executable, str(script), root],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "CRASH": "1"},
    )
    kill_when_ready(first)
    assert ledger.read_text(encoding="utf-8").splitlines() == ["sent to a"]
    second = subprocess.run(
        [sys.executable, str(script), root], capture_output=True, text=True, timeout=120, check=False, env=env
    )
    assert second.returncode == 0, second.stderr
    # TestModel answers with the tool returns it was handed: the honest one, and the email went out once.
    assert json.loads(second.stdout) == {"send_email": TOOL_OUTCOME_UNKNOWN_TEXT}
    assert ledger.read_text(encoding="utf-8").splitlines() == ["sent to a"]
