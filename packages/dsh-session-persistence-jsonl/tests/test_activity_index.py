"""The activity index: a "recent" page served through it is always the page a full scan gives.

Real files and real processes: the index may be missing, damaged, from another boot or stale (a foreign change, a
copied-in session, a writer killed before it retired its session, a live writer that keeps no journal), and every
listing must still be the truth, which these tests compute from the logs themselves: the order is each log's own
last activity (its last event's time), never the transcript's mtime, which these tests scramble on purpose.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from dsh.session_persistence.backend import ListQuery, SessionEvent, StorageMetadata
from dsh.session_persistence.testing import meta, one_turn_log
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl._files import activity, activity_list, activity_writers, lifecycle
from dsh.session_persistence_jsonl._files.activity_journal import INDEX_NAME, JOURNAL_NAME
from dsh.session_persistence_jsonl._files.activity_key import ActivityReader
from dsh.session_persistence_jsonl._format.v1 import BufferSource, walk_declared
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.anyio

CWDS = ["/home/me/alpha", "/home/me/beta"]
#: Far enough in the past that the index trusts a directory's mtime (it re-reads one changed within RACY_NS).
OLD = time.time() - 3600


#: Event times (ms): every write in these tests is newer than the one before it.
CLOCK = itertools.count(1_750_000_000_000, 1000)


def turn_at(first_seq: int = 0, when: int | None = None) -> list[SessionEvent]:
    """One completed turn from ``first_seq`` whose events happen at ``when`` (the next tick of the clock)."""
    at = next(CLOCK) if when is None else when
    return [msgspec.structs.replace(e, seq=e.seq + first_seq, time=at) for e in one_turn_log()]


def log_activity(transcript: Path) -> int:
    """The log's own last activity, decoded by the loader (not by the listing's reader)."""
    log = walk_declared(BufferSource(transcript.read_bytes()), "zstd", str(transcript), 1 << 26)
    return log.events[-1].time if log.events else log.header.created_at


def truth(root: Path, limit: int) -> list[str]:
    """The first ``limit`` session ids newest first, from the logs' own last activity."""
    rows = []
    for project in root.iterdir():
        if not project.is_dir():
            continue
        for session in project.iterdir():
            transcript = session / "session.jsonl.zstd"
            if transcript.exists() and not transcript.is_symlink():
                rows.append((-log_activity(transcript), session.name))
    return [name for _key, name in sorted(rows)[:limit]]


def foreign_append(path: Path, when: int | None = None) -> None:
    """A turn appended in place by a program that keeps no journal (a 0.2 writer): the index hears nothing."""
    log = walk_declared(BufferSource(path.read_bytes()), "zstd", str(path), 1 << 26)
    append_bytes(path, JsonlBackend(path.parent)._core._encode_batch(turn_at(len(log.events), when), None))


async def listed(backend: JsonlBackend, limit: int) -> list[str]:
    return [row.id for row in await backend.list_page(ListQuery(limit=limit))]


def through_index(root: Path, limit: int) -> list[str] | None:
    """The page the index alone proves (``None``: it sends the listing to a full scan)."""
    reader = ActivityReader("zstd", 1 << 26, None)
    rows = activity_list.indexed_page(
        str(root), "zstd", ListQuery(limit=limit), 1 << 26, lambda: None, lifecycle._read_header, reader
    )
    return None if rows is None else [row.id for row in rows]


