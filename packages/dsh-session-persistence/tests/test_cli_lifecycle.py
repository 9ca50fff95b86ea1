"""The operator's commands through the installed ``dsh-sessions`` console script: real processes, real files.

``list`` paging and filters, ``rm``, ``prune``, ``compact``, ``export --salvage``, ``verify`` of unreadable
files and of a missing root, errors as JSON under ``--json``, and the bad inputs that must change nothing
(an unknown id, a session another process holds, nonsense durations, a cursor from another root).

Checks of argument parsing and usage errors (exit 2) call the console script's ``main`` in this process (``cli``):
a process of its own proves nothing more there, and each costs most of a second to start. Every exit code is
still checked from a real process somewhere in this file (2: ``test_rm_bad_input_changes_nothing``; 4:
``test_missing_root_is_an_error_for_every_reading_command``), and so is everything that depends on the process
(its stdin, a terminal, its working directory, a lock another process holds).
"""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from dsh.session_persistence._cli import main
from dsh.session_persistence.backend import StorageMetadata
from dsh.session_persistence.testing import (
    assistant_message,
    event,
    meta,
    one_turn_log,
    simple_turn,
    step_end,
    step_start,
    turn_end,
    turn_start,
    user_message,
)
from dsh.session_persistence_jsonl import JsonlBackend

pytestmark = pytest.mark.skipif(os.name != "posix", reason="console script tests use POSIX paths and ptys")

SCRIPT = Path(sys.executable).with_name("dsh-sessions")
WORK = "/home/me/project"
OTHER = "/home/me/other"
DAY_S = 86_400
NOW = time.time()


class Run:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> Any:
        return json.loads(self.out)


def dsh(*argv: str, stdin: str = "", env: dict[str, str] | None = None) -> Run:
    assert SCRIPT.exists(), f"the console script is not installed next to {sys.executable}"
    environ = {k: v for k, v in os.environ.items() if k != "DSH_SESSIONS_ROOT"}
    environ.update(env or {})
    proc = subprocess.run(
        [str(SCRIPT), *argv], input=stdin, capture_output=True, text=True, timeout=60, check=False, env=environ
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Run]:
    """``dsh`` in this process: the console script's ``main(argv)``, with the same environment and an empty stdin."""
    monkeypatch.delenv("DSH_SESSIONS_ROOT", raising=False)

    def call(*argv: str) -> Run:
        monkeypatch.setattr(sys, "stdin", io.StringIO(""))
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return call


def chat_log(text: str, turns: int = 1) -> list[Any]:
    """``turns`` completed turns; the first user message is ``text``; turn 1 streams two chunks."""
    chunk = {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "hel"}}
    log: list[Any] = [
        turn_start(0, 1),
        user_message(1, text),
        step_start(2, 1, 1),
        event(3, "assistant/chunk", chunk),
        event(4, "assistant/chunk", {**chunk, "chunk": {"type": "text-delta", "index": 0, "text": "lo"}}),
        assistant_message(5, "hello"),
        step_end(6, 1, 1),
        turn_end(7, 1),
    ]
    for turn in range(2, turns + 1):
        log += simple_turn(len(log), turn, f"more {turn}")
    return log


def plant(
    root: Path,
    session_id: str,
    events: list[Any],
    *,
    cwd: str = WORK,
    age_days: float = 0.0,
    created_at: int = 1000,
    batch: int = 3,
    compression: str = "zstd",
    **extra: Any,
) -> Path:
    """Store ``events`` in batches of ``batch`` (one frame each), aged by ``age_days``: the log's own events happen
    then (its last activity, which listing, ``--since`` and ``prune`` follow), and its file's mtime says so too."""
    stamp = NOW - age_days * DAY_S
    events = [msgspec.structs.replace(e, time=int(stamp * 1000)) for e in events]

    async def write() -> None:
        backend = JsonlBackend(root, compression=compression)  # type: ignore[arg-type]
        storage = StorageMetadata(meta(session_id, cwd, created_at=created_at, **extra))
        for start in range(0, len(events), batch):
            await backend.append_batch(storage, events[start : start + batch], start > 0)

    anyio.run(write)
    path = transcript(root, session_id, cwd, compression)
    os.utime(path, (stamp, stamp))
    return path


