"""Real crash tests: a child process runs a scripted agent (JSONL + checkpoint policy) and is SIGKILLed.

spec/policy.md §3 and §5 scenarios 36-39, plus a kill between steps, a handful of random kills and the torture
tool's CI-quick run. After each kill a fresh host reloads the root (``crash_check.verify``) and checks: the log is
balanced, seq contiguous, every acknowledged event present, every side-effected call durable and repaired as
``TOOL_OUTCOME_UNKNOWN`` (never ``TOOL_NOT_STARTED``), and resuming continues at the next seq and turn. The negative
controls show the same checks failing without the policy. POSIX only. Kill points are reached by marker content,
never by sleeping.

The torture tool runs as a process group of its own (``crash_check.process_group``): however a test leaves it
(failure, pytest-timeout, KeyboardInterrupt) the tool and every crash child it started are killed and reaped. Its
long mode (``DSH_LONG=1``, 1,000 kills) gets a pytest-timeout of its own, :data:`TORTURE_S_PER_KILL` seconds per
kill, since the suite's 300 s fit only the quick mode.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from crash_check import dump, kill_child, process_group, torture_once, verify_sync
from dsh.session_persistence.events import InterruptedReason

pytestmark = pytest.mark.skipif(os.name != "posix", reason="needs POSIX signals")

REPO = Path(__file__).resolve().parent.parent
LONG = os.environ.get("DSH_LONG") == "1"

#: The torture tool's kills: CI's quick mode runs the tool end to end, the long mode is the torture.
TORTURE_KILLS = 1000 if LONG else 8
TORTURE_SEALED_KILLS = 1000 if LONG else 6
#: Wall-clock budget per kill (2 jobs take ~1.5 s a kill on the loaded 2-core dev machine): a safety net for a hung
#: run, never a timing check.
TORTURE_S_PER_KILL = 4.0
#: The suite's pytest-timeout (pyproject), which the quick mode keeps.
SUITE_TIMEOUT_S = 300.0


def torture_timeout(kills: int) -> float:
    """The pytest-timeout of a torture-tool test: the suite's, or more in proportion to the kills (the long mode)."""
    return max(SUITE_TIMEOUT_S, kills * TORTURE_S_PER_KILL)


def test_request_mode_kill_inside_adapter(tmp_path: Path) -> None:
    assert kill_child("request", tmp_path) == -9
    verdict = verify_sync(tmp_path)
    # The pre-step checkpoint made turn/start durable, the request checkpoint the next four; repair closes the rest.
    assert verdict.types() == [
        "turn/start",
        "step/start",
        "user/message",
        "request/header",
        "request/context",
        "step/end",
        "turn/end",
    ]
    assert verdict.stored == 5
    assert isinstance(verdict.events[-1].data.reason, InterruptedReason)  # type: ignore[union-attr]
    assert verdict.acked == 5
    assert (verdict.lost, verdict.unbalanced) == ([], [])
    assert verdict.resumed_turn == 2


def test_tool_mode_kill_inside_tool_body(tmp_path: Path) -> None:
    assert kill_child("tool", tmp_path) == -9
    assert (tmp_path / "effects" / "crash-call").exists()
    verdict = verify_sync(tmp_path)
    types = verdict.types()
    assert "assistant/message" in types
    assert "tool/call" in types
    assert types[-3:] == ["tool/result", "step/end", "turn/end"]
    [result] = verdict.tool_results()
    assert result["error"] == {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}
    assert "Do not retry blindly." in result["message"]["content"][0]["content"][0]["text"]
    assert (verdict.outcome_unknown, verdict.not_started) == (1, 0)
    assert (verdict.lost, verdict.unbalanced) == ([], [])
    assert verdict.resumed_turn == 2


def test_kill_between_steps_keeps_the_real_tool_result(tmp_path: Path) -> None:
    assert kill_child("between", tmp_path) == -9
    verdict = verify_sync(tmp_path)
    # The step-2 pre-step checkpoint made step 1 (with its real result) durable; repair adds only turn/end.
    assert verdict.types()[-4:] == ["tool/call", "tool/result", "step/end", "turn/end"]
    assert [e.type for e in verdict.closers] == ["turn/end"]
    [result] = verdict.tool_results()
    assert "error" not in result
    assert (verdict.lost, verdict.unbalanced) == ([], [])


@pytest.mark.parametrize("seed", range(20 if LONG else 4))
def test_random_kill(tmp_path: Path, seed: int) -> None:
    verdict = torture_once(tmp_path, seed)
    assert (verdict.lost, verdict.unbalanced) == ([], []), dump(verdict)
    assert verdict.resumed_turn is not None


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10 if LONG else 2))
def test_random_kill_sealed(tmp_path: Path, seed: int) -> None:
    """The same random kills on an encrypting backend: nothing acknowledged is lost, and what is stored does not
    read without the key (checked inside ``verify``)."""
    verdict = torture_once(tmp_path, seed, sealed=True)
    assert (verdict.lost, verdict.unbalanced, verdict.damaged) == ([], [], None), dump(verdict)
    assert verdict.resumed_turn is not None


# ----------------------------------------------------------------------------------------------------------------
# Negative controls: without the policy (and a very long window) the same kills lose what the checks look for.