def append_bytes(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def spawn(script: str) -> subprocess.Popen[str]:
    """A Python child reading lines on stdin and writing lines on stdout."""
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def age_directories(root: Path) -> None:
    for project in root.iterdir():
        if project.is_dir():
            for session in project.iterdir():
                os.utime(session, (OLD, OLD))
            os.utime(project, (OLD, OLD))
    os.utime(root, (OLD, OLD))


def age(path: Path, seconds_ago: float) -> None:
    when = time.time() - seconds_ago
    os.utime(path, (when, when))


async def build(root: Path, count: int) -> JsonlBackend:
    """``count`` sessions ``s00``.. with increasing activity, every directory aged, then a listing (the index).

    The transcripts' mtimes run the other way (``s00`` the newest file): only the logs' own times order them."""
    backend = JsonlBackend(root)
    for n in range(count):
        header = meta(f"s{n:02d}", CWDS[n % 2], created_at=1000 + n)
        lease = await backend.acquire_writer_lease(header)  # as the coordinator writes: under the lease
        await backend.append_batch(StorageMetadata(header), turn_at(), False)
        await lease.release()
    await backend.aclose()
    for n in range(count):
        age(Path(backend.locate(meta(f"s{n:02d}", CWDS[n % 2])).path), 1000 + n)
    age_directories(root)
    backend = JsonlBackend(root)
    assert await listed(backend, 5) == truth(root, 5)  # the first listing scans and writes the index
    assert (root / INDEX_NAME).is_file()
    return backend


async def test_a_page_through_the_index_is_the_truth_and_needs_no_scan(tmp_path: Path) -> None:
    backend = await build(tmp_path, 12)
    assert through_index(tmp_path, 4) == truth(tmp_path, 4) == ["s11", "s10", "s09", "s08"]
    assert await listed(backend, 30) == truth(tmp_path, 30)


async def test_a_write_through_the_backend_moves_its_session_first(tmp_path: Path) -> None:
    backend = await build(tmp_path, 10)
    stored = StorageMetadata(meta("s00", CWDS[0], created_at=1000))
    # One more completed turn after the six stored events.
    await backend.append_batch(stored, turn_at(6), True)
    assert through_index(tmp_path, 3) == truth(tmp_path, 3)
    assert truth(tmp_path, 1) == ["s00"]
    assert await listed(backend, 3) == truth(tmp_path, 3)


async def test_a_session_written_and_released_between_two_listings_moves_first(tmp_path: Path) -> None:
    backend = await build(tmp_path, 8)
    header = meta("s01", CWDS[1], created_at=1001)
    lease = await backend.acquire_writer_lease(header)  # announced and retired, both after the index's point
    await backend.append_batch(StorageMetadata(header), turn_at(6), True)
    await lease.release()
    assert truth(tmp_path, 1) == ["s01"]
    assert through_index(tmp_path, 3) == truth(tmp_path, 3)


@pytest.mark.parametrize("delta_max", [1, 4096])
async def test_changes_since_the_sorted_body_are_proved_like_it(
    tmp_path: Path, delta_max: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Written into the delta in front of the body (4,096), or folded back into a sorted body at once (1).
    monkeypatch.setattr(activity_list, "DELTA_MAX", delta_max)
    monkeypatch.setattr(activity_list, "REWRITE_FRESH", 0)  # every listing that stat'ed a session rewrites
    backend = await build(tmp_path, 8)
    for tick, (name, cwd) in enumerate([("s00", CWDS[0]), ("s03", CWDS[1]), ("s00", CWDS[0])]):
        header = meta(name, cwd)
        lease = await backend.acquire_writer_lease(header)
        stored = await backend.load_stored(name)
        assert stored is not None
        await backend.append_batch(StorageMetadata(header), turn_at(len(stored.events)), True)
        await lease.release()
        age_directories(tmp_path)
        assert await listed(backend, 20) == truth(tmp_path, 20), tick
        # The next page is proved from the index alone: its delta supersedes the body's older lines.
        assert through_index(tmp_path, 20) == truth(tmp_path, 20), tick
    assert truth(tmp_path, 2) == ["s00", "s03"]


@pytest.mark.parametrize("damage", ["missing", "garbage", "cut", "empty", "other-boot", "other-encoding"])
async def test_a_missing_or_damaged_index_is_rebuilt_and_the_listing_stays_true(tmp_path: Path, damage: str) -> None:
    backend = await build(tmp_path, 8)
    index = tmp_path / INDEX_NAME
    data = index.read_bytes()
    # Change the truth behind the index's back, where only a scan sees it: the oldest session becomes the newest.
    foreign_append(Path(backend.locate(meta("s00", CWDS[0])).path))
    if damage == "missing":
        index.unlink()
    elif damage == "garbage":
        index.write_bytes(b"\x00garbage\n" + data[200:])
    elif damage == "cut":
        index.write_bytes(data[: len(data) // 2 + 3])
    elif damage == "empty":
        index.write_bytes(b"")
    elif damage == "other-boot":
        index.write_bytes(data.replace(activity.boot_id().encode(), b"a-previous-boot", 1))  # type: ignore[union-attr]
    else:
        index.write_bytes(data.replace(b'"compression":"zstd"', b'"compression":"none"', 1))
    assert through_index(tmp_path, 3) is None
    assert await listed(backend, 3) == truth(tmp_path, 3)
    assert truth(tmp_path, 1) == ["s00"]
    assert through_index(tmp_path, 3) == truth(tmp_path, 3)  # rebuilt


async def test_a_row_whose_file_changed_is_put_in_its_real_place(tmp_path: Path) -> None:
    backend = await build(tmp_path, 8)
    # A foreign change the index did not hear of: the newest session's log is replaced in place by an older one
    # (its row is stat'ed, its activity read again).
    path = Path(backend.locate(meta("s07", CWDS[1])).path)
    scratch = JsonlBackend(tmp_path.parent / (tmp_path.name + "-scratch"))
    header = meta("s07", CWDS[1], created_at=1007)
    await scratch.append_batch(StorageMetadata(header), turn_at(0, when=1_000_000), False)
    shutil.copyfile(scratch.locate(header).path, path)  # in place: the same inode, other bytes
    assert through_index(tmp_path, 3) == truth(tmp_path, 3) == ["s06", "s05", "s04"]
    assert await listed(backend, 8) == truth(tmp_path, 8)


async def test_a_touched_transcript_keeps_its_place(tmp_path: Path) -> None:
    backend = await build(tmp_path, 8)
    # touch(1) into the past and into the future: the files' mtimes change, the logs' activity does not.
    age(Path(backend.locate(meta("s07", CWDS[1])).path), 50_000)
    age(Path(backend.locate(meta("s00", CWDS[0])).path), -50_000)
    assert through_index(tmp_path, 3) == truth(tmp_path, 3) == ["s07", "s06", "s05"]
    assert await listed(backend, 8) == truth(tmp_path, 8)
    assert truth(tmp_path, 8)[-1] == "s00"


async def test_a_row_that_belongs_before_rows_already_chosen_sends_the_listing_to_a_scan(tmp_path: Path) -> None:
    backend = await build(tmp_path, 8)
    # Made the newest in place behind the index's back: found only when the listing reaches its row.
    foreign_append(Path(backend.locate(meta("s02", CWDS[0])).path))
    assert through_index(tmp_path, 8) is None
    assert await listed(backend, 8) == truth(tmp_path, 8)
    assert truth(tmp_path, 1) == ["s02"]


async def test_a_session_copied_in_by_another_program_is_listed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    backend = await build(root, 6)
    elsewhere = JsonlBackend(tmp_path / "elsewhere")
    await elsewhere.append_batch(StorageMetadata(meta("copied", CWDS[0])), turn_at(), False)
    source = Path(elsewhere.locate(meta("copied", CWDS[0])).path).parent
    target = Path(backend.locate(meta("copied", CWDS[0])).path).parent
    shutil.copytree(source, target)  # no journal record: only the project directory's mtime tells
    assert through_index(root, 2) == truth(root, 2) == ["copied", "s05"]
    shutil.rmtree(target)
    assert await listed(backend, 2) == truth(root, 2) == ["s05", "s04"]


async def test_a_writer_killed_before_it_retires_its_session_leaves_it_looked_at(tmp_path: Path) -> None:
    backend = await build(tmp_path, 6)
    script = textwrap.dedent(
        f"""
        import os, signal, sys, anyio, msgspec
        from dsh.session_persistence.backend import StorageMetadata
        from dsh.session_persistence.testing import meta, one_turn_log
        from dsh.session_persistence_jsonl import JsonlBackend

        async def main():
            backend = JsonlBackend({str(tmp_path)!r})
            await backend.acquire_writer_lease(meta("killed", {CWDS[0]!r}))
            first = [msgspec.structs.replace(e, time=1) for e in one_turn_log()[:3]]  # an ancient first batch
            await backend.append_batch(StorageMetadata(meta("killed", {CWDS[0]!r})), first, False)
            print("ready", flush=True)
            sys.stdin.readline()
            events = [msgspec.structs.replace(e, time={next(CLOCK) + 10**9}) for e in one_turn_log()[3:]]
            await backend.append_batch(StorageMetadata(meta("killed", {CWDS[0]!r})), events, True)
            print("committed", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # before the lease's release could retire it

        anyio.run(main)
        """
    )
    with spawn(script) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        # A listing while it lives: the session is at the bottom, and the index is rewritten knowing the writer.
        assert await listed(backend, 10) == truth(tmp_path, 10)
        assert truth(tmp_path, 10)[-1] == "killed"
        assert through_index(tmp_path, 10) == truth(tmp_path, 10)  # its lock is known: it announced it
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "committed"
        assert proc.wait(timeout=30) == -signal.SIGKILL
    assert truth(tmp_path, 1) == ["killed"]
    assert through_index(tmp_path, 2) == truth(tmp_path, 2)
    assert await listed(backend, 2) == truth(tmp_path, 2)


async def test_a_live_writer_that_keeps_no_journal_sends_the_listing_to_a_scan(tmp_path: Path) -> None:
    if activity_writers.held_locks(os.stat(tmp_path).st_dev) is None:
        pytest.skip("the kernel's lock table is not readable here")
    backend = await build(tmp_path, 6)
    transcript = Path(backend.locate(meta("s00", CWDS[0])).path)
    # A 0.2 writer: takes the session's lock (no journal record) and appends in place.
    script = textwrap.dedent(
        f"""
        import fcntl, os, sys, time
        fd = os.open({str(transcript.parent / "session.lock")!r}, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with open({str(transcript)!r}, "ab") as fh:
            fh.write({JsonlBackend(tmp_path)._core._encode_batch(turn_at(6), None)!r})
        print("ready", flush=True)
        sys.stdin.readline()
        """
    )
    with spawn(script) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        assert through_index(tmp_path, 2) is None
        assert await listed(backend, 2) == truth(tmp_path, 2) == ["s00", "s05"]
        # Its session is looked at while it lives: another in-place change is seen without a scan.
        foreign_append(transcript)
        assert through_index(tmp_path, 2) == truth(tmp_path, 2) == ["s00", "s05"]
        proc.stdin.close()
        proc.wait(timeout=30)
    assert await listed(backend, 3) == truth(tmp_path, 3)


async def test_a_journal_that_is_not_ours_sends_the_listing_to_a_scan(tmp_path: Path) -> None:
    backend = await build(tmp_path, 6)
    append_bytes(tmp_path / JOURNAL_NAME, b"not a record\n")
    foreign_append(Path(backend.locate(meta("s01", CWDS[1])).path))
    assert through_index(tmp_path, 2) is None
    assert await listed(backend, 2) == truth(tmp_path, 2) == ["s01", "s05"]


async def test_the_index_is_never_synced_nor_locked_on_the_write_path(tmp_path: Path) -> None:
    # A journal that cannot be written (a directory in its place) must not fail a durable write; the index is
    # dropped instead, so no listing trusts it.
    backend = await build(tmp_path, 4)
    os.unlink(tmp_path / JOURNAL_NAME)
    os.mkdir(tmp_path / JOURNAL_NAME)
    fresh = JsonlBackend(tmp_path)
    await fresh.append_batch(StorageMetadata(meta("new", CWDS[0])), turn_at(), False)
    assert not (tmp_path / INDEX_NAME).exists()
    assert await listed(backend, 2) == truth(tmp_path, 2) == ["new", "s03"]


# -- a property: whatever happens between listings, the page is the truth ------------------------------------
# (Every change but the one the index documents it cannot see: a transcript changed in place, to a newer time,
# by a program that keeps no journal and holds no lock; "touch" changes a file's mtime both ways, which must move
# nothing.)

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["write", "new", "touch", "copy-in", "remove", "drop-index", "damage-index"]),
        st.integers(0, 7),
    ),
    min_size=1,
    max_size=12,
)


def _stamp_directories(root: Path, tick: int) -> None:
    """Every directory to a distinct old time that moves forward, as real changes move it (never "racy")."""
    when = OLD + tick
    for project in root.iterdir():
        if project.is_dir():
            os.utime(project, (when, when))
    os.utime(root, (when, when))


async def _play(root: Path, ops: list[tuple[str, int]], limits: list[int]) -> None:
    backend = await build(root, 8)
    known = [f"s{n:02d}" for n in range(8)]
    made = 0
    for tick, ((op, pick), limit) in enumerate(zip(ops, limits, strict=True), start=1):
        target = known[pick % len(known)] if known else None
        cwd = CWDS[int(target[1:]) % 2] if target and target.startswith("s") else CWDS[0]
        path = Path(backend.locate(meta(target, cwd)).path) if target else None
        if op == "write" and target and target.startswith("s") and path and path.exists():
            head = await backend.load_stored(target)
            seq = len(head.events) if head is not None else 0
            await backend.append_batch(StorageMetadata(meta(target, cwd)), turn_at(seq), True)
        elif op == "new":
            made += 1
            await backend.append_batch(StorageMetadata(meta(f"n{made:02d}", CWDS[made % 2])), turn_at(), False)
        elif op == "touch" and path and path.exists():
            age(path, (10_000 + tick) * (1 if pick % 2 else -1))
        elif op == "copy-in":
            made += 1
            other = JsonlBackend(root.parent / f"elsewhere-{tick}")
            header = meta(f"c{made:02d}", CWDS[made % 2])
            await other.append_batch(StorageMetadata(header), turn_at(), False)
            shutil.copytree(Path(other.locate(header).path).parent, Path(backend.locate(header).path).parent)
        elif op == "remove" and path and path.exists():
            shutil.rmtree(path.parent)
            known.remove(target)  # type: ignore[arg-type]
        elif op == "drop-index":
            (root / INDEX_NAME).unlink(missing_ok=True)
        elif op == "damage-index" and (root / INDEX_NAME).exists():
            data = (root / INDEX_NAME).read_bytes()
            (root / INDEX_NAME).write_bytes(data[: pick * len(data) // 8])
        _stamp_directories(root, tick)
        assert await listed(backend, limit) == truth(root, limit), (op, pick, limit)


@settings(max_examples=15 if os.environ.get("DSH_LONG") != "1" else 200, deadline=None)
@given(ops=_OPS, data=st.data())
def test_property_every_page_is_the_truth(tmp_path_factory: pytest.TempPathFactory, ops: Any, data: Any) -> None:
    root = tmp_path_factory.mktemp("prop") / "root"
    limits = [data.draw(st.integers(1, 10)) for _ in ops]
    anyio.run(_play, root, ops, limits)
