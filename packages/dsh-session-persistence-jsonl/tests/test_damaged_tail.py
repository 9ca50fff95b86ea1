"""The operator's explicit step for a damaged final batch: found only when the damage is confined to it,
described before anything is cut, cut only under the writer lease and only if the file is unchanged."""
# ruff: noqa: ASYNC240

from __future__ import annotations

from pathlib import Path

import pytest
from dsh.session_persistence.backend import (
    SessionLockedError,
    SessionPersistenceCorruptionError,
    SessionStorageError,
)
from dsh.session_persistence_jsonl import JsonlBackend

from ._formats import declared, pairs, write_v0
from ._sessions import storage, turn_batches

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _written(tmp_path: Path, compression: str) -> tuple[JsonlBackend, Path, bytes]:
    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    st = storage()
    for i, batch in enumerate(turn_batches(3)):
        await backend.append_batch(st, batch, i > 0)
    path = Path(backend.locate(st.meta).path)
    return backend, path, path.read_bytes()


async def test_a_damaged_final_batch_is_found_described_and_cut(tmp_path: Path, compression: str) -> None:
    backend, path, full = await _written(tmp_path, compression)
    assert await backend.find_damaged_tail("s1") is None
    last = pairs(full, compression)[-1]
    for offset, known in ((last.end - 2, True), (last.start + 3, False)):  # its data, then its declaration
        damaged = bytearray(full)
        damaged[offset] ^= 0x04
        path.write_bytes(bytes(damaged))
        tail = await backend.find_damaged_tail("s1")
        assert tail is not None
        assert (tail.start, tail.size, tail.kept_events) == (last.start, len(full), last.first_seq)
        assert (tail.first_seq, tail.count) == ((last.first_seq, last.count) if known else (None, None))
        assert str(tail.lost_bytes) in tail.describe()
        with pytest.raises(SessionPersistenceCorruptionError):
            await backend.load_stored("s1")  # load never cuts it
        await backend.discard_damaged_tail("s1", tail)
        assert path.read_bytes() == full[: last.start]
        loaded = await backend.load_stored("s1")
        assert loaded is not None and loaded.torn_marker is None and len(loaded.events) == last.first_seq


async def test_damage_before_the_final_batch_is_never_discardable(tmp_path: Path, compression: str) -> None:
    backend, path, full = await _written(tmp_path, compression)
    for pair in pairs(full, compression)[:-1]:  # the header and every batch with a valid batch after it
        damaged = bytearray(full)
        damaged[(pair.data_start + pair.end) // 2] ^= 0x04
        path.write_bytes(bytes(damaged))
        with pytest.raises(SessionPersistenceCorruptionError):
            await backend.find_damaged_tail("s1")
    assert path.read_bytes() != full  # (the last damaged copy is still there: nothing was cut)


async def test_discard_needs_the_lease_and_an_unchanged_file(tmp_path: Path, compression: str) -> None:
    backend, path, full = await _written(tmp_path, compression)
    last = pairs(full, compression)[-1]
    damaged = bytearray(full)
    damaged[last.end - 2] ^= 0x04
    path.write_bytes(bytes(damaged))
    tail = await backend.find_damaged_tail("s1")
    assert tail is not None
    loaded_meta = storage().meta
    lease = await backend.acquire_writer_lease(loaded_meta)
    try:
        with pytest.raises(SessionLockedError):
            await backend.discard_damaged_tail("s1", tail)
    finally:
        await lease.release()
    with path.open("ab") as fh:
        fh.write(b"\0" * 10)
    with pytest.raises(SessionStorageError, match="changed since it was examined"):
        await backend.discard_damaged_tail("s1", tail)
    assert path.read_bytes() == bytes(damaged) + b"\0" * 10


async def test_a_v0_log_is_never_discardable(tmp_path: Path, compression: str) -> None:
    write_v0(tmp_path / "root", storage(), turn_batches(2), compression)
    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    with pytest.raises(SessionPersistenceCorruptionError, match="v0 log"):
        await backend.find_damaged_tail("s1")


async def test_a_declaration_that_breaks_the_seq_order_is_damage_even_when_torn(
    tmp_path: Path, compression: str
) -> None:
    """Our writer's torn batch always continues the seqs: a valid declaration that does not is not a tear."""
    backend, path, full = await _written(tmp_path, compression)
    last = pairs(full, compression)[-1]
    nxt = last.first_seq + last.count
    for first_seq in (nxt + 5, nxt - 1):
        pair = declared(
            compression, first_seq, 1, b'{"type":"turn/start","seq":%d,"time":1,"data":{"turn":9}}\n' % first_seq
        )
        path.write_bytes(full + pair[: len(pair) - 3])  # the data is cut short
        with pytest.raises(SessionPersistenceCorruptionError, match="expected a batch from seq"):
            await backend.load_stored("s1")
        path.write_bytes(full + pair)  # complete, CRC-valid, but a gap (or an overlap) in the seqs
        with pytest.raises(SessionPersistenceCorruptionError, match="expected a batch from seq"):
            await backend.load_stored("s1")
