"""One "last activity" everywhere (issue 36 item 13): the LAST ACTIVITY column, the "recent" order, ``--since`` and
``prune --older-than`` all follow the log's own last event, never the transcript's mtime, which a copy (``cp -p``,
a restore) or a ``touch`` changes. Real logs and the installed command line in real processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from dsh.session_persistence.backend import ListQuery, SessionEvent, StorageMetadata
from dsh.session_persistence.testing import meta, one_turn_log
from dsh.session_persistence_jsonl import JsonlBackend

from ._sealed import provider

pytestmark = pytest.mark.anyio
DAY_MS = 86_400_000
NOW_MS = time.time_ns() // 1_000_000


def _turn(when: int, first_seq: int = 0) -> list[SessionEvent]:
    return [msgspec.structs.replace(e, seq=e.seq + first_seq, time=when) for e in one_turn_log()]


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).with_name("dsh-sessions")
    return subprocess.run([str(cli), *argv], capture_output=True, text=True, timeout=120, check=False)


async def _store(root: Path, **kw: object) -> dict[str, Path]:
    """``recent`` (active an hour ago, its file touched 90 days into the past), ``restored`` (active 60 days ago,
    copied back from elsewhere today with a fresh mtime) and ``mid`` (active 10 days ago, an honest mtime)."""
    backend = JsonlBackend(root, **kw)  # type: ignore[arg-type]
    paths: dict[str, Path] = {}
    for name, when in (("recent", NOW_MS - 3_600_000), ("mid", NOW_MS - 10 * DAY_MS)):
        header = meta(name, "/work", created_at=NOW_MS - 100 * DAY_MS)
        await backend.append_batch(StorageMetadata(header), _turn(when - 1000), False)
        await backend.append_batch(StorageMetadata(header), _turn(when, 6), True)
        paths[name] = Path(backend.locate(header).path)
    elsewhere = JsonlBackend(root.parent / (root.name + "-backup"), **kw)  # type: ignore[arg-type]
    header = meta("restored", "/work", created_at=NOW_MS - 100 * DAY_MS)
    await elsewhere.append_batch(StorageMetadata(header), _turn(NOW_MS - 60 * DAY_MS), False)
    paths["restored"] = Path(backend.locate(header).path)
    paths["restored"].parent.mkdir(parents=True)
    shutil.copyfile(elsewhere.locate(header).path, paths["restored"])  # mtime: now
    old = time.time() - 90 * 86_400
    os.utime(paths["recent"], (old, old))  # touch -d "90 days ago"
    os.utime(paths["mid"], (time.time() - 10 * 86_400,) * 2)
    return paths


async def test_order_since_and_rows_follow_the_log_not_the_mtime(tmp_path: Path) -> None:
    root = tmp_path / "root"
    await _store(root)
    backend = JsonlBackend(root)
    for query in (ListQuery(), ListQuery(limit=2), ListQuery(limit=5)):
        rows = await backend.list_page(query)
        assert [r.id for r in rows] == ["recent", "mid", "restored"][: query.limit], query
        assert [r.updated_at for r in rows] == [NOW_MS - 3_600_000, NOW_MS - 10 * DAY_MS, NOW_MS - 60 * DAY_MS][
            : query.limit
        ]
    since = NOW_MS - 30 * DAY_MS
    for limit in (None, 1, 10):
        assert [r.id for r in await backend.list_page(ListQuery(limit=limit, since=since))] == ["recent", "mid"][:limit]
    created = await backend.list_page(ListQuery(order="created", since=since))
    assert sorted(r.id for r in created) == ["mid", "recent"]


async def test_a_sealed_log_is_ordered_by_its_last_event_with_the_key(tmp_path: Path) -> None:
    root = tmp_path / "root"
    await _store(root, encryption=provider())
    keyed = JsonlBackend(root, encryption=provider())
    assert [r.id for r in await keyed.list_page(ListQuery(limit=3))] == ["recent", "mid", "restored"]
    # Without the key only the header and the file are readable: the file's mtime stands in (documented).
    keyless = await JsonlBackend(root).list_page(ListQuery())
    assert sorted(r.id for r in keyless) == ["mid", "recent", "restored"]


async def test_the_command_line_lists_filters_and_prunes_by_the_same_time(tmp_path: Path) -> None:
    root = tmp_path / "root"
    await _store(root)
    base = ["--root", str(root)]
    listed = _cli(*base, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    sessions = json.loads(listed.stdout)["sessions"]
    assert [s["id"] for s in sessions] == ["recent", "mid", "restored"]
    assert all(s["updatedAt"] == s["lastEventAt"] for s in sessions), sessions  # the row is the order's time
    table = _cli(*base, "list", "--limit", "2")
    assert [line.split()[0] for line in table.stdout.splitlines()[1:3]] == ["recent", "mid"], table.stdout
    since = _cli(*base, "list", "--since", "30d", "--json")
    assert [s["id"] for s in json.loads(since.stdout)["sessions"]] == ["recent", "mid"], since.stdout
    dry = _cli(*base, "prune", "--older-than", "30d", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert [s["id"] for s in json.loads(dry.stdout)["selected"]] == ["restored"]
    pruned = _cli(*base, "prune", "--older-than", "30d", "--yes", "--json")
    assert json.loads(pruned.stdout)["deleted"] == ["restored"], pruned.stdout + pruned.stderr
    left = _cli(*base, "list", "--json")
    assert [s["id"] for s in json.loads(left.stdout)["sessions"]] == ["recent", "mid"]
