"""The activity index and journal never hide a session (issue 36 items 5 and 6): a journal truncated in place or
replaced by another one on the same inode, an index cut at any line boundary and one flipped byte anywhere in the
index or the journal send the listing to a full scan, and every page stays the truth (computed from the logs).

Real files; the flips and cuts are exhaustive over a small store (every byte, every line boundary)."""
# ruff: noqa: ASYNC230

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from dsh.session_persistence import Host, PersistenceCoordinator
from dsh.session_persistence.backend import ListQuery, StorageMetadata
from dsh.session_persistence.testing import meta, simple_turn
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl._files import lifecycle
from dsh.session_persistence_jsonl._files.activity_journal import INDEX_NAME, JOURNAL_NAME, sealed_line

from .test_activity_index import CWDS, build, through_index, truth, turn_at

pytestmark = pytest.mark.anyio


async def _write_newest(root: Path, name: str = "s00") -> None:
    """A write of the oldest session, announced in the journal after the index's point: now the newest."""
    backend = JsonlBackend(root)
    header = meta(name, CWDS[int(name[1:]) % 2])
    stored = await backend.load_stored(name)
    assert stored is not None
    lease = await backend.acquire_writer_lease(header)
    await backend.append_batch(StorageMetadata(header), turn_at(len(stored.events)), True)
    await lease.release()
    await backend.aclose()


def _page(root: Path, limit: int) -> list[str]:
    rows = lifecycle.list_rows(str(root), "zstd", ListQuery(limit=limit), 1 << 26, lambda: None)
    return [row.id for row in rows]


async def test_a_journal_truncated_in_place_is_another_journal(tmp_path: Path) -> None:
    backend = await build(tmp_path, 6)
    journal = tmp_path / JOURNAL_NAME
    data = journal.read_bytes()
    # In place, at a line boundary after its header: same device, same inode, same instance, but shorter than the
    # point the index read up to; the writer's records land before that point.
    os.truncate(journal, _line_ends(data)[2])
    await _write_newest(tmp_path)
    assert journal.stat().st_size < len(data)
    assert truth(tmp_path, 1) == ["s00"]
    assert through_index(tmp_path, 3) is None
    assert [r.id for r in await backend.list_page(ListQuery(limit=3))] == truth(tmp_path, 3)


async def test_a_journal_replaced_on_the_same_inode_is_another_journal(tmp_path: Path) -> None:
    backend = await build(tmp_path, 6)
    journal = tmp_path / JOURNAL_NAME
    old = journal.read_bytes()
    ino, point = journal.stat().st_ino, len(old)
    # Recreated with the same inode number: a new journal (its own instance id) where a writer's records come
    # first, then records that end exactly at the old point with the very line the index read last (so nothing
    # but the instance id tells the two journals apart), then more records after it.
    with open(journal, "r+b") as fh:
        fh.truncate(0)
        fh.write(sealed_line(b"dsh-activity-journal\t2\t" + secrets.token_hex(16).encode()))
    await _write_newest(tmp_path)
    last = old[old.rindex(b"\n", 0, point - 1) + 1 :]
    gap = point - journal.stat().st_size - len(last)
    assert gap > 40
    filler, left = b"", gap
    while left:  # retirements of nothing, each of an exact length (16 bytes and more)
        size = left if left <= 100 else 100 if left - 100 >= 16 else 50
        filler += sealed_line(b"-\tx/" + b"y" * (size - 16) + b"\t1")
        left -= size
    assert len(filler) == gap
    with open(journal, "ab") as fh:
        fh.write(filler + last + sealed_line(b"-\tx/z\t1"))
    assert journal.stat().st_ino == ino and journal.read_bytes()[point - len(last) : point] == last
    assert through_index(tmp_path, 3) is None
    assert [r.id for r in await backend.list_page(ListQuery(limit=3))] == truth(tmp_path, 3) == ["s00", "s05", "s04"]


def _line_ends(data: bytes) -> list[int]:
    return [i + 1 for i, byte in enumerate(data) if byte == 0x0A]


