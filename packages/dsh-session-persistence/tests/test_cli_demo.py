"""``dsh-sessions demo`` end to end, once: a real child process, a real SIGKILL mid-tool, a real resume.

Then the commands the demo tells the user to run, with the exact ``--root`` it printed. POSIX only.
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dsh.session_persistence._cli import _main
from dsh.session_persistence._cli._io import Io

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
    # Reconciled against the ledger, then the cut turn continued without a new user message.
    assert "reconciled pay_deposit [call-deposit]: happened (found in the ledger: charged once)" in out
    assert "[REPAIRED: TOOL_OUTCOME_UNKNOWN] [RECONCILED: happened" in out
    assert "(continues interrupted turn 2: no new user message)" in out
    assert "turn 3 continued the interrupted turn 2 and ended completed" in out
    assert "Please don't pay twice" not in out  # no new user message
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
    resume = json.loads(show.stdout)["resume"]
    assert [(f["callId"], f["outcome"]) for f in resume["reconciled"]] == [("call-deposit", "happened")]
    assert resume["continued"] == [{"turn": 3, "interruptedTurn": 2}]
    assert [e["kind"] for e in entries].count("user") == 2  # turns 1 and 2 only: the continuation needed none


# --- a real model: the options, and the adapter distribution missing ---------------------------------------------


def run_in_process(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = _main.run(argv, Io(out=out, err=err, inp=io.StringIO()))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--base-url", "http://127.0.0.1:9/v1"], "--base-url needs --model NAME"),
        (["--api-key", "k"], "--api-key needs --model NAME"),
        (["--model", "m"], "set $OPENAI_API_KEY (or --api-key KEY)"),
        (["--model", "", "--api-key", "k"], "--base-url needs --model NAME"),
    ],
)
def test_incomplete_real_model_options_are_usage_errors_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], says: str
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    root = tmp_path / "never-created"
    code, out, err = run_in_process(["--root", str(root), "demo", *argv])
    assert (code, out) == (2, ""), err
    assert says in err
    assert not root.exists()


def site_without_the_adapter(tmp_path: Path, *, broken: bool = False) -> Path:
    """The site-packages holding this installation, mirrored by symlinks minus dsh-session-adapter-openai's files.

    A real install layout where the adapter distribution is absent (no dist-info, no path entry), whether or not
    the test environment has it. ``broken``: in its place, an installed distribution of that name whose
    ``dsh.session.adapters`` entry point names a module that is not there (a half-removed install).
    """
    site = Path(str(importlib.metadata.distribution("dsh-session-persistence").locate_file("")))
    mirror = tmp_path / "site"
    mirror.mkdir()
    for entry in site.iterdir():
        if "dsh_session_adapter_openai" not in entry.name:
            (mirror / entry.name).symlink_to(entry)
    if broken:
        info = mirror / "dsh_session_adapter_openai-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dsh-session-adapter-openai\nVersion: 0.1.0\n")
        (info / "entry_points.txt").write_text("[dsh.session.adapters]\nopenai = dsh_gone_adapter:OpenAIChatAdapter\n")
    return mirror


@pytest.mark.parametrize(
    ("broken", "says"),
    [
        (False, "no 'openai' entry point in the group dsh.session.adapters"),
        (True, "the 'openai' model adapter does not load (ModuleNotFoundError: No module named 'dsh_gone_adapter')"),
    ],
    ids=["absent", "broken"],
)
def test_a_real_model_without_the_adapter_installed_names_the_pip_install(
    tmp_path: Path, broken: bool, says: str
) -> None:
    mirror = site_without_the_adapter(tmp_path, broken=broken)
    launcher = "import site, sys; site.addsitedir(sys.argv.pop(1)); from dsh.session_persistence._cli._main import "
    launcher += "main; sys.exit(main())"
    root = tmp_path / "sessions"
    argv = ["--root", str(root), "demo", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"]
    env = {**os.environ, "OPENAI_API_KEY": "k"}
    for as_json in (False, True):
        done = subprocess.run(
            [sys.executable, "-S", "-c", launcher, str(mirror), *argv, *(["--json"] if as_json else [])],
            capture_output=True,
            text=True,
            timeout=100,
            check=False,
            env=env,
        )
        assert done.returncode == 4, done.stdout + done.stderr
        assert "pip install dsh-session-adapter-openai" in done.stderr and says in done.stderr, done.stderr
        if as_json:
            error = json.loads(done.stdout)["error"]
            assert (error["code"], error["exit"]) == ("adapter_missing", 4)
            assert "pip install dsh-session-adapter-openai" in error["message"]
    assert not root.exists()  # refused before the root, the work directory or the child


def test_the_documented_real_model_flags_are_the_demos(capsys: pytest.CaptureFixture[str]) -> None:
    """The READMEs' ``demo --model NAME [--base-url URL] [--api-key KEY]`` is what the parser accepts."""
    code, _, err = run_in_process(["demo", "--help"])  # argparse prints help on sys.stdout
    assert code == 0, err
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--model NAME", "--base-url URL", "--api-key KEY", "$OPENAI_BASE_URL", "$OPENAI_API_KEY"):
        assert flag in out
    repo = Path(__file__).resolve().parents[3]
    for readme in ("README.md", "README.zh.md"):
        assert "`--model NAME [--base-url URL] [--api-key KEY]`" in (repo / readme).read_text(encoding="utf-8")
