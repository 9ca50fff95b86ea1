"""The append descriptor kept while the writer lease is held: reused, closed with the lease, and never used on
a file that is no longer the one at the path (replaced, cut or deleted behind it), with every rollback rule kept.

The tests inspect and change transcripts with blocking file calls on purpose (the fixture, not the code under
test), hence the file-wide ASYNC230/ASYNC240 exemption.
"""

# ruff: noqa: ASYNC240

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from dsh.session_persistence.backend import SessionStorageError, SessionWriteInDoubtError
from dsh.session_persistence_jsonl import JsonlBackend

from ._sessions import storage, turn_batches

pytestmark = pytest.mark.anyio

ST = storage()


@pytest.fixture(params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def leased(tmp_path: Path, compression: str) -> AsyncIterator[tuple[JsonlBackend, Path]]:
    """A backend holding the writer lease of a session that has one committed batch."""
    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    await backend.append_batch(ST, turn_batches(1)[0], False)
    lease = await backend.acquire_writer_lease(ST.meta)
    try:
        yield backend, Path(backend.locate(ST.meta).path)
    finally:
        await lease.release()
        await backend.aclose()


def descriptors_on(path: Path) -> int:
    """How many of this process's descriptors are open on ``path``'s current inode."""
    ident = (path.stat().st_dev, path.stat().st_ino)
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(f"/proc/self/fd/{name}")
        except OSError:
            continue
        count += (st.st_dev, st.st_ino) == ident
    return count


async def stored(backend: JsonlBackend) -> list[object]:
    loaded = await backend.load_stored(ST.meta.id)
    assert loaded is not None
    return list(loaded.events)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to count descriptors")
async def test_one_descriptor_while_leased_none_after_release(tmp_path: Path, compression: str) -> None:
    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    batches = turn_batches(4)
    await backend.append_batch(ST, batches[0], False)
    path = Path(backend.locate(ST.meta).path)
    await backend.append_batch(ST, batches[1], True)
    assert descriptors_on(path) == 0  # without the lease nothing outlives the primitive
    lease = await backend.acquire_writer_lease(ST.meta)
    await backend.append_batch(ST, batches[2], True)
    await backend.append_batch(ST, batches[3], True)
    assert descriptors_on(path) == 1  # one kept descriptor, reused
    await lease.release()
    assert descriptors_on(path) == 0
    assert await stored(backend) == [e for b in batches for e in b]
    await backend.aclose()


async def test_a_replaced_transcript_gets_the_append(leased: tuple[JsonlBackend, Path]) -> None:
    backend, _path = leased
    batches = turn_batches(3)
    await backend.append_batch(ST, batches[1], True)  # the descriptor is open on the current file now
    await backend.rewrite(ST, batches[0])  # a new inode at the path
    await backend.append_batch(ST, batches[1], True)
    await backend.append_batch(ST, batches[2], True)
    assert await stored(backend) == [e for b in batches for e in b]


async def test_a_transcript_replaced_from_outside_gets_the_append(leased: tuple[JsonlBackend, Path]) -> None:
    backend, path = leased
    batches = turn_batches(3)
    await backend.append_batch(ST, batches[1], True)
    copy = path.with_name("copy")
    copy.write_bytes(path.read_bytes())
    os.replace(copy, path)  # same bytes, another inode: the kept descriptor is on the unlinked one
    await backend.append_batch(ST, batches[2], True)
    assert await stored(backend) == [e for b in batches for e in b]


async def test_a_deleted_transcript_fails_instead_of_writing_into_the_void(leased: tuple[JsonlBackend, Path]) -> None:
    backend, path = leased
    batches = turn_batches(3)
    await backend.append_batch(ST, batches[1], True)
    os.unlink(path)
    with pytest.raises(SessionStorageError) as info:
        await backend.append_batch(ST, batches[2], True)
    assert info.value.errno == errno.ENOENT
    assert not os.path.lexists(path)


async def test_failed_append_on_the_kept_descriptor_is_rolled_back(
    leased: tuple[JsonlBackend, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, path = leased
    batches = turn_batches(4)
    await backend.append_batch(ST, batches[1], True)
    before = path.read_bytes()
    real_fsync = os.fsync
    calls = {"n": 0}

    def failing_once(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.EIO, "injected fsync failure")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_once)
    with pytest.raises(SessionStorageError, match="injected fsync failure") as info:
        await backend.append_batch(ST, batches[2], True)
    assert not isinstance(info.value, SessionWriteInDoubtError)
    assert info.value.errno == errno.EIO
    assert info.value.path == str(path)
    assert path.read_bytes() == before
    await backend.append_batch(ST, batches[2], True)  # the retry lands once
    monkeypatch.undo()
    await backend.append_batch(ST, batches[3], True)
    assert await stored(backend) == [e for b in batches for e in b]


async def test_failed_append_and_rollback_on_the_kept_descriptor_is_in_doubt(
    leased: tuple[JsonlBackend, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, path = leased
    batches = turn_batches(3)
    await backend.append_batch(ST, batches[1], True)

    def always(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "fsync", always)
    with pytest.raises(SessionWriteInDoubtError, match="rolling it back failed") as info:
        await backend.append_batch(ST, batches[2], True)
    assert info.value.errno == errno.EIO
    assert info.value.path == str(path)