async def test_every_flip_and_every_cut_of_the_index_and_journal_lists_every_session(tmp_path: Path) -> None:
    await build(tmp_path, 5)
    await _write_newest(tmp_path)  # records after the index's point: the journal matters for the next page
    index, journal = tmp_path / INDEX_NAME, tmp_path / JOURNAL_NAME
    saved = {index: index.read_bytes(), journal: journal.read_bytes()}
    expected = {limit: truth(tmp_path, limit) for limit in (2, 6)}
    assert expected[2][0] == "s00"
    # The journal's point: where the index stopped reading (a cut at or before it is a journal that shrank).
    point = len(saved[journal]) - len(_records_after(saved[journal]))
    variants: list[tuple[str, Path, bytes]] = []
    for target, data in saved.items():
        for at in range(len(data)):
            for mask in (0x01, 0x80):
                flipped = bytearray(data)
                flipped[at] ^= mask
                variants.append((f"flip {target.name}[{at}]^{mask:#x}", target, bytes(flipped)))
    for end in [0, *_line_ends(saved[index])[:-1]]:
        variants.append((f"cut {INDEX_NAME} at {end}", index, saved[index][:end]))
    for end in [0, *(e for e in _line_ends(saved[journal]) if e <= point)]:
        variants.append((f"cut {JOURNAL_NAME} at {end}", journal, saved[journal][:end]))
    keep = tmp_path / "journal-inode"
    os.link(journal, keep)  # a rebuild may unlink a journal it refuses: the same inode is linked back each time

    def restore(index_bytes: bytes, journal_bytes: bytes) -> None:
        index.write_bytes(index_bytes)
        if not journal.exists():
            os.link(keep, journal)
        with open(keep, "r+b") as fh:
            fh.truncate(0)
            fh.write(journal_bytes)

    restore(saved[index], saved[journal])
    assert through_index(tmp_path, 2) == expected[2]  # undisturbed, the index answers (no scan)
    for what, target, data in variants:
        restore(data if target == index else saved[index], data if target == journal else saved[journal])
        for limit, want in expected.items():
            assert _page(tmp_path, limit) == want, (what, limit)
    assert len(variants) > 2000


def _records_after(journal: bytes) -> bytes:
    """The records a writer appended after the last listing (the two of ``_write_newest``: ``+`` and ``-``)."""
    ends = _line_ends(journal)
    return journal[ends[-3] :]


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).with_name("dsh-sessions")
    return subprocess.run([str(cli), *argv], capture_output=True, text=True, timeout=120, check=False)


def test_verify_reports_the_index_state(tmp_path: Path) -> None:
    root = tmp_path / "root"
    backend = JsonlBackend(root)

    async def write() -> None:
        host = Host()
        host.load_entrypoints()
        async with PersistenceCoordinator(host, backend) as coordinator:
            for name in ("a", "b", "c"):
                await coordinator.create(meta(name))
                await coordinator.append(name, simple_turn(0, 1, name))
        await backend.list_page(ListQuery(limit=2))  # builds the index

    anyio.run(write)
    index = root / INDEX_NAME
    good = index.read_bytes()
    ok = _cli("--root", str(root), "verify", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["activityIndex"].startswith("ok (3 sessions)")
    text = _cli("--root", str(root), "verify")
    assert "activity index: ok (3 sessions)" in text.stdout, text.stdout
    last_line = good.rindex(b"\n", 0, len(good) - 1) + 1
    for damaged in (good[:last_line], good[:40] + bytes([good[40] ^ 1]) + good[41:], good[:-3] + b"0\t0\n"):
        index.write_bytes(damaged)
        report = _cli("--root", str(root), "verify", "--json")
        assert report.returncode == 0, report.stderr  # a cache: never the store's damage
        assert json.loads(report.stdout)["activityIndex"].startswith("damaged"), report.stdout
    index.unlink()
    assert "activity index: missing" in _cli("--root", str(root), "verify").stdout


def test_a_session_written_again_after_its_retirement_is_announced_again(tmp_path: Path) -> None:
    """The journal's per-write check is one look-up while the session is announced; once retired, the next write
    announces it again (a listing must see that writer), and a lease taken names its lock again."""
    from dsh.session_persistence_jsonl._files.activity_journal import ActivityJournal, checked

    journal = ActivityJournal(str(tmp_path))
    transcript = str(tmp_path / "project" / "segment" / "session.jsonl.zstd")
    for _ in range(3):
        journal.announce(transcript)  # the first write announces; the next ones write nothing
    journal.retire(transcript)
    journal.announce(transcript)
    journal.announce(transcript, lock_ino=42)
    journal.announce(transcript)
    lines = (tmp_path / JOURNAL_NAME).read_bytes().splitlines()[1:]
    records = [payload.decode().split("\t") for payload in map(checked, lines) if payload is not None]
    assert len(records) == len(lines)
    assert [(r[0], r[1]) for r in records] == [("+", "project/segment"), ("-", "project/segment")] + [
        ("+", "project/segment")
    ] * 2
    assert records[-1][-1] == "42"