def test_negative_control_request_mode_without_policy(tmp_path: Path) -> None:
    assert kill_child("request", tmp_path, policy=False, window_ms=600_000) == -9
    verdict = verify_sync(tmp_path, resume=False)
    assert "step/start" not in verdict.types()


def test_negative_control_tool_mode_without_policy_is_detected(tmp_path: Path) -> None:
    assert kill_child("tool", tmp_path, policy=False, window_ms=600_000) == -9
    assert (tmp_path / "effects" / "crash-call").exists()
    verdict = verify_sync(tmp_path, resume=False)
    # The side effect happened but no durable record of the call exists: the check that guards the policy fires.
    assert verdict.lost == ["side effect of crash-call without any durable log"], dump(verdict)


def test_negative_control_acknowledged_bytes_are_compared(tmp_path: Path) -> None:
    """An acknowledged event whose count and type match but whose content differs is reported lost."""
    assert kill_child("between", tmp_path, compression="zstd") == -9
    acked = tmp_path / "acked.jsonl"
    original = acked.read_bytes()
    assert b'"turn 1"' in original
    acked.write_bytes(original.replace(b'"turn 1"', b'"turn 7"', 1))
    verdict = verify_sync(tmp_path, resume=False, compression="zstd")
    assert len(verdict.lost) == 1 and "differs on disk" in verdict.lost[0], dump(verdict)


# ----------------------------------------------------------------------------------------------------------------
# The torture tool, CI-quick


def _torture(tmp_path: Path, kills: int, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(REPO / "tools" / "crash-torture")]
    argv += ["--kills", str(kills), "--seed", "7", "--root", str(tmp_path), *extra]
    out, err = tmp_path / "torture.out", tmp_path / "torture.err"
    with process_group(argv, out, err) as tool:
        # Ends before the test's pytest-timeout, so a hung run fails here with the tool's output; either way the
        # group is stopped on the way out.
        tool.wait(timeout=torture_timeout(kills) - 30)
    return subprocess.CompletedProcess(argv, tool.returncode, out.read_text(), err.read_text())


def _check_torture(proc: subprocess.CompletedProcess[str], kills: int) -> None:
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    match = re.fullmatch(
        r"kills=(\d+) lost=0 unbalanced=0 damaged=0 not_started=(\d+) outcome_unknown=(\d+) clean=(\d+)", last
    )
    assert match is not None, last
    assert int(match.group(1)) == kills
    for encoding in ("zstd", "none"):  # both encodings were killed, each half the time
        assert re.search(rf"^{encoding}: kills={kills // 2} lost=0 unbalanced=0 damaged=0$", proc.stdout, re.M), (
            proc.stdout
        )


@pytest.mark.timeout(torture_timeout(TORTURE_KILLS))
def test_crash_torture_tool_quick(tmp_path: Path) -> None:
    _check_torture(_torture(tmp_path, TORTURE_KILLS), TORTURE_KILLS)


@pytest.mark.slow
@pytest.mark.timeout(torture_timeout(TORTURE_SEALED_KILLS))
def test_crash_torture_tool_sealed(tmp_path: Path) -> None:
    """SIGKILLs at random instants against the encrypting backend (a handful in CI, 1,000 under DSH_LONG=1)."""
    kills = TORTURE_SEALED_KILLS
    proc = _torture(tmp_path, kills, "--sealed")
    assert "sealed=1" in proc.stdout, proc.stdout + proc.stderr
    _check_torture(proc, kills)


# ----------------------------------------------------------------------------------------------------------------
# No crash child outlives a torture run the test leaves early


def _crash_children(parent: int) -> dict[int, str]:
    """The running crash children of ``parent``: pid -> its start time (``/proc/<pid>/stat`` field 22)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
        if int(fields[1]) == parent and b"crash_child.py" in cmdline:
            found[int(entry.name)] = fields[19]
    return found


def _survives(pid: int, start_time: str) -> bool:
    """Whether that very process still exists, running or as an unreaped zombie (not a newer one with its pid)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[19] == start_time


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the children through /proc")
def test_a_torture_run_left_early_leaves_no_child(tmp_path: Path) -> None:
    """A 1,000-kill run left as soon as its first crash children run, the way pytest-timeout or a KeyboardInterrupt
    leaves it: the tool and every crash child it started are killed and reaped (no pid of theirs survives, not even
    as a zombie)."""
    argv = [sys.executable, str(REPO / "tools" / "crash-torture"), "--kills", "1000", "--root", str(tmp_path)]
    seen: dict[int, str] = {}
    out, err = tmp_path / "torture.out", tmp_path / "torture.err"
    # The interrupt is raised inside the run on purpose.
    with pytest.raises(KeyboardInterrupt), process_group(argv, out, err) as tool:  # noqa: PT012
        deadline = time.monotonic() + 120  # a safety net for a tool that never starts a child
        while not seen and tool.poll() is None and time.monotonic() < deadline:
            seen.update(_crash_children(tool.pid))
            time.sleep(0.01)
        assert seen, err.read_text()
        raise KeyboardInterrupt
    assert tool.returncode is not None
    assert [pid for pid, start in seen.items() if _survives(pid, start)] == []
    # The tool stopped on the SIGTERM (not the group's SIGKILL): it killed, reaped and counted its kills itself.
    assert tool.returncode == 130, err.read_text()
    assert "interrupted after " in out.read_text()
