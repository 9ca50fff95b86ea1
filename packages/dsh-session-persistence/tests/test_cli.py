"""``dsh-sessions``: every command in-process (``run(argv, Io)``), including bad input and the ``--json`` shapes.

Sessions are planted with the JSONL backend's own primitives in a temporary root: a balanced one, one killed
inside a tool call (an open turn: a load appends TOOL_OUTCOME_UNKNOWN + TOOL_NOT_STARTED + step/end + turn/end),
one with a torn tail, one with a damaged committed frame and one written by a newer format version.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh.session_persistence import Host, PersistenceCoordinator
from dsh.session_persistence._cli import _main
from dsh.session_persistence._cli._context import default_root, resolve_root
from dsh.session_persistence._cli._io import Io
from dsh.session_persistence.backend import SESSION_FORMAT_VERSION, StorageMetadata, event_to_builtins
from dsh.session_persistence.testing import (
    assistant_message,
    meta,
    one_turn_log,
    simple_turn,
    step_start,
    tool_call,
    turn_start,
    user_message,
)
from dsh.session_persistence_jsonl import JsonlBackend

WORK = "/home/me/project"


class TtyIO(io.StringIO):
    """A StringIO that claims to be a terminal (for the confirmation prompt and the progress indicator)."""

    def isatty(self) -> bool:
        return True


class Result:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> Any:
        return json.loads(self.out)


def cli(*argv: str, stdin: str = "", tty: bool = False, err_tty: bool = False) -> Result:
    out, err = io.StringIO(), (TtyIO() if err_tty else io.StringIO())
    inp = TtyIO(stdin) if tty else io.StringIO(stdin)
    code = _main.run(list(argv), Io(out=out, err=err, inp=inp))
    return Result(code, out.getvalue(), err.getvalue())


def crashed_log() -> list[Any]:
    """Killed inside a tool body: c1 has a durable tool/call, c2 was requested but never started."""
    return [
        turn_start(0, 1),
        user_message(1, "pay and send the receipt"),
        step_start(2, 1, 1),
        assistant_message(3, "on it", tool_calls=["c1", "c2"]),
        tool_call(4, "c1"),
    ]


def plant(root: Path, session_id: str, events: list[Any], *, created_at: int = 1000, version: int = 0) -> Path:
    async def write() -> None:
        backend = JsonlBackend(root)
        header = meta(session_id, WORK, created_at=created_at, version=version)
        await backend.append_batch(StorageMetadata(header), events[:3], False)
        if events[3:]:
            await backend.append_batch(StorageMetadata(header), events[3:], True)

    anyio.run(write)
    return transcript(root, session_id)


def transcript(root: Path, session_id: str) -> Path:
    return Path(JsonlBackend(root).locate(meta(session_id, WORK)).path)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Two sessions: ``done`` (balanced, created first, its last event at 1005) and ``crashed`` (open turn,
    created and written last, its last event at 1004: older by its log, whatever the files' mtimes say)."""
    path = tmp_path / "sessions"
    plant(path, "done", one_turn_log(), created_at=1_000)
    plant(path, "crashed", crashed_log(), created_at=2_000)
    return path


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def inspect_events(root: Path, session_id: str) -> list[dict[str, Any]]:
    async def read() -> list[dict[str, Any]]:
        async with PersistenceCoordinator(Host(), JsonlBackend(root)) as coordinator:
            view = await coordinator.inspect(session_id)
        return [event_to_builtins(e) for e in view.events]

    return anyio.run(read)


def one_error_line(result: Result) -> str:
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("dsh-sessions: error: ")
    assert "Traceback" not in result.err
    return lines[0]


# ----------------------------------------------------------------------------------------------------------------
# list


def test_list_newest_first_with_counts_and_status(root: Path) -> None:
    result = cli("--root", str(root), "list")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].split() == ["ID", "LAST", "ACTIVITY", "TURNS", "EVENTS", "SIZE", "STATUS", "CWD", "TITLE"]
    # Most recent activity first, by each log's last event (never the files' mtimes: crashed was written last).
    assert [line.split()[0] for line in lines[1:]] == ["done", "crashed"]
    assert "ok" in lines[1].split() and "interrupted" in lines[2].split()
    assert lines[1].endswith(f"{WORK}  hi") and lines[2].endswith(f"{WORK}  pay and send the receipt")
    assert result.err == ""  # no progress indicator: stderr is not a terminal


