"""``dsh-sessions`` says what is true: a bad id is a usage error (exit 2), a filter that matched nothing says so,
the unreadable-session warning survives paging and filters, and LAST ACTIVITY comes from the log, not the file.

Sessions are planted with the JSONL backend's own primitives in a temporary root; the CLI runs in-process.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh.session_persistence._cli import _main
from dsh.session_persistence._cli._io import Io
from dsh.session_persistence._cli._output import local_time
from dsh.session_persistence.backend import StorageMetadata
from dsh.session_persistence.testing import meta, one_turn_log
from dsh.session_persistence_jsonl import JsonlBackend

WORK = "/home/me/project"


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = _main.run(list(argv), Io(out=out, err=err, inp=io.StringIO()))
    return code, out.getvalue(), err.getvalue()


def plant(root: Path, session_id: str, *, cwd: str = WORK) -> Path:
    events: list[Any] = list(one_turn_log())

    async def write() -> None:
        await JsonlBackend(root).append_batch(StorageMetadata(meta(session_id, cwd)), events, False)

    anyio.run(write)
    return Path(JsonlBackend(root).locate(meta(session_id, cwd)).path)


def plant_unreadable(root: Path, session_id: str) -> None:
    path = Path(JsonlBackend(root).locate(meta(session_id, WORK)).path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")


@pytest.mark.parametrize(
    "argv",
    [
        ["show", ""],
        ["verify", ""],
        ["export", ""],
        ["repair", "", "--yes"],
        ["compact", ""],
        ["rm", "--yes", "ok", ""],
        ["list", "--parent", ""],
        ["show", "bad\udcff"],  # argv bytes that are not text arrive as a lone surrogate
    ],
)
def test_a_bad_session_id_is_a_usage_error(tmp_path: Path, argv: list[str]) -> None:
    root = tmp_path / "sessions"
    plant(root, "ok")
    code, out, err = cli("--root", str(root), *argv)
    assert code == 2, (code, out, err)
    assert "session id" in err and "internal error" not in err


def test_a_filter_that_matched_nothing_says_so(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    plant(root, "s1")
    code, out, err = cli("--root", str(root), "list", "--cwd", "/nope")
    assert code == 0, err
    assert out == f"no sessions match --cwd /nope under {root}\n"
    code, out, _ = cli("--root", str(root), "list", "--parent", "nobody")
    assert out == f"no sessions match --parent nobody under {root}\n"


@pytest.mark.parametrize("extra", [["--limit", "1"], ["--since", "7d"], ["--cwd", WORK], ["--cwd", "/nope"]])
def test_the_unreadable_warning_survives_paging_and_filters(tmp_path: Path, extra: list[str]) -> None:
    root = tmp_path / "sessions"
    plant(root, "a")
    plant(root, "b")
    plant_unreadable(root, "broken")
    code, out, err = cli("--root", str(root), "list", *extra)
    assert code == 0, err
    assert "1 stored session(s) cannot be read" in err and "broken" in err
    code, out, err = cli("--root", str(root), "list", "--json", *extra)
    assert [u["id"] for u in json.loads(out)["unreadable"]] == ["broken"]


def test_a_later_page_does_not_repeat_the_warning(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    plant(root, "a")
    plant(root, "b")
    plant_unreadable(root, "broken")
    _, out, err = cli("--root", str(root), "list", "--json", "--limit", "1")
    cursor = json.loads(out)["nextCursor"]
    assert cursor is not None and "broken" in err
    _, out, err = cli("--root", str(root), "list", "--json", "--limit", "1", "--cursor", cursor)
    assert err == "" and json.loads(out)["unreadable"] == []


def test_last_activity_comes_from_the_log_not_the_file(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    path = plant(root, "copied")
    last_event = one_turn_log()[-1].time
    os.utime(path, (1_900_000_000, 1_900_000_000))  # a copy or restore sets a new mtime (here: 2030)
    code, out, err = cli("--root", str(root), "list")
    assert code == 0, err
    row = out.splitlines()[1]
    assert local_time(last_event) in row and local_time(1_900_000_000_000) not in row
    code, out, err = cli("--root", str(root), "list", "--json")
    (doc,) = json.loads(out)["sessions"]
    assert doc["lastEventAt"] == last_event


def test_turns_count_the_turns_a_user_started(tmp_path: Path) -> None:
    from dsh.session_persistence._cli._list_cmd import user_turns
    from dsh.session_persistence.testing import simple_turn, turn_end, turn_start, user_message

    log = list(one_turn_log())
    assert user_turns(tuple(log)) == 1
    log += simple_turn(len(log), 2, "again")
    assert user_turns(tuple(log)) == 2
    # A turn no user opened (a continuation, a model-response turn) does not count; two user messages outside turns
    # in one gap count once, a later gap again (the Agents SDK integration's shape).
    n = len(log)
    log += [turn_start(n, 3), turn_end(n + 1, 3)]
    assert user_turns(tuple(log)) == 2
    n = len(log)
    log += [user_message(n, "a"), user_message(n + 1, "b"), turn_start(n + 2, 4), turn_end(n + 3, 4)]
    log += [user_message(n + 4, "c")]
    assert user_turns(tuple(log)) == 4
