"""Log format versions on disk: v0 (0.1) logs load and are upgraded to v1 atomically by their first write;
a declared log must carry a v1 header and a v0 layout a v0 one; a newer version is refused, and still listed."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
from dsh.session_persistence import Host, PersistenceCoordinator
from dsh.session_persistence.backend import (
    SessionFormatUnsupportedError,
    SessionPersistenceCorruptionError,
    SessionStorageError,
    StorageMetadata,
)
from dsh.session_persistence.testing import one_turn_log, step_start, turn_start
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl._files.fs import replace_durable, revision_of
from dsh.session_persistence_jsonl._format.records import encode_header_line

from ._formats import declared, pairs, plaintext, rewrite_plaintexts, v0_bytes, write_v0
from ._sessions import Builder, storage, turn_batches

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _v0(st: StorageMetadata) -> StorageMetadata:
    return StorageMetadata(msgspec.structs.replace(st.meta, version=0), st.inherited_event_count)


async def test_v0_log_loads_untouched_and_its_first_append_upgrades_it(tmp_path: Path, compression: str) -> None:
    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    st = storage()
    batches = turn_batches(3)
    path = write_v0(tmp_path / "root", st, batches[:2], compression)
    original = path.read_bytes()
    loaded = await backend.load_stored("s1")
    assert loaded is not None
    assert loaded.meta.version == 0
    assert loaded.events == [e for b in batches[:2] for e in b]
    assert loaded.torn_marker is None
    assert [h.version for h in await backend.list()] == [0]
    assert (await backend.load_stored_from("s1", 5)).events == loaded.events[5:]  # type: ignore[union-attr]
    assert path.read_bytes() == original  # reading never writes
    await backend.append_batch(StorageMetadata(loaded.meta, 0), batches[2], True)
    upgraded = path.read_bytes()
    assert pairs(upgraded, compression)[-1].end == len(upgraded)  # a whole v1 file now
    after = await backend.load_stored("s1")
    assert after is not None
    assert after.meta == msgspec.structs.replace(loaded.meta, version=1)
    assert after.events == [e for b in batches for e in b]
    assert os.listdir(path.parent) == [path.name]  # the staging file is gone
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    # Later appends (the coordinator still holds the v0 header) go straight to the v1 file.
    nxt = Builder(start_seq=len(after.events), seed=9)
    nxt.turn(3, steps=1, tokens=2)
    await backend.append_batch(StorageMetadata(loaded.meta, 0), nxt.events, True)
    assert path.read_bytes().startswith(upgraded)
    assert (await backend.load_stored("s1")).events == after.events + nxt.events  # type: ignore[union-attr]


async def test_coordinator_load_of_an_interrupted_v0_log_upgrades_it(tmp_path: Path, compression: str) -> None:
    st = storage("crashed")
    events = [*one_turn_log(), turn_start(6, 2), step_start(7, 2, 1)]
    path = write_v0(tmp_path / "root", st, [events], compression)
    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    async with PersistenceCoordinator(Host(), backend) as persistence:
        view = await persistence.load("crashed")
    assert view.meta.version == 1
    assert list(view.events[: len(events)]) == events
    assert view.events[-1].type == "turn/end"
    reread = await JsonlBackend(tmp_path / "root", compression=compression).load_stored("crashed")  # type: ignore[arg-type]
    assert reread is not None
    assert reread.events == list(view.events)
    assert plaintext(path.read_bytes(), compression).startswith(encode_header_line(StorageMetadata(view.meta, 0)))


async def test_an_upgrade_refuses_a_v0_log_that_changed_or_is_torn(tmp_path: Path, compression: str) -> None:
    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    st = storage()
    batches = turn_batches(2)
    path = write_v0(tmp_path / "root", st, batches[:1], compression)
    with path.open("ab") as fh:
        fh.write(b"\x28\xb5" if compression == "zstd" else b'{"type":')
    before = path.read_bytes()
    with pytest.raises(SessionStorageError, match="torn tail"):
        await backend.append_batch(_v0(st), batches[1], True)
    assert path.read_bytes() == before
    # The replacement itself compares the file's revision with the one the upgrade read.
    rev = revision_of(path.stat())
    with path.open("ab") as fh:
        fh.write(b"x")
    with pytest.raises(SessionStorageError, match="changed since it was read"):
        replace_durable(str(path), b"new", expected_revision=rev)
    assert path.read_bytes() == before + b"x"
    assert os.listdir(path.parent) == [path.name]


async def test_each_layout_must_carry_its_own_version(tmp_path: Path, compression: str) -> None:
    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    st = storage()
    events = turn_batches(1)[0]
    # A v1 header without declarations (what no writer produces).
    path = write_v0(tmp_path / "root", st, [events], compression)
    v1_header = encode_header_line(st)
    data = v0_bytes(st, [events], compression)
    v0_header = encode_header_line(_v0(st))
    if compression == "none":
        path.write_bytes(data.replace(v0_header, v1_header))
    else:
        from dsh.session_persistence_jsonl._format.frames import compress_frame, scan_frames

        first = scan_frames(data, max_frames=1).frames[0][1]
        path.write_bytes(compress_frame(v1_header) + data[first:])
    with pytest.raises(SessionPersistenceCorruptionError, match="v1 header in a log without batch declarations"):
        await backend.load_stored("s1")
    # A v0 header inside declarations.
    path.write_bytes(declared(compression, 0, 0, v0_header))
    with pytest.raises(SessionPersistenceCorruptionError, match="carries a v0 header"):
        await backend.load_stored("s1")


async def test_a_newer_version_is_refused_on_read_and_listed(tmp_path: Path, compression: str) -> None:
    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    st = storage()
    await backend.append_batch(st, turn_batches(1)[0], False)
    path = Path(backend.locate(st.meta).path)
    rewrite_plaintexts(path, compression, lambda i, t: t.replace(b'"version":1', b'"version":2') if i == 0 else t)
    with pytest.raises(SessionFormatUnsupportedError, match=r"uses log format v2.*upgrade the harness"):
        await backend.load_stored("s1")
    with pytest.raises(SessionFormatUnsupportedError):
        await backend.read_raw("s1")
    assert [h.version for h in await backend.list()] == [2]
    assert await backend.list_damaged() == []


GOLDEN = Path(__file__).resolve().parent / "golden" / "v0.1.0"


@pytest.mark.parametrize("restore", ["rename", "in-place"])
async def test_a_v0_backup_restored_under_a_running_backend_is_upgraded_again(
    tmp_path: Path, compression: str, restore: str
) -> None:
    """The backend remembers which files it wrote as v1; a v0 log restored over one (a 0.1 backup) must be
    upgraded by the next write, as a fresh backend would, never given a v1 batch appended to its v0 bytes."""
    suffix = ".jsonl.zstd" if compression == "zstd" else ".jsonl"
    root = tmp_path / "root"
    path = root / "--golden-project--" / "completed" / f"session{suffix}"
    path.parent.mkdir(parents=True, mode=0o700)
    backup = (GOLDEN / compression / "--golden-project--" / "completed" / f"session{suffix}").read_bytes()
    path.write_bytes(backup)
    os.chmod(path, 0o600)
    backend = JsonlBackend(root, compression=compression)  # type: ignore[arg-type]
    old = await backend.load_stored("completed")
    assert old is not None and old.meta.version == 0 and old.torn_marker is None
    st = StorageMetadata(old.meta, old.inherited_event_count)
    lease = await backend.acquire_writer_lease(old.meta)  # appends go through the kept descriptor
    try:
        first = Builder(start_seq=len(old.events), seed=3)
        first.turn(2, steps=1, tokens=3)
        await backend.append_batch(st, first.events, True)  # upgrades: the backend now knows the file as v1
        assert pairs(path.read_bytes(), compression)[-1].end == path.stat().st_size
        # The operator restores the 0.1 backup while the backend keeps running.
        if restore == "rename":
            staged = path.with_name("restored.tmp")
            staged.write_bytes(backup)
            os.replace(staged, path)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # same inode, like `cp backup session.jsonl.zstd`
            try:
                os.write(fd, backup)
            finally:
                os.close(fd)
        again = Builder(start_seq=len(old.events), seed=4)
        again.turn(3, steps=2, tokens=2)
        await backend.append_batch(st, again.events, True)
        nxt = Builder(start_seq=len(old.events) + len(again.events), seed=5)
        nxt.turn(1, steps=1, tokens=1)
        await backend.append_batch(st, nxt.events, True)  # plain v1 append again
    finally:
        await lease.release()
    data = path.read_bytes()
    assert pairs(data, compression)[-1].end == len(data)  # one whole v1 file, no v0 bytes left in it
    fresh = JsonlBackend(root, compression=compression)  # type: ignore[arg-type]
    reloaded = await fresh.load_stored("completed")
    assert reloaded is not None and reloaded.torn_marker is None
    assert reloaded.meta.version == 1
    assert reloaded.events == old.events + again.events + nxt.events
    assert (await fresh.load_stored_from("completed", len(old.events))).events == again.events + nxt.events  # type: ignore[union-attr]