def test_list_json_shape(root: Path) -> None:
    result = cli("list", "--root", str(root), "--json")  # global options also accepted after the command
    assert result.code == 0, result.err
    doc = result.json()
    assert doc["root"] == str(root) and doc["backend"] == "jsonl"
    done, crashed = doc["sessions"]
    assert (done["id"], crashed["id"]) == ("done", "crashed")  # by each log's last event
    assert done["events"] == 6 and crashed["events"] == 5
    assert crashed["pendingClosers"] == ["tool/result", "tool/result", "step/end", "turn/end"]
    assert crashed["status"] == "interrupted" and crashed["recoverable"] is True
    assert done["createdAt"] == 1000 and done["created"] == "1970-01-01T00:00:01.000Z"
    assert done["cwd"] == WORK and done["size"] == transcript(root, "done").stat().st_size
    assert done["lastActivityAt"] == 1005  # time of the last stored event
    assert done["header"]["id"] == "done" and done["tornTail"] is None


def test_list_empty_and_missing_root(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli("--root", str(empty), "list")
    assert (result.code, result.out) == (0, f"no sessions under {empty} (backend jsonl)\n")
    assert cli("--root", str(empty), "list", "--json").json()["sessions"] == []
    # A root that does not exist is a typo until proven otherwise: an error, and nothing is created.
    missing = tmp_path / "nothing-here"
    result = cli("--root", str(missing), "list")
    assert result.code == 4 and "does not exist" in one_error_line(result)
    assert not missing.exists()


def test_progress_indicator_only_on_a_terminal(root: Path) -> None:
    result = cli("--root", str(root), "verify", err_tty=True)
    assert result.code == 0
    assert "\rverifying sessions 1/2" in result.err and "\rverifying sessions 2/2" in result.err
    assert result.err.endswith("\r")  # erased again
    assert "verifying" not in result.out


# ----------------------------------------------------------------------------------------------------------------
# show


def test_show_transcript_marks_pending_repairs_and_writes_nothing(root: Path) -> None:
    before = snapshot(root)
    result = cli("--root", str(root), "show", "crashed")
    assert result.code == 0, result.err
    out = result.out
    assert "session crashed" in out and "status    interrupted" in out
    assert "== turn 1 ==" in out and "pay and send the receipt" in out
    assert "asks for probe({}) [c1]" in out and "asks for probe({}) [c2]" in out and "probe [c1] started" in out
    assert "probe [c1]  [REPAIR PENDING: TOOL_OUTCOME_UNKNOWN; not on disk yet]" in out
    assert "probe [c2]  [REPAIR PENDING: TOOL_NOT_STARTED; not on disk yet]" in out
    assert "turn 1 ended: interrupted  [REPAIR PENDING: closed by crash repair; not on disk yet]" in out
    assert "(read-only view: `dsh-sessions repair crashed` commits this)" in out
    assert "Do not retry blindly." in out
    assert snapshot(root) == before


def test_show_balanced_session(root: Path) -> None:
    result = cli("--root", str(root), "show", "done")
    assert result.code == 0
    assert "turn 1 ended: completed" in result.out and "REPAIR" not in result.out
    assert "assistant  hello" in result.out and "user       hi" in result.out


def test_show_json_entries(root: Path) -> None:
    doc = cli("--root", str(root), "show", "crashed", "--json").json()
    assert doc["id"] == "crashed" and doc["events"] == 5 and doc["inheritedEventCount"] == 0
    kinds = [e["kind"] for e in doc["entries"]]
    assert kinds == [
        "turn-start",
        "user",
        "step-start",
        "assistant",
        "tool-call",
        "tool-result",
        "tool-result",
        "step-end",
        "turn-end",
    ]
    results = [e for e in doc["entries"] if e["kind"] == "tool-result"]
    assert [(r["callId"], r["repair"], r["pending"]) for r in results] == [
        ("c1", "TOOL_OUTCOME_UNKNOWN", True),
        ("c2", "TOOL_NOT_STARTED", True),
    ]
    assert doc["entries"][-1] == {
        "seq": 8,
        "time": 1004,
        "pending": True,
        "kind": "turn-end",
        "turn": 1,
        "reason": "interrupted",
        "repair": "interrupted",
    }
    assert "pending" not in doc["entries"][0]


def test_show_unknown_id_is_not_found(root: Path) -> None:
    result = cli("--root", str(root), "show", "nope")
    assert result.code == 3 and result.out == ""
    assert one_error_line(result) == 'dsh-sessions: error: session "nope" not found'


# ----------------------------------------------------------------------------------------------------------------
# verify


def test_verify_all_recoverable_exits_zero_and_writes_nothing(root: Path) -> None:
    before = snapshot(root)
    result = cli("--root", str(root), "verify")
    assert result.code == 0, result.out
    assert "recoverable  crashed: interrupted turn: a load" in result.out
    assert "append tool/result TOOL_OUTCOME_UNKNOWN for call c1 (seq 5)" in result.out
    assert "ok           done: 6 events, balanced" in result.out
    assert "verify passed: 2 session(s): 1 ok, 1 recoverable" in result.out
    assert snapshot(root) == before


def test_verify_torn_tail_is_recoverable(root: Path) -> None:
    path = transcript(root, "done")
    with path.open("ab") as fh:
        fh.write(b"\x5d\x2a")  # the first bytes of a batch declaration whose write never finished
    before = snapshot(root)
    result = cli("--root", str(root), "verify", "done", "--json")
    assert result.code == 0
    [report] = result.json()["sessions"]
    assert report["status"] == "torn" and report["recoverable"] is True
    assert report["tornTail"] == {"bytes": 2, "recoveredEvents": 0}
    assert result.json()["ok"] is True and result.json()["summary"] == {"torn": 1}
    human = cli("--root", str(root), "verify", "done")
    assert "torn tail: a load" in human.out and "truncate a torn tail (2 bytes at the end of" in human.out
    assert snapshot(root) == before


def damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a committed frame that has a valid frame after it
    path.write_bytes(bytes(data))


def test_verify_corrupt_session_exits_one(root: Path) -> None:
    damage(transcript(root, "done"))
    before = snapshot(root)
    result = cli("--root", str(root), "verify")
    assert result.code == 1
    assert "CORRUPT      done:" in result.out and "recoverable  crashed" in result.out
    assert "verify FAILED: 2 session(s): 0 ok, 1 recoverable, 1 corrupt" in result.out
    assert snapshot(root) == before
    single = cli("--root", str(root), "verify", "done", "--json")
    assert single.code == 1
    assert single.json()["ok"] is False and single.json()["sessions"][0]["status"] == "corrupt"
    assert "corrupt" in single.json()["sessions"][0]["message"]


def test_verify_newer_format_is_refused_with_exit_one(tmp_path: Path) -> None:
    plant(tmp_path, "future", one_turn_log(), version=SESSION_FORMAT_VERSION + 1)
    result = cli("--root", str(tmp_path), "verify")
    assert result.code == 1
    assert "UNSUPPORTED  future:" in result.out and "upgrade the harness" in result.out
    shown = cli("--root", str(tmp_path), "show", "future")
    assert shown.code == 1 and "newer harness" in one_error_line(shown)
    listed = cli("--root", str(tmp_path), "list", "--json")
    assert listed.code == 0 and listed.json()["sessions"][0]["status"] == "unsupported"


def test_verify_unknown_id(root: Path) -> None:
    result = cli("--root", str(root), "verify", "ghost")
    assert result.code == 3
    one_error_line(result)


# ----------------------------------------------------------------------------------------------------------------
# export


@pytest.mark.parametrize("session_id", ["done", "crashed"])
def test_export_equals_inspect_and_writes_nothing(root: Path, session_id: str) -> None:
    before = snapshot(root)
    result = cli("--root", str(root), "export", session_id)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert [json.loads(line) for line in lines] == inspect_events(root, session_id)
    assert len(lines) == (6 if session_id == "done" else 9)  # closers included for the crashed one
    assert snapshot(root) == before


def test_export_errors(root: Path) -> None:
    assert cli("--root", str(root), "export", "ghost").code == 3
    damage(transcript(root, "done"))
    result = cli("--root", str(root), "export", "done")
    assert result.code == 1 and result.out == ""
    assert "corrupt" in one_error_line(result)


# ----------------------------------------------------------------------------------------------------------------
# repair


def test_repair_refuses_without_a_terminal(root: Path) -> None:
    before = snapshot(root)
    result = cli("--root", str(root), "repair", "crashed")
    assert result.code == 2
    assert "pass --yes" in one_error_line(result)
    assert "append tool/result TOOL_NOT_STARTED for call c2" in result.out  # it said what it would do
    assert snapshot(root) == before


def test_repair_declined_at_the_prompt(root: Path) -> None:
    before = snapshot(root)
    result = cli("--root", str(root), "repair", "crashed", stdin="n\n", tty=True)
    assert result.code == 5
    assert result.err.startswith("Repair session crashed? [y/N] ")
    assert "repair declined; nothing was written" in result.err
    assert snapshot(root) == before


@pytest.mark.parametrize("how", ["yes-flag", "prompt"])
def test_repair_commits(root: Path, how: str) -> None:
    args = ["--root", str(root), "repair", "crashed"]
    result = cli(*args, "--yes") if how == "yes-flag" else cli(*args, stdin="y\n", tty=True)
    assert result.code == 0, result.err
    assert "repaired: session crashed now has 9 events, balanced" in result.out
    after = cli("--root", str(root), "verify", "crashed", "--json").json()["sessions"][0]
    assert (after["status"], after["events"], after["pendingClosers"]) == ("ok", 9, [])
    again = cli("--root", str(root), "repair", "crashed")
    assert again.code == 0 and "nothing to repair" in again.out


def test_repair_cuts_a_torn_tail(root: Path) -> None:
    path = transcript(root, "crashed")
    size = path.stat().st_size
    with path.open("ab") as fh:
        fh.write(b"\x5d\x2a\x4d")  # the first bytes of a batch declaration whose write never finished
    result = cli("--root", str(root), "repair", "crashed", "--yes", "--json")
    assert result.code == 0
    doc = result.json()
    assert doc["repaired"] is True and doc["events"] == 9
    assert doc["plan"][0].startswith("truncate a torn tail (3 bytes")
    assert path.stat().st_size > size  # cut, then the closers appended as a new frame
    assert cli("--root", str(root), "verify").code == 0


def test_repair_refuses_corruption(root: Path) -> None:
    damage(transcript(root, "done"))
    before = snapshot(root)
    result = cli("--root", str(root), "repair", "done", "--yes")
    assert result.code == 1
    assert "cannot repair" in one_error_line(result)
    assert snapshot(root) == before
    assert cli("--root", str(root), "repair", "ghost", "--yes").code == 3


# ----------------------------------------------------------------------------------------------------------------
# stats, plugins


def test_stats_json_and_text(root: Path) -> None:
    cli("--root", str(root), "repair", "crashed", "--yes")
    plant(root, "more", simple_turn(0, 1) + simple_turn(3, 2), created_at=3_000)
    doc = cli("--root", str(root), "stats", "--json").json()
    assert doc["sessions"] == 3 and doc["statuses"] == {"ok": 3}
    assert doc["events"] == 6 + 9 + 6 and doc["turns"] == 4 and doc["interruptedTurns"] == 1
    assert doc["toolCalls"] == 1 and doc["repairedResults"] == {"TOOL_NOT_STARTED": 1, "TOOL_OUTCOME_UNKNOWN": 1}
    assert doc["storedBytes"] == sum(p.stat().st_size for p in root.rglob("session.jsonl.zstd"))
    assert doc["decodedBytes"] > 0
    assert doc["compressionRatio"] == round(doc["decodedBytes"] / doc["storedBytes"], 2)
    assert doc["eventTypes"]["turn/start"] == 4
    text = cli("--root", str(root), "stats")
    assert text.code == 0 and "sessions      3 (3 ok)" in text.out and "compression ratio" in text.out


def test_plugins(tmp_path: Path) -> None:
    doc = cli("plugins", "--json").json()
    by_name = {p["name"]: p for p in doc["plugins"]}
    jsonl = by_name["jsonl"]
    assert jsonl["distribution"] == "dsh-session-persistence-jsonl" and jsonl["version"]
    assert jsonl["hooks"] == ["dsh_session_backends"] and jsonl["backends"] == ["jsonl"]
    assert by_name["memory"]["backends"] == ["memory"]
    text = cli("plugins")
    assert text.code == 0 and "distribution  dsh-session-persistence-jsonl" in text.out


# ----------------------------------------------------------------------------------------------------------------
# usage errors, roots, storage errors


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["list", "--bogus"], "unrecognized arguments: --bogus"),
        (["show"], "the following arguments are required: id"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["--backend", "nosuch", "list"], 'unknown backend "nosuch"'),
        (["-o", "compression", "list"], "backend option must look like KEY=VALUE"),
        (["-o", "colour=blue", "list"], 'backend "jsonl" has no option "colour"'),
        (["-o", "pack_chunks=maybe", "list"], "expects true or false"),
        (["-o", "compression=lz4", "list"], "compression must be"),
    ],
)
def test_usage_errors_exit_two(tmp_path: Path, argv: list[str], needle: str) -> None:
    result = cli("--root", str(tmp_path), *argv)
    assert result.code == 2
    assert needle in one_error_line(result)