def transcript(root: Path, session_id: str, cwd: str = WORK, compression: str = "zstd") -> Path:
    backend = JsonlBackend(root, compression=compression)  # type: ignore[arg-type]
    return Path(backend.locate(meta(session_id, cwd)).path)


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every stored file's bytes and mtime (writer-lease lock files are not data: any writer may create one; nor are
    the JSONL root's activity journal and index, a listing cache a writer or a listing may touch)."""
    return {
        str(p): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "session.lock" and not p.name.startswith(".dsh-activity.")
    }


def listed(root: Path, *argv: str) -> list[str]:
    run = dsh("--root", str(root), "list", "--json", *argv)
    assert run.code == 0, run.err
    return [s["id"] for s in run.json()["sessions"]]


def error_doc(run: Run) -> dict[str, Any]:
    doc = run.json()
    assert set(doc) == {"error"}, doc
    error: dict[str, Any] = doc["error"]
    assert error["exit"] == run.code and error["message"]
    return error


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Five sessions, most recent activity first: fresh, week, month, season, year."""
    path = tmp_path / "sessions"
    plant(path, "year", chat_log("plan the offsite"), age_days=365, created_at=1)
    plant(path, "season", chat_log("draft the budget"), age_days=90, created_at=5)
    plant(path, "month", chat_log("fix the login bug", turns=3), age_days=40, created_at=4)
    plant(path, "week", chat_log("review the PR"), age_days=7, created_at=3, cwd=OTHER)
    plant(path, "fresh", chat_log("write the release notes"), age_days=0.01, created_at=2, parent_session="month")
    return path


# ----------------------------------------------------------------------------------------------------------------
# list


def test_list_table_has_turns_and_a_title_and_no_chunk_counting(root: Path) -> None:
    run = dsh("--root", str(root), "list")
    assert run.code == 0, run.err
    header, *rows = run.out.splitlines()
    assert header.split() == ["ID", "LAST", "ACTIVITY", "TURNS", "EVENTS", "SIZE", "STATUS", "CWD", "TITLE"]
    assert [row.split()[0] for row in rows] == ["fresh", "week", "month", "season", "year"]
    month = rows[2]
    assert month.endswith(f"{WORK}  fix the login bug")
    # 3 turns; 14 stored events (2 of them streamed chunks): the table counts 14, as --json's "events" does.
    cells = month.split()
    assert cells[cells.index("ok") - 4 : cells.index("ok") - 2] == ["3", "14"]
    assert run.err == ""


def test_list_json_pages_with_a_cursor(root: Path) -> None:
    first = dsh("--root", str(root), "list", "--limit", "2", "--json")
    assert first.code == 0, first.err
    doc = first.json()
    assert [s["id"] for s in doc["sessions"]] == ["fresh", "week"]
    fresh = doc["sessions"][0]
    assert (fresh["turns"], fresh["chunks"], fresh["title"], fresh["events"]) == (1, 2, "write the release notes", 8)
    assert fresh["updatedAt"] == int(transcript(root, "fresh").stat().st_mtime_ns // 1_000_000)
    cursor = doc["nextCursor"]
    assert isinstance(cursor, str)
    second = dsh("--root", str(root), "list", "--limit", "2", "--cursor", cursor, "--json").json()
    assert [s["id"] for s in second["sessions"]] == ["month", "season"]
    third = dsh("--root", str(root), "list", "--limit", "2", "--cursor", second["nextCursor"], "--json").json()
    assert [s["id"] for s in third["sessions"]] == ["year"] and third["nextCursor"] is None
    table = dsh("--root", str(root), "list", "--limit", "2")
    assert table.out.splitlines()[-1].startswith("more sessions: add --cursor ")


def test_list_filters_and_order(root: Path, tmp_path: Path) -> None:
    assert listed(root, "--order", "created") == ["season", "month", "week", "fresh", "year"]
    assert listed(root, "--cwd", OTHER) == ["week"]
    assert listed(root, "--cwd", WORK, "--limit", "2") == ["fresh", "month"]
    assert listed(root, "--parent", "month") == ["fresh"]
    assert listed(root, "--since", "30d") == ["fresh", "week"]
    since = time.strftime("%Y-%m-%d", time.localtime(NOW - 60 * DAY_S))
    assert listed(root, "--since", since) == ["fresh", "week", "month"]
    # --cwd is resolved against the working directory of the command.
    cwd_run = subprocess.run(
        [str(SCRIPT), "--root", str(root), "list", "--json", "--cwd", "."],
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
    )
    assert json.loads(cwd_run.stdout)["sessions"] == []


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--limit", "0"], "positive integer"),
        (["--limit", "ten"], "positive integer"),
        (["--since", "last tuesday"], "--since expects a date"),
        (["--since", "0d"], "positive duration"),
        (["--order", "oldest"], "invalid choice"),
        (["--cursor", "not-a-cursor"], "cursor"),
    ],
)
def test_list_bad_input_is_a_usage_error(root: Path, argv: list[str], needle: str, cli: Callable[..., Run]) -> None:
    run = cli("--root", str(root), "list", *argv)
    assert run.code == 2 and needle in run.err, run.err
    assert run.out == ""
    as_json = cli("--root", str(root), "list", "--json", *argv)
    assert as_json.code == 2 and needle in error_doc(as_json)["message"]


def test_a_cursor_from_another_root_is_refused(root: Path, tmp_path: Path, cli: Callable[..., Run]) -> None:
    other = tmp_path / "other"
    plant(other, "elsewhere", chat_log("x"))
    plant(other, "elsewhere-2", chat_log("y"))
    cursor = cli("--root", str(other), "list", "--limit", "1", "--json").json()["nextCursor"]
    run = cli("--root", str(root), "list", "--limit", "1", "--cursor", cursor, "--json")
    assert run.code == 2
    error = error_doc(run)
    assert error["code"] == "bad_cursor" and "another storage root" in error["message"]
    # Another filter set is refused too: the cursor would otherwise skip the wrong sessions.
    own = cli("--root", str(root), "list", "--limit", "1", "--json").json()["nextCursor"]
    run = cli("--root", str(root), "list", "--limit", "1", "--cursor", own, "--cwd", WORK)
    assert run.code == 2 and "other filters" in run.err


def test_list_says_when_stored_sessions_cannot_be_read(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    plant(root, "good", chat_log("fine"))
    empty = transcript(root, "empty")
    empty.parent.mkdir(parents=True)
    empty.write_bytes(b"")
    run = dsh("--root", str(root), "list", "--json")
    assert run.code == 0
    doc = run.json()
    assert [s["id"] for s in doc["sessions"]] == ["good"]
    assert [u["id"] for u in doc["unreadable"]] == ["empty"]
    assert "1 stored session(s) cannot be read" in run.err and "dsh-sessions verify" in run.err


def test_missing_root_is_an_error_for_every_reading_command(tmp_path: Path, cli: Callable[..., Run]) -> None:
    missing = tmp_path / "typo"
    # The first command from a real process (exit 4 as the shell sees it), the others in this one.
    for argv, via in (
        (["list"], dsh),
        (["verify"], cli),
        (["stats"], cli),
        (["prune", "--older-than", "30d"], cli),
        (["rm", "--yes", "x"], cli),
    ):
        run = via("--root", str(missing), *argv)
        assert run.code == 4, (argv, run.err)
        assert "does not exist" in run.err
        as_json = via("--root", str(missing), *argv, "--json")
        assert as_json.code == 4 and error_doc(as_json)["code"] == "unavailable"
    assert not missing.exists()


# ----------------------------------------------------------------------------------------------------------------
# rm


def test_rm_deletes_durably_and_only_what_it_was_told(root: Path) -> None:
    run = dsh("--root", str(root), "rm", "year", "season", "--yes")
    assert run.code == 0, run.err
    assert run.out == "deleted year\ndeleted season\n"
    assert not transcript(root, "year").exists() and not transcript(root, "year").parent.exists()
    assert listed(root) == ["fresh", "week", "month"]
    assert dsh("--root", str(root), "show", "year").code == 3
    as_json = dsh("--root", str(root), "rm", "week", "--yes", "--json")
    assert as_json.json()["deleted"] == ["week"]


def test_rm_bad_input_changes_nothing(root: Path, cli: Callable[..., Run]) -> None:
    before = snapshot(root)
    unknown = dsh("--root", str(root), "rm", "year", "no-such-session", "--yes")
    assert unknown.code == 3 and "no-such-session" in unknown.err and "nothing was deleted" in unknown.err
    assert error_doc(dsh("--root", str(root), "rm", "nope", "--yes", "--json"))["code"] == "not_found"
    unconfirmed = dsh("--root", str(root), "rm", "year")  # stdin is not a terminal
    assert unconfirmed.code == 2 and "--yes" in unconfirmed.err
    assert cli("--root", str(root), "rm").code == 2
    assert snapshot(root) == before


def test_rm_asks_on_a_terminal(root: Path) -> None:
    declined = on_a_terminal([str(SCRIPT), "--root", str(root), "rm", "year"], "n\n")
    assert declined.code == 5 and "Delete 1 session(s) (year) for good? [y/N]" in declined.err
    assert transcript(root, "year").exists()
    accepted = on_a_terminal([str(SCRIPT), "--root", str(root), "rm", "year"], "y\n")
    assert accepted.code == 0 and "deleted year" in accepted.out
    assert not transcript(root, "year").exists()


HOLDER = textwrap.dedent(
    """
    import sys, anyio
    from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
    from dsh.session_persistence.testing import meta, turn_start
    from dsh.session_persistence_jsonl import JsonlBackend

    async def main(root, session_id, turn):
        host = Host()
        store = SessionStore(host)
        async with PersistenceCoordinator(host, JsonlBackend(root)) as persistence:
            loaded = await persistence.load(session_id)
            session = store.create(session_id, seed=loaded.events, meta=loaded.meta)
            session.append_event(turn_start(len(session.events), int(turn)))
            await store.flush(session)
            print("holding", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)
            store.dispose(session)

    anyio.run(main, *sys.argv[1:])
    """
)


@pytest.fixture
def held(root: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holds session "month" live (and so its writer lease) until the test ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root), "month", "4"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
        yield proc
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_a_session_live_in_another_process_is_refused_with_its_holder(root: Path, held: subprocess.Popen[str]) -> None:
    before = snapshot(root)
    for argv in (["rm", "month", "--yes"], ["compact", "month"]):
        run = dsh("--root", str(root), *argv)
        assert run.code == 1, (argv, run.err)
        assert f"pid {held.pid}" in run.err and "locked" in run.err
        as_json = dsh("--root", str(root), *argv, "--json")
        assert error_doc(as_json)["code"] == "locked"
    # Its last event (the holder's turn/start, stamped in 1970 by the test helper) leaves it old: the policy
    # selects it and only the lease protects it.
    pruned = dsh("--root", str(root), "prune", "--older-than", "30d", "--yes", "--json").json()
    assert "month" not in pruned["deleted"] and [s["id"] for s in pruned["skipped"]] == ["month"]
    assert pruned["deleted"] == ["season", "year"]
    assert transcript(root, "month").read_bytes() == before[str(transcript(root, "month"))][0]


# ----------------------------------------------------------------------------------------------------------------
# prune


def test_prune_is_a_dry_run_without_a_terminal(root: Path) -> None:
    before = snapshot(root)
    run = dsh("--root", str(root), "prune", "--older-than", "30d")
    assert run.code == 0, run.err
    assert "would delete month" in run.out and "would delete season" in run.out and "would delete year" in run.out
    assert "dry run: stdin is not a terminal, pass --yes to delete" in run.out
    explicit = dsh("--root", str(root), "prune", "--older-than", "30d", "--dry-run", "--yes", "--json").json()
    assert explicit["dryRun"] is True and [s["id"] for s in explicit["selected"]] == ["month", "season", "year"]
    assert explicit["deleted"] == [] and explicit["kept"] == 2
    assert snapshot(root) == before


def test_prune_deletes_by_age_and_keeps_the_last_n(root: Path) -> None:
    run = dsh("--root", str(root), "prune", "--older-than", "30d", "--keep-last", "3", "--yes")
    assert run.code == 0, run.err
    assert run.out.splitlines() == ["deleted season", "deleted year", "prune: 2 deleted, 0 skipped, 3 kept"]
    assert listed(root) == ["fresh", "week", "month"]
    doc = dsh("--root", str(root), "prune", "--keep-last", "1", "--yes", "--json").json()
    assert doc["deleted"] == ["week", "month"] and doc["dryRun"] is False
    assert listed(root) == ["fresh"]


@pytest.mark.parametrize("duration", ["30", "abc", "0d", "-5d", "30x", "1.5d", "", "99999999999d"])
def test_prune_refuses_nonsense_durations(root: Path, duration: str, cli: Callable[..., Run]) -> None:
    before = snapshot(root)
    run = cli("--root", str(root), "prune", "--older-than", duration, "--yes")
    assert run.code == 2, run.err
    assert "--older-than" in run.err
    assert error_doc(cli("--root", str(root), "prune", "--older-than", duration, "--yes", "--json"))["exit"] == 2
    assert snapshot(root) == before


def test_prune_needs_a_policy(root: Path, cli: Callable[..., Run]) -> None:
    before = snapshot(root)
    assert cli("--root", str(root), "prune", "--yes").code == 2
    assert cli("--root", str(root), "prune", "--keep-last", "-1", "--yes").code == 2
    assert cli("--root", str(root), "prune", "--keep-last", "many", "--yes").code == 2
    assert snapshot(root) == before


def test_prune_asks_and_shows_progress_on_a_terminal(root: Path) -> None:
    run = on_a_terminal([str(SCRIPT), "--root", str(root), "prune", "--older-than", "30d"], "y\n")
    assert run.code == 0, run.err
    assert "Delete these 3 session(s) for good? [y/N]" in run.err
    assert "\rdeleting sessions 3/3" in run.err
    assert listed(root) == ["fresh", "week"]


# ----------------------------------------------------------------------------------------------------------------
# compact


def test_compact_rewrites_one_batch_with_the_same_events(root: Path) -> None:
    path = transcript(root, "month")
    mtime = path.stat().st_mtime_ns
    before = dsh("--root", str(root), "export", "month").out
    size = path.stat().st_size
    run = dsh("--root", str(root), "compact", "month", "--json")
    assert run.code == 0, run.err
    doc = run.json()
    assert doc["id"] == "month" and doc["events"] == 14
    assert doc["bytesBefore"] == size and doc["bytesAfter"] == path.stat().st_size < size
    assert dsh("--root", str(root), "export", "month").out == before
    assert path.stat().st_mtime_ns == mtime  # compaction is not activity: retention still sees the real age
    assert dsh("--root", str(root), "verify", "month").code == 0
    text = dsh("--root", str(root), "compact", "month")
    assert text.code == 0 and text.out.startswith("compacted month: 14 events in one batch")


def test_compact_bad_input_changes_nothing(root: Path) -> None:
    plant(root, "open", [*one_turn_log(), turn_start(6, 2), step_start(7, 2, 1)])
    before = snapshot(root)
    assert dsh("--root", str(root), "compact", "nope").code == 3
    needs = dsh("--root", str(root), "compact", "open", "--json")
    assert needs.code == 1 and error_doc(needs)["code"] == "needs_repair"
    assert "repair" in dsh("--root", str(root), "compact", "open").err
    assert snapshot(root) == before


# ----------------------------------------------------------------------------------------------------------------
# export --salvage, verify, errors


def test_export_salvage_keeps_the_committed_prefix(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    path = plant(root, "hurt", one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3), batch=3)
    frames = _frames(path.read_bytes())
    assert len(frames) == 10  # a declaration frame and a data frame each: the header, then 4 batches of 3 events
    data = bytearray(path.read_bytes())
    start, end = frames[7]
    data[(start + end) // 2] ^= 0xFF  # the data of the third batch (seq 6..8) is damaged
    path.write_bytes(bytes(data))
    plain = dsh("--root", str(root), "export", "hurt")
    assert plain.code == 1 and plain.out == ""
    salvaged = dsh("--root", str(root), "export", "hurt", "--salvage")
    assert salvaged.code == 0, salvaged.err
    seqs = [json.loads(line)["seq"] for line in salvaged.out.splitlines()]
    assert seqs == [0, 1, 2, 3, 4, 5]
    assert "warning: session hurt is damaged" in salvaged.err and "exported the 6 event(s)" in salvaged.err
    plant(root, "whole", one_turn_log())
    assert (
        dsh("--root", str(root), "export", "whole", "--salvage").out == dsh("--root", str(root), "export", "whole").out
    )
    assert dsh("--root", str(root), "export", "whole", "--salvage").err == ""
    assert dsh("--root", str(root), "export", "nope", "--salvage").code == 3


def _frames(data: bytes) -> list[tuple[int, int]]:
    """Frame boundaries by decompressing greedily: each frame ends where the decoder reports ``eof``."""
    import zstandard

    out = []
    pos = 0
    while pos < len(data):
        dobj = zstandard.ZstdDecompressor().decompressobj()
        dobj.decompress(data[pos:])
        end = len(data) - len(dobj.unused_data)
        out.append((pos, end))
        pos = end
    return out


def test_export_salvage_of_a_plain_jsonl_log(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    path = plant(root, "hurt", one_turn_log() + simple_turn(6, 2), compression="none")
    lines = path.read_bytes().split(b"\n")
    (hit,) = [n for n, line in enumerate(lines) if b'"seq":4,' in line]
    lines[hit] = lines[hit].replace(b'"seq":4,', b'"seq":X,')  # seq 4 cannot be decoded; seq 5..8 follow it
    path.write_bytes(b"\n".join(lines))
    assert dsh("--root", str(root), "-o", "compression=none", "export", "hurt").code == 1
    run = dsh("--root", str(root), "-o", "compression=none", "export", "hurt", "--salvage")
    assert run.code == 0, run.err
    # A batch is all or nothing: the damaged one (seq 3..5) is dropped whole, the one before it is kept.
    assert [json.loads(line)["seq"] for line in run.out.splitlines()] == [0, 1, 2]
    assert "exported the 3 event(s)" in run.err


def test_verify_reports_every_unreadable_file(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    plant(root, "good", chat_log("fine"))
    for session_id, content in (("zero", b""), ("headless", b"not a zstd frame at all\n")):
        path = transcript(root, session_id)
        path.parent.mkdir(parents=True)
        path.write_bytes(content)
    run = dsh("--root", str(root), "verify")
    assert run.code == 1
    assert "CORRUPT      zero:" in run.out and "CORRUPT      headless:" in run.out
    assert "verify FAILED: 3 session(s): 1 ok, 0 recoverable, 2 corrupt" in run.out
    doc = dsh("--root", str(root), "verify", "--json")
    assert doc.code == 1 and doc.json()["ok"] is False
    assert sorted(s["id"] for s in doc.json()["sessions"] if s["status"] == "corrupt") == ["headless", "zero"]
    listing = dsh("--root", str(root), "list")
    assert listing.code == 0 and "2 stored session(s) cannot be read" in listing.err
    # A file nobody can read can still be deleted by its id (the header is not needed for that).
    removed = dsh("--root", str(root), "rm", "zero", "headless", "--yes")
    assert removed.code == 0, removed.err
    assert dsh("--root", str(root), "verify").code == 0


def test_torn_tail_message_does_not_claim_what_it_cannot_know(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    path = plant(root, "cut", one_turn_log() + simple_turn(6, 2), batch=3)
    data = path.read_bytes()
    path.write_bytes(data[: _frames(data)[-1][0] + 5])  # cut inside the last frame
    run = dsh("--root", str(root), "verify")
    assert run.code == 0
    assert "unfinished write" in run.out and "cut short from outside" in run.out
    assert "never acknowledged" not in run.out


def test_errors_are_json_on_stdout_under_json(root: Path, cli: Callable[..., Run]) -> None:
    show = dsh("--root", str(root), "show", "nope", "--json")
    assert show.code == 3 and error_doc(show)["code"] == "not_found"
    assert "not found" in show.err  # the human line still goes to stderr
    usage = cli("--json", "--root", str(root), "list", "--bogus")
    assert usage.code == 2 and error_doc(usage)["code"] == "usage"
    ok = dsh("--root", str(root), "verify", "--json")
    assert ok.code == 0 and "error" not in ok.json()


def on_a_terminal(argv: list[str], answer: str) -> Run:
    """Run with stdin and stderr on a pseudo-terminal (stdout a pipe), typing ``answer`` at the prompt."""
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "DSH_SESSIONS_ROOT"}
    proc = subprocess.Popen(argv, stdin=secondary, stdout=subprocess.PIPE, stderr=secondary, env=env)
    os.close(secondary)
    err = b""
    answered = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([primary], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            err += chunk
            if not answered and b"[y/N]" in err:
                os.write(primary, answer.encode())
                answered = True
        elif proc.poll() is not None:
            break
    assert proc.stdout is not None
    with proc.stdout:
        out = proc.stdout.read().decode()
    proc.wait(timeout=30)
    os.close(primary)
    return Run(proc.returncode, out, err.decode(errors="replace"))
