"""Backend primitives against real files, both encodings (spec/jsonl.md §1, §3, §5 #27-#63, #68-#88).

The tests damage and inspect transcripts directly with blocking file calls on purpose (that is the fixture,
not the code under test), hence the file-wide ASYNC230/ASYNC240 exemption.
"""
# ruff: noqa: ASYNC230, ASYNC240

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import zstandard
from dsh.session_persistence.backend import (
    SessionAlreadyExistsError,
    SessionBackend,
    SessionFormatUnsupportedError,
    SessionPersistenceCorruptionError,
    SessionStorageError,
    SessionWriteInDoubtError,
    StorageMetadata,
    encode_storage_lines,
)
from dsh.session_persistence.repair import interrupted_turn_closers
from dsh.session_persistence_jsonl import JsonlBackend, SessionLogExistsError, TornTail
from dsh.session_persistence_jsonl._files.fs import fsync_dir
from dsh.session_persistence_jsonl._format.frames import MAGIC, compress_frame

from ._formats import declared, pairs, rewrite_plaintexts, write_v0
from ._formats import plaintext as v1_plaintext
from ._sessions import Builder, session_events, storage, turn_batches

pytestmark = pytest.mark.anyio

Factory = Callable[..., JsonlBackend]


@pytest.fixture(params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make(tmp_path: Path, compression: str) -> Factory:
    def factory(root: Path | None = None, **kw: Any) -> JsonlBackend:
        return JsonlBackend(root or tmp_path / "root", compression=kw.pop("compression", compression), **kw)

    return factory


async def write(backend: JsonlBackend, st: StorageMetadata, batches: list[list[Any]]) -> None:
    for i, batch in enumerate(batches):
        await backend.append_batch(st, batch, i > 0)


def plaintext(backend: JsonlBackend, path: str) -> bytes:
    return v1_plaintext(Path(path).read_bytes(), backend.compression)


def torn_fragment(backend: JsonlBackend, path: Path) -> bytes:
    """Half of the next declared batch: what an append interrupted by a crash leaves on disk."""
    last = pairs(path.read_bytes(), backend.compression)[-1]
    seq = last.first_seq + last.count
    pair = declared(backend.compression, seq, 1, b'{"type":"turn/start","seq":%d,"time":1,"data":{"turn":9}}\n' % seq)
    return pair[:ZSTD_HALF] if backend.compression == "zstd" else pair[:40]


ZSTD_HALF = 40  # inside the data: the declaration (32 bytes) is complete


async def test_protocol_and_plugin() -> None:
    from dsh.session_persistence_jsonl import _plugin

    assert JsonlBackend.NAME == "jsonl"
    assert isinstance(JsonlBackend("/nonexistent/root"), SessionBackend)
    assert _plugin.dsh_session_backends() == [JsonlBackend]


async def test_lifecycle_round_trip_and_permissions(make: Factory, tmp_path: Path) -> None:
    backend = make()
    st = storage("s/1", "/home/me/project", delegation_depth=2, agent_preset="minimal")
    assert await backend.list() == []
    assert await backend.load_stored("s/1") is None
    await backend.append_batch(st, [], False)  # an empty batch never materializes
    assert not (tmp_path / "root").exists()
    batches = turn_batches(3)
    await write(backend, st, batches)
    events = [e for b in batches for e in b]
    path = backend.locate(st.meta).path
    assert path.startswith(str(tmp_path / "root" / "--home-me-project--" / "s~002F1" / "session.jsonl"))
    prefix = await backend.load_stored("s/1")
    assert prefix is not None
    assert prefix.events == events
    assert prefix.meta == st.meta
    assert prefix.torn_marker is None
    assert prefix.revision == await backend.read_stored_revision("s/1")
    assert [h.id for h in await backend.list()] == ["s/1"]
    for p in (tmp_path / "root", Path(path).parent.parent, Path(path).parent):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700
    assert stat.S_IMODE(Path(path).stat().st_mode) == 0o600
    assert os.listdir(Path(path).parent) == [Path(path).name]  # no staging file left
    lines = plaintext(backend, path).splitlines()
    assert lines[0].startswith(b'{"type":"session","version":1,"id":"s/1","createdAt":')
    assert b'"isSeeded":false' in lines[0]
    assert b'"delegationDepth":2' in lines[0]
    suffix = await backend.load_stored_from("s/1", 10)
    assert suffix is not None
    assert suffix.events == events[10:]
    assert (await backend.load_stored_from("s/1", 10_000)).events == []  # type: ignore[union-attr]


async def test_header_round_trip_defaults_and_seeded_cut(make: Factory) -> None:
    backend = make()
    plain = storage("p", None)
    await backend.append_batch(plain, session_events(1)[:3], False)
    loaded = await backend.load_stored("p")
    assert loaded is not None
    assert loaded.meta.delegation_depth == 0  # always on disk (spec §2.1): absent in memory reads back as 0
    seeded = storage("child", "/w", cut=2, is_seeded=True, parent_session="p")
    await backend.append_batch(seeded, session_events(1)[:4], False)
    child = await backend.load_stored("child")
    assert child is not None
    assert child.inherited_event_count == 2
    assert child.meta.is_seeded
    assert child.meta.parent_session == "p"
    assert {s.header.id for s in await backend.list_snapshots()} == {"p", "child"}


async def test_zstd_one_declared_frame_per_batch(tmp_path: Path) -> None:
    """v1: a skippable declaration frame before each batch's frame; the file stays a valid zstd stream."""
    backend = JsonlBackend(tmp_path)
    st = storage()
    batches = turn_batches(2)
    await backend.append_batch(st, batches[0], False)
    path = Path(backend.locate(st.meta).path)
    assert path.name == "session.jsonl.zstd"
    first = path.read_bytes()
    assert first.startswith(b"\x5d\x2a\x4d\x18")  # a skippable frame: the header's declaration
    assert [(p.first_seq, p.count) for p in pairs(first, "zstd")] == [(0, 0), (0, len(batches[0]))]
    await backend.append_batch(st, batches[1], True)
    second = path.read_bytes()
    assert second.startswith(first)
    found = pairs(second, "zstd")
    assert [(p.first_seq, p.count) for p in found] == [(0, 0), (0, len(batches[0])), (len(batches[0]), len(batches[1]))]
    assert found[-1].end == len(second)
    for p in found:
        assert second[p.data_start : p.data_start + 4] == MAGIC  # each data is one ordinary zstd frame
    # Any conforming decoder skips the declarations: `zstd -dc` prints the logical JSONL.
    with zstandard.ZstdDecompressor().stream_reader(second, read_across_frames=True) as reader:
        assert reader.read() == v1_plaintext(second, "zstd")


async def test_raw_file_is_the_logical_content(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path, compression="none", pack_chunks=False)
    st = storage()
    events = session_events(1)
    await backend.append_batch(st, events, False)
    raw = await backend.read_raw("s1")
    assert raw is not None
    assert raw.filename == "session.jsonl"
    path = Path(backend.locate(st.meta).path)
    assert raw.content.encode() == v1_plaintext(path.read_bytes(), "none")
    assert len(raw.content.splitlines()) == len(events) + 1
    # Every line of the file is JSON (jq reads it): the declarations are JSON lines too.
    file_lines = path.read_text().splitlines()
    assert len(file_lines) == len(events) + 3
    assert all(isinstance(json.loads(line), dict) for line in file_lines)
    assert [json.loads(line)["type"] for line in file_lines].count("dsh.batch") == 2


async def test_read_raw(make: Factory) -> None:
    backend = make()
    st = storage()
    await write(backend, st, turn_batches(2))
    raw = await backend.read_raw("s1")
    assert raw is not None
    assert raw.meta == (await backend.load_stored("s1")).meta  # type: ignore[union-attr]
    assert raw.content.encode() == plaintext(backend, backend.locate(st.meta).path)
    assert await backend.read_raw("missing") is None
    path = Path(backend.locate(st.meta).path)
    with path.open("ab") as fh:
        fh.write(torn_fragment(backend, path))
    raw2 = await backend.read_raw("s1")
    assert raw2 is not None
    assert raw2.content == raw.content  # the torn tail is omitted in both modes
    path.write_bytes(b"")
    with pytest.raises(SessionPersistenceCorruptionError, match=r"empty or header-less|invalid header line"):
        await backend.read_raw("s1")


async def test_append_failure_is_rolled_back(make: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = make()
    st = storage()
    batches = turn_batches(3)
    await write(backend, st, batches[:1])
    path = Path(backend.locate(st.meta).path)
    before = path.read_bytes()
    real_fsync = os.fsync
    calls = {"n": 0}

    def failing_once(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(5, "injected fsync failure")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_once)
    with pytest.raises(SessionStorageError, match="injected fsync failure") as info:
        await backend.append_batch(st, batches[1], True)
    assert not isinstance(info.value, SessionWriteInDoubtError)  # rolled back: definitely not stored
    assert info.value.errno == 5
    assert info.value.path == str(path)
    assert isinstance(info.value.__cause__, OSError)
    assert path.read_bytes() == before  # the written bytes were truncated away again
    await backend.append_batch(st, batches[1], True)  # the retry with the same batch succeeds
    monkeypatch.undo()
    await backend.append_batch(st, batches[2], True)
    loaded = await backend.load_stored("s1")
    assert loaded is not None
    assert loaded.events == [e for b in batches for e in b]


async def test_append_and_rollback_failure_is_in_doubt(make: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = make()
    st = storage()
    batches = turn_batches(2)
    await write(backend, st, batches[:1])

    def always(fd: int) -> None:
        raise OSError(5, "injected")

    monkeypatch.setattr(os, "fsync", always)
    with pytest.raises(SessionWriteInDoubtError, match="rolling it back failed") as info:
        await backend.append_batch(st, batches[1], True)
    assert info.value.errno == 5
    assert info.value.path == backend.locate(st.meta).path
    assert isinstance(info.value.__cause__, OSError)
    # The page cache holds the batch, but no sync ever covered it: a read-back must not accept it.
    with pytest.raises(SessionWriteInDoubtError, match="syncing it again failed"):
        await backend.load_stored("s1")
    monkeypatch.undo()
    loaded = await backend.load_stored("s1")  # the batch is written again and synced first
    assert loaded is not None and loaded.events == [e for b in batches for e in b]


async def test_append_never_recreates_a_deleted_log(make: Factory) -> None:
    backend = make()
    st = storage()
    await write(backend, st, turn_batches(1))
    os.unlink(backend.locate(st.meta).path)
    with pytest.raises(SessionStorageError) as info:
        await backend.append_batch(st, session_events(2)[-3:], True)
    assert info.value.errno == errno.ENOENT
    assert isinstance(info.value.__cause__, FileNotFoundError)
    assert not os.path.lexists(backend.locate(st.meta).path)


async def test_materialize_never_overwrites(make: Factory) -> None:
    backend = make()
    st = storage()
    await write(backend, st, turn_batches(1))
    path = Path(backend.locate(st.meta).path)
    before = path.read_bytes()
    with pytest.raises(SessionLogExistsError, match='refusing to materialize "s1"') as info:
        await backend.append_batch(st, session_events(1), False)
    assert isinstance(info.value, FileExistsError)
    assert isinstance(info.value, SessionAlreadyExistsError)
    with pytest.raises(SessionLogExistsError):
        await backend.materialize_header(st)
    assert path.read_bytes() == before


async def test_lost_link_race_reports_exists_and_cleans_staging(make: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pre-check passed but another writer published first: link() fails, nothing is overwritten."""
    backend = make()
    st = storage()
    await write(backend, st, turn_batches(1))
    path = Path(backend.locate(st.meta).path)
    before = path.read_bytes()
    monkeypatch.setattr("dsh.session_persistence_jsonl._backend.is_file", lambda p: False)
    with pytest.raises(SessionLogExistsError, match='refusing to materialize "s1"') as info:
        await backend.append_batch(st, session_events(2), False)
    assert isinstance(info.value.__cause__, FileExistsError)
    assert path.read_bytes() == before
    assert os.listdir(path.parent) == [path.name]


async def test_materialize_header_then_append(make: Factory) -> None:
    backend = make()
    st = storage("h", None)
    await backend.materialize_header(st)
    loaded = await backend.load_stored("h")
    assert loaded is not None
    assert loaded.events == []
    assert loaded.torn_marker is None
    events = session_events(1)
    await backend.append_batch(st, events, True)
    assert (await backend.load_stored("h")).events == events  # type: ignore[union-attr]


async def test_rewrite_replaces_atomically(make: Factory) -> None:
    backend = make()
    st = storage()
    batches = turn_batches(3)
    await write(backend, st, batches)
    keep = batches[0]
    before = await backend.read_stored_revision("s1")
    await backend.rewrite(st, keep)
    loaded = await backend.load_stored("s1")
    assert loaded is not None
    assert loaded.events == keep
    assert loaded.revision != before
    assert stat.S_IMODE(os.stat(backend.locate(st.meta).path).st_mode) == 0o600
    await backend.rewrite(st, [])
    assert (await backend.load_stored("s1")).events == []  # type: ignore[union-attr]
    await backend.append_batch(st, keep, True)
    assert (await backend.load_stored("s1")).events == keep  # type: ignore[union-attr]


def _crash_tail_events() -> tuple[list[Any], list[Any]]:
    b = Builder()
    b.turn(0, steps=1, tokens=3)
    committed = list(b.events)
    b.turn_start(1)
    b.add("step/start", {"turn": 1, "step": 0})
    b.add("assistant/chunk", {"turn": 1, "step": 0, "chunk": {"type": "text-delta", "index": 0, "text": "x" * 300_000}})
    return committed, b.events[len(committed) :]


async def _repair_and_continue(backend: JsonlBackend, st: StorageMetadata, path: Path, loaded: Any) -> None:
    closers = interrupted_turn_closers(loaded.events)
    await backend.commit_repair(st, loaded.torn_marker, closers)
    repaired = await backend.load_stored("s1")
    assert repaired is not None
    assert repaired.torn_marker is None
    assert repaired.events == loaded.events + closers
    assert repaired.events[-1].type == "turn/end"
    assert repaired.meta.version == 1
    nxt = Builder(start_seq=len(repaired.events))
    nxt.turn(2, steps=1, tokens=2)
    await backend.append_batch(st, nxt.events, True)
    final = await backend.load_stored("s1")
    assert final is not None
    assert final.events == repaired.events + nxt.events
    assert [e.seq for e in final.events] == list(range(len(final.events)))
    assert pairs(path.read_bytes(), backend.compression)[-1].end == path.stat().st_size


async def test_crash_tail_repair_and_continue(make: Factory) -> None:
    """v1: a torn last batch is dropped whole (its bytes were never acknowledged), repair closes the turn."""
    backend = make(pack_chunks=False)
    st = storage()
    committed, tail_events = _crash_tail_events()
    await backend.append_batch(st, committed, False)
    path = Path(backend.locate(st.meta).path)
    before = path.read_bytes()
    from dsh.session_persistence.backend import encode_storage_lines

    pair = declared(
        backend.compression, len(committed), len(tail_events), encode_storage_lines(tail_events, pack_chunks=False)
    )
    path.write_bytes(before + pair[: len(pair) - 200])
    loaded = await backend.load_stored("s1")
    assert loaded is not None
    assert isinstance(loaded.torn_marker, TornTail)
    assert loaded.torn_marker.recovered_events == []
    assert loaded.events == committed
    await _repair_and_continue(backend, st, path, loaded)
    assert path.read_bytes().startswith(before)


async def test_v0_crash_tail_repair_upgrades_and_continues(make: Factory, tmp_path: Path) -> None:
    """Spec #36/#72 on a v0 log: the torn frame's complete lines are recovered, and the repair upgrades to v1."""
    backend = make(pack_chunks=False)
    st = storage()
    committed, tail_events = _crash_tail_events()
    path = write_v0(tmp_path / "root", st, [committed], backend.compression)
    before = path.read_bytes()
    tail = encode_storage_lines(tail_events, pack_chunks=False)
    if backend.compression == "zstd":
        frame = compress_frame(tail)
        # cut inside the big chunk line's block data so that turn/start and step/start decode
        cut = before + frame[: len(frame) - 200]
    else:
        cut = before + tail[: tail.index(b'"seq":%d' % tail_events[-1].seq) + 10]
    path.write_bytes(cut)
    loaded = await backend.load_stored("s1")
    assert loaded is not None
    assert loaded.meta.version == 0
    assert isinstance(loaded.torn_marker, TornTail)
    recovered = [e.seq for e in loaded.events[len(committed) :]]
    if backend.compression == "none":
        assert recovered == [tail_events[0].seq, tail_events[1].seq]
    else:
        assert recovered in ([], [tail_events[0].seq], [tail_events[0].seq, tail_events[1].seq])
    await _repair_and_continue(backend, StorageMetadata(loaded.meta, 0), path, loaded)


async def test_commit_repair_refuses_a_changed_file_and_foreign_markers(make: Factory) -> None:
    backend = make()
    st = storage()
    await write(backend, st, turn_batches(1))
    path = Path(backend.locate(st.meta).path)
    with path.open("ab") as fh:
        fh.write(torn_fragment(backend, path))
    loaded = await backend.load_stored("s1")
    assert loaded is not None
    assert loaded.torn_marker is not None
    with path.open("ab") as fh:
        fh.write(b"more")
    with pytest.raises(SessionStorageError, match="size changed"):
        await backend.commit_repair(st, loaded.torn_marker, [])
    with pytest.raises(TypeError):
        await backend.commit_repair(st, 17, [])


async def test_torn_declaration_and_zero_tails_are_removed_byte_identically(make: Factory) -> None:
    """Torn: the file ends inside a declaration or its data, or only zeros follow (size reached the disk)."""
    backend = make()
    st = storage()
    await write(backend, st, turn_batches(2))
    path = Path(backend.locate(st.meta).path)
    before = path.read_bytes()
    last = pairs(before, backend.compression)[-1]
    nxt = declared(backend.compression, last.first_seq + last.count, 1, b'{"type":"turn/start"}\n')
    for tail in (nxt[:3], nxt[:20], nxt[: len(nxt) - 1], b"\0" * 5000):
        path.write_bytes(before + tail)
        loaded = await backend.load_stored("s1")
        assert loaded is not None
        assert loaded.torn_marker is not None, tail
        await backend.commit_repair(st, loaded.torn_marker, [])
        assert path.read_bytes() == before
    # A declaration's start followed by zeros that begin off a sector boundary and run far past the batch it
    # declares: no crash of that one write leaves this, so it is damage, left alone.
    path.write_bytes(before + nxt[:10] + b"\0" * 4000)
    with pytest.raises(SessionPersistenceCorruptionError):
        await backend.load_stored("s1")
    path.write_bytes(before)


async def test_damage_is_refused_anywhere_and_list_survives_a_damaged_header(make: Factory) -> None:
    """A complete batch that fails its CRC is damage even when it is the last one; the file is left alone."""
    backend = make()
    st = storage()
    await write(backend, st, turn_batches(2))
    await backend.append_batch(storage("other"), session_events(1)[:2], False)
    path = Path(backend.locate(st.meta).path)
    data = bytearray(path.read_bytes())
    found = pairs(bytes(data), backend.compression)
    data[found[-1].end - 2] ^= 0x01  # inside the last batch's data
    path.write_bytes(bytes(data))
    assert sorted(h.id for h in await backend.list()) == ["other", "s1"]
    with pytest.raises(SessionPersistenceCorruptionError, match=f"batch at byte {found[-1].start} fails its CRC"):
        await backend.load_stored("s1")
    assert path.read_bytes() == bytes(data)
    data[found[0].end - 2] ^= 0x01  # inside the header's data
    path.write_bytes(bytes(data))
    assert [h.id for h in await backend.list()] == ["other"]  # one damaged header never fails the listing
    damaged = await backend.list_damaged()
    assert [(d.session_id, d.path) for d in damaged] == [("s1", str(path))]
    assert "header data fails its CRC" in damaged[0].message
    assert [s.header.id for s in await backend.list_snapshots()] == ["other"]


async def test_revisions(make: Factory, tmp_path: Path) -> None:
    backend = make()
    st = storage()
    batches = turn_batches(2)
    await write(backend, st, batches[:1])
    snaps = await backend.list_snapshots()
    assert snaps == await backend.list_snapshots()
    assert snaps == await make().list_snapshots()  # a new instance on the same root agrees
    other = make(tmp_path / "other")
    await write(other, st, batches[:1])
    assert (await other.list_snapshots())[0].revision != snaps[0].revision
    await backend.append_batch(st, batches[1], True)
    after = await backend.list_snapshots()
    assert after[0].revision != snaps[0].revision
    assert after[0].revision == (await backend.load_stored("s1")).revision  # type: ignore[union-attr]
    assert await backend.read_stored_revision("nope") is None


async def test_stable_read_retries_on_concurrent_change(make: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = make()
    st = storage()
    await write(backend, st, turn_batches(1))
    await backend.list()  # preflight done, so only the stable read stats the transcript
    path = backend.locate(st.meta).path
    real_lstat = os.lstat
    calls: list[str] = []

    def flaky(p: Any, *a: Any, **kw: Any) -> os.stat_result:
        result = real_lstat(p, *a, **kw)
        if os.fspath(p) == path:
            calls.append(path)
            if len(calls) == 2:  # the first read's closing check sees a changed file
                fields = list(result)
                return os.stat_result(
                    (*fields[:8], result.st_mtime + 1, fields[9]), {"st_mtime_ns": result.st_mtime_ns + 1}
                )
        return result

    monkeypatch.setattr(os, "lstat", flaky)
    loaded = await backend.load_stored("s1")
    assert loaded is not None
    assert len(calls) == 3  # lookup probe + one closing check per read (fstat brackets the read itself)


async def test_list_snapshots_skips_vanished_and_read_revision_none(
    make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = make()
    st = storage()
    await write(backend, st, turn_batches(1))
    await backend.list()
    path = backend.locate(st.meta).path
    real_stat = os.lstat
    state = {"allow": 0, "error": FileNotFoundError}

    def stat_after(p: Any, *a: Any, **kw: Any) -> os.stat_result:
        """Succeed ``allow`` times for the transcript, then fail as if it vanished (or is blocked)."""
        if os.fspath(p) == path:
            if state["allow"] == 0:
                raise state["error"](2, "injected", p)  # type: ignore[operator]
            state["allow"] -= 1  # type: ignore[operator]
        return real_stat(p, *a, **kw)

    monkeypatch.setattr(os, "lstat", stat_after)
    assert await backend.list_snapshots() == []  # discovery opens the file; the snapshot stat finds it gone
    state["allow"] = 1  # lookup's existence probe sees it, the revision stat does not
    assert await backend.read_stored_revision("s1") is None
    state.update(allow=0, error=PermissionError)
    with pytest.raises(SessionStorageError) as info:
        await backend.list_snapshots()
    assert isinstance(info.value.__cause__, PermissionError)


async def test_cancellation_of_reads(make: Factory) -> None:
    backend = make()
    await write(backend, storage(), turn_batches(1))
    for op in (backend.list, backend.list_snapshots, lambda: backend.load_stored("s1")):
        with anyio.CancelScope() as scope:
            scope.cancel()
            await op()
            pytest.fail("not cancelled")  # pragma: no cover
        assert scope.cancelled_caught


async def test_cancelled_append_still_completes(make: Factory) -> None:
    backend = make()
    st = storage()
    batches = turn_batches(2)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await backend.append_batch(st, batches[0], False)
    loaded = await backend.load_stored("s1")
    assert loaded is not None
    assert loaded.events == batches[0]  # the durable step ran shielded to completion


async def test_aclose_ends_the_writer_threads(make: Factory) -> None:
    import threading

    def writers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("dsh-jsonl-writer") and t.is_alive()]

    backend = make()
    before = set(writers())  # other backends' threads (they end on their own after an idle while)
    await write(backend, storage(), turn_batches(2))
    assert set(writers()) - before  # durable steps ran on the backend's own writer
    await backend.aclose()
    assert not set(writers()) - before


# -- discovery and layout -------------------------------------------------------------------------------------


async def test_discovery_projects_and_foreign_entries(make: Factory, tmp_path: Path) -> None:
    backend = make()
    events = session_events(1)[:3]
    for sid, cwd in (("a", "/projA"), ("b", "/projB"), ("c", None), ("d", "/a/b-c"), ("e", "/a-b/c")):
        await backend.append_batch(storage(sid, cwd), events, False)
    root = tmp_path / "root"
    (root / "--projA--" / "a" / "metadata.json").write_text("{}")
    (root / "--projA--" / "README").write_text("hi")
    (root / "--projA--" / "reserved-session").mkdir()
    (root / "stray-file").write_text("x")
    assert sorted(h.id for h in await backend.list()) == ["a", "b", "c", "d", "e"]
    assert (await backend.load_stored("a")).events == events  # type: ignore[union-attr]
    assert len(os.listdir(root / "--a-b-c--")) == 2
    assert await make(tmp_path / "missing").list() == []


async def test_list_skips_incomplete_and_non_header_transcripts(make: Factory, tmp_path: Path) -> None:
    backend = make()
    await backend.append_batch(storage("ok", None), session_events(1)[:2], False)
    suffix = ".jsonl.zstd" if backend.compression == "zstd" else ".jsonl"
    wrap: Callable[[bytes], bytes] = compress_frame if backend.compression == "zstd" else (lambda b: b)
    bodies = [b"", wrap(b'{"type":"turn/start"}\n'), wrap(b"not json at all\n")]
    bodies += [
        declared(backend.compression, 0, 0, b'{"type":"turn/start"}\n'),
        declared(backend.compression, 0, 0, b"x"),
    ]
    if backend.compression == "zstd":
        bodies.append(MAGIC)
    for i, body in enumerate(bodies):
        d = tmp_path / "root" / "_no-cwd" / f"junk{i}"
        d.mkdir()
        (d / f"session{suffix}").write_bytes(body)
    assert [h.id for h in await backend.list()] == ["ok"]
    # Each one is reported on its own, with its directory's id.
    assert sorted(d.session_id or "" for d in await backend.list_damaged()) == [f"junk{i}" for i in range(len(bodies))]


async def test_long_header_lists(make: Factory) -> None:
    backend = make()
    cwd = "/" + "x" * 24_000
    await backend.append_batch(storage("long", cwd, agent_preset="p" * 9000), session_events(1)[:2], False)
    assert [h.cwd for h in await backend.list()] == [cwd]


async def test_identity_checks(make: Factory, tmp_path: Path) -> None:
    backend = make(compression="none")
    st = storage("identity-a", "/w")
    b = Builder()
    b.turn_start(0)
    await backend.append_batch(st, b.events, False)  # an open turn that would need repair
    path = Path(backend.locate(st.meta).path)
    rewrite_plaintexts(path, "none", lambda i, t: t.replace(b'"id":"identity-a"', b'"id":"identity-b"'))
    before = path.read_bytes()
    with pytest.raises(
        SessionPersistenceCorruptionError, match='requested id "identity-a" does not match header id "identity-b"'
    ):
        await backend.load_stored("identity-a")
    assert await backend.list() == []  # a mismatched header is reported on its own, never fails the listing
    assert "and cwd identify" in (await backend.list_damaged())[0].message
    assert path.read_bytes() == before
    rewrite_plaintexts(
        path,
        "none",
        lambda i, t: t.replace(b'"id":"identity-b"', b'"id":"identity-a"').replace(
            b'"cwd":"/w"', b'"cwd":"/elsewhere"'
        ),
    )
    assert "and cwd identify" in (await backend.list_damaged())[0].message
    with pytest.raises(SessionPersistenceCorruptionError, match="and cwd identify"):
        await backend.load_stored("identity-a")


async def test_symlinks_in_the_layout_are_never_followed(make: Factory, tmp_path: Path) -> None:
    """A symlinked project or session directory is not part of the layout: never listed, loaded or written."""
    backend = make()
    st = storage("s", "/stored")
    await backend.append_batch(st, session_events(1)[:2], False)
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    # A project alias whose header names it: refused (appends would go through the link).
    os.symlink(root / "--stored--", root / "--alias--")
    path = Path(backend.locate(st.meta).path)
    rewrite_plaintexts(
        path, backend.compression, lambda i, t: t.replace(b'"cwd":"/stored"', b'"cwd":"/alias"') if i == 0 else t
    )
    with pytest.raises(SessionPersistenceCorruptionError, match="and cwd identify"):
        await backend.load_stored("s")
    assert await backend.list() == []
    # A session directory that is a symlink to a directory outside the root.
    (outside / "evil").mkdir()
    os.symlink(outside / "evil", root / "--stored--" / "evil")
    assert [d.session_id for d in await backend.list_damaged()] == ["s"]  # the link is not even visited
    with pytest.raises(SessionStorageError) as info:
        await backend.load_stored("evil")
    assert info.value.errno == errno.ELOOP
    with pytest.raises(SessionStorageError) as info:
        await backend.append_batch(storage("evil", "/stored"), session_events(1)[:2], False)
    assert info.value.errno == errno.ELOOP
    assert list((outside / "evil").iterdir()) == []  # nothing was written through the link
    # A transcript that is a symlink.
    target = outside / "t.jsonl"
    target.write_bytes(path.read_bytes())
    (root / "--stored--" / "t").mkdir()
    os.symlink(target, root / "--stored--" / "t" / path.name)
    with pytest.raises(SessionStorageError) as info:
        await backend.load_stored("t")
    assert info.value.errno == errno.ELOOP


async def test_empty_header_id_and_duplicates(make: Factory, tmp_path: Path) -> None:
    backend = make()
    events = session_events(1)[:2]
    await backend.append_batch(storage("dup", "/a"), events, False)
    await backend.append_batch(storage("dup2", "/b"), events, False)
    src = tmp_path / "root" / "--b--" / "dup2"
    os.rename(src, tmp_path / "root" / "--b--" / "dup")
    p = next((tmp_path / "root" / "--b--" / "dup").iterdir())
    rewrite_plaintexts(p, backend.compression, lambda i, t: t.replace(b'"id":"dup2"', b'"id":"dup"'))
    with pytest.raises(
        SessionPersistenceCorruptionError,
        match='duplicate JSONL session id "dup" appears in multiple project directories',
    ):
        await backend.load_stored("dup")
    with pytest.raises(SessionPersistenceCorruptionError, match="appears in multiple project directories"):
        await backend.list()


async def test_flat_layout_and_encoding_mismatch(tmp_path: Path) -> None:
    zroot, rroot = tmp_path / "z", tmp_path / "r"
    zb, rb = JsonlBackend(zroot), JsonlBackend(rroot, compression="none")
    events = session_events(1)[:2]
    await zb.append_batch(storage("x"), events, False)
    await rb.append_batch(storage("x"), events, False)
    with pytest.raises(SessionFormatUnsupportedError, match='configured for compression "zstd"'):
        await JsonlBackend(rroot).list()
    with pytest.raises(SessionFormatUnsupportedError, match='configured for compression "none"'):
        await JsonlBackend(zroot, compression="none").list()
    flat = zroot / "--home-me-project--" / "y.jsonl"
    flat.write_text("{}\n")
    fresh = JsonlBackend(zroot)
    with pytest.raises(SessionFormatUnsupportedError, match="unsupported flat-file layout"):
        await fresh.load_stored("x")
    flat.unlink()
    # Port decision (spec #88): a failed preflight is not sticky; fixing the root fixes the instance.
    assert (await fresh.load_stored("x")).events == events  # type: ignore[union-attr]
    # An opposite-encoding artifact appearing after a successful preflight is still caught.
    (zroot / "--home-me-project--" / "x" / "session.jsonl").write_text("{}\n")
    for op in (fresh.list, lambda: fresh.load_stored("x"), lambda: fresh.read_raw("x")):
        with pytest.raises(SessionFormatUnsupportedError, match=r"uses \.jsonl,"):
            await op()
    late = zroot / "_no-cwd" / "late"
    late.mkdir(parents=True)
    (late / "session.jsonl").write_text("{}\n")
    with pytest.raises(SessionFormatUnsupportedError, match=r"uses \.jsonl,"):
        await fresh.append_batch(storage("late", None), events, False)
    assert not (late / "session.jsonl.zstd").exists()


async def test_blocked_paths_surface_os_errors(make: Factory, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "--home-me-project--").write_text("not a dir")
    backend = make()
    with pytest.raises(SessionStorageError) as info:
        await backend.append_batch(storage(), session_events(1)[:2], False)
    assert info.value.errno in (errno.EEXIST, errno.ENOTDIR)
    assert isinstance(info.value.__cause__, OSError)
    (root / "--home-me-project--").unlink()
    (root / "_no-cwd").mkdir()
    (root / "_no-cwd" / "blocked").write_text("file where a session dir belongs")
    with pytest.raises(SessionStorageError) as info:
        await backend.load_stored("blocked")
    assert info.value.errno == errno.ENOTDIR
    os.rename(root, tmp_path / "moved")
    root.write_text("root is a file now")
    with pytest.raises(SessionStorageError) as info:
        await backend.list()
    assert info.value.errno == errno.ENOTDIR
    assert info.value.path == str(root)


async def test_hostile_ids_stay_under_root(make: Factory, tmp_path: Path) -> None:
    backend = make()
    await backend.append_batch(storage("../../etc/pwn", "/.."), session_events(1)[:2], False)
    for dirpath, _dirs, files in os.walk(tmp_path):
        for name in files:
            assert os.path.realpath(os.path.join(dirpath, name)).startswith(str(tmp_path / "root") + os.sep)
    assert (await backend.load_stored("../../etc/pwn")).events == session_events(1)[:2]  # type: ignore[union-attr]


async def test_unknown_event_types_are_kept_opaque(make: Factory) -> None:
    from dsh.session_persistence.backend import decode_event
    from dsh.session_persistence.events import OpaqueEvent

    backend = make()
    events = [
        decode_event({"type": "plugin/thing", "seq": 0, "time": 1, "data": {"x": [1, 2]}}),
        decode_event({"type": "plugin/other", "seq": 1, "time": 2, "data": None, "ignorable": True}),
    ]
    await backend.append_batch(storage(), events, False)
    loaded = await backend.load_stored("s1")
    assert loaded is not None
    assert loaded.events == events
    assert all(type(e) is OpaqueEvent for e in loaded.events)


def test_fsync_dir_works(tmp_path: Path) -> None:
    fsync_dir(str(tmp_path))