def test_no_command_prints_help_and_exits_two() -> None:
    result = cli()
    assert result.code == 2 and "usage: dsh-sessions" in result.err


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("--help").code == 0
    assert "exit codes:" in capsys.readouterr().out


def test_backend_option_selects_the_encoding(tmp_path: Path) -> None:
    async def write() -> None:
        backend = JsonlBackend(tmp_path, compression="none")
        await backend.append_batch(StorageMetadata(meta("plain", WORK)), one_turn_log(), False)

    anyio.run(write)
    mismatch = cli("--root", str(tmp_path), "list")
    assert mismatch.code == 1 and "select the matching compression mode" in one_error_line(mismatch)
    result = cli("--root", str(tmp_path), "-o", "compression=none", "list", "--json")
    assert result.code == 0 and [s["id"] for s in result.json()["sessions"]] == ["plain"]
    assert cli("--root", str(tmp_path), "--backend", "memory", "list").out.startswith("no sessions")


def test_root_that_is_a_file_is_unavailable(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    result = cli("--root", str(not_a_dir), "list")
    assert result.code == 4
    assert one_error_line(result) == f"dsh-sessions: error: cannot use session root {not_a_dir}: Not a directory"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs POSIX permissions and a non-root user")
def test_unreadable_root_is_unavailable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        result = cli("--root", str(locked), "list")
    finally:
        locked.chmod(0o700)
    assert result.code == 4 and "Permission denied" in one_error_line(result)


def test_root_resolution_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = {"HOME": "/home/me", "XDG_DATA_HOME": "/data", "DSH_SESSIONS_ROOT": "/env/root"}
    assert resolve_root("/opt/x", env) == "/opt/x"
    assert resolve_root(None, env) == "/env/root"
    assert resolve_root(None, {"HOME": "/home/me", "XDG_DATA_HOME": "/data"}) == "/data/dsh-sessions"
    assert default_root({"HOME": "/home/me"}) == "/home/me/.local/share/dsh-sessions"
    # A relative XDG_DATA_HOME is invalid per the XDG spec and ignored.
    assert default_root({"HOME": "/home/me", "XDG_DATA_HOME": "rel"}) == "/home/me/.local/share/dsh-sessions"
    monkeypatch.chdir(tmp_path)
    assert resolve_root("rel", {}) == str(tmp_path / "rel")  # explicit relative --root: made absolute once


def test_default_root_is_never_the_working_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    plant(cwd, "in-cwd", one_turn_log())  # a session root right in the working directory: must not be used
    plant(home / ".local" / "share" / "dsh-sessions", "in-home", one_turn_log())
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("DSH_SESSIONS_ROOT", raising=False)
    assert [s["id"] for s in cli("list", "--json").json()["sessions"]] == ["in-home"]
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "xdg"))
    plant(home / "xdg" / "dsh-sessions", "in-xdg", one_turn_log())
    assert [s["id"] for s in cli("list", "--json").json()["sessions"]] == ["in-xdg"]
    monkeypatch.setenv("DSH_SESSIONS_ROOT", str(cwd))
    assert [s["id"] for s in cli("list", "--json").json()["sessions"]] == ["in-cwd"]


def test_internal_error_is_one_line_and_exit_70(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    async def boom(*args: Any) -> int:
        raise RuntimeError("kaboom\nsecond line")

    monkeypatch.setattr(_main, "cmd_list", boom)
    monkeypatch.delenv("DSH_SESSIONS_DEBUG", raising=False)
    result = cli("--root", str(root), "list")
    assert result.code == 70
    assert result.err.splitlines() == [
        "dsh-sessions: internal error: RuntimeError: kaboom second line",
        "dsh-sessions: set DSH_SESSIONS_DEBUG=1 for the traceback",
    ]


def test_console_script_entry_point() -> None:
    from importlib.metadata import entry_points

    [script] = [ep for ep in entry_points(group="console_scripts") if ep.name == "dsh-sessions"]
    main: Callable[..., int] = script.load()
    assert main is _main.main
    assert sys.modules["dsh.session_persistence._cli"].main is main


def test_python_dash_m_runs_the_command_line(root: Path) -> None:
    """`python -m dsh.session_persistence` is the console script: same program name, same commands, same exits."""
    import subprocess

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "dsh.session_persistence", *argv]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL
        )

    helped = run("--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: dsh-sessions ")
    listed = run("--root", str(root), "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == json.loads(cli("--root", str(root), "list", "--json").out)
    assert {"done", "crashed"} <= set(listed.stdout.split('"'))
    wrong = run("no-such-command")
    assert wrong.returncode == 2 and "dsh-sessions" in wrong.stderr


# ----------------------------------------------------------------------------------------------------------------
# damage is never cut silently: repair --discard-damaged-tail, and unlistable headers


_DECLARATION = b"\x5d\x2a\x4d\x18"  # a JSONL v1 batch declaration (a zstd skippable frame)


def flip_in_batch(path: Path, index: int) -> None:
    """Flip a byte inside the data of the ``index``-th declared pair (0 = header, -1 = the last batch)."""
    data = bytearray(path.read_bytes())
    starts = [i for i in range(len(data) - 3) if data[i : i + 4] == _DECLARATION]
    start = starts[index]
    end = starts[index + 1] if index != -1 and index + 1 < len(starts) else len(data)
    data[(start + 32 + end) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_damaged_final_batch_is_discarded_only_on_the_explicit_flag(root: Path) -> None:
    path = transcript(root, "done")
    flip_in_batch(path, -1)
    damaged = path.read_bytes()
    verify = cli("--root", str(root), "verify", "done")
    assert verify.code == 1 and "CORRUPT" in verify.out and "fails its CRC" in verify.out
    refused = cli("--root", str(root), "repair", "done", "--yes")
    assert refused.code == 1
    assert "--discard-damaged-tail done" in one_error_line(refused)
    assert path.read_bytes() == damaged  # plain repair never cuts damage
    declined = cli("--root", str(root), "repair", "done", "--discard-damaged-tail", tty=True, stdin="n\n")
    assert declined.code == 5 and path.read_bytes() == damaged
    assert "3 event(s), seqs 3..5" in declined.out  # what would be lost is printed before asking
    done = cli("--root", str(root), "repair", "done", "--discard-damaged-tail", "--yes")
    assert done.code == 0, done.err
    assert "discarding will permanently lose the final batch" in done.out and "3 event(s), seqs 3..5" in done.out
    assert cli("--root", str(root), "verify", "done").code == 0
    events = inspect_events(root, "done")
    assert [e["seq"] for e in events[:3]] == [0, 1, 2] and events[-1]["type"] == "turn/end"


def test_damage_before_the_final_batch_is_never_discarded(root: Path) -> None:
    path = transcript(root, "done")
    flip_in_batch(path, 1)  # the first event batch: a valid batch follows it
    before = snapshot(root)
    result = cli("--root", str(root), "repair", "done", "--discard-damaged-tail", "--yes")
    assert result.code == 1
    assert "not confined to the final batch" in one_error_line(result)
    assert snapshot(root) == before


def test_a_damaged_header_is_reported_not_fatal_for_the_root(root: Path) -> None:
    flip_in_batch(transcript(root, "crashed"), 0)
    listed = cli("--root", str(root), "list", "--json")
    assert listed.code == 0  # the root still lists: the unreadable session is named on stderr
    assert {s["id"]: s["status"] for s in listed.json()["sessions"]} == {"done": "ok"}
    assert "cannot be read and are not listed" in listed.err and "crashed" in listed.err
    verify = cli("--root", str(root), "verify")
    assert verify.code == 1 and "CORRUPT      crashed:" in verify.out and "header data fails its CRC" in verify.out
