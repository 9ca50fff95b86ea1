"""Exhaustive crash and damage sweeps over a realistic transcript, both encodings, both log formats.

Log format v1 (declared batches, what this build writes):

* every cut offset inside the last batch loads as exactly the committed prefix plus a torn marker (a cut at
  the batch boundary looks like one batch fewer, and is nothing else); repair then leaves the committed bytes
  plus the closers, and a second load changes nothing;
* a tail of zeros where the size reached the disk but the bytes did not (from the last batch's start, or from a
  sector boundary inside its declaration or its data) is a torn tail, never damage;
* every single-byte flip anywhere in the file, header and last batch included, is refused as damage:
  0 silent (no flip is harmless either: every byte is covered by a CRC-32).

Log format v0 (written by 0.1, still loaded): the truncation sweep keeps its old guarantees (complete frames
and lines are never lost) and a flip in a complete, non-final frame is refused.

The v1 sweeps run on a sealed (encrypted) backend too: the seal sits inside the CRC-covered data, so the rules
are the same, and a flip is damage (the CRC), never a decryption error.

Default mode keeps the file small and splits each sweep between the two event loops (asyncio the even offsets,
trio the odd ones); ``DSH_LONG=1`` uses a bigger session, every offset on both and every flip mask.
"""
# ruff: noqa: ASYNC240

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from dsh.session_persistence.backend import (
    SessionFormatUnsupportedError,
    SessionPersistenceError,
    decode_storage_line,
    encode_storage_lines,
)
from dsh.session_persistence.repair import interrupted_turn_closers
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl._files.discovery import check_identity
from dsh.session_persistence_jsonl.encryption import SessionDecryptError, SessionKeyError

from ._formats import pairs, write_v0
from ._sealed import sealed_backend
from ._sessions import storage, turn_batches

LONG = os.environ.get("DSH_LONG") == "1"
SECTOR = 512
pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(3600 if LONG else 300)]

TURNS, TOKENS = (6, 40) if LONG else (3, 12)
MASKS = (0x01, 0x10, 0x80, 0xFF)
#: Every cut is loaded; repair + reload (four durable calls) runs on every REPAIR_STRIDE-th cut and the last one.
REPAIR_STRIDE = 1 if LONG else 7


def _offsets(anyio_backend: object, start: int, stop: int) -> list[int]:
    """The offsets of ``range(start, stop)`` this run sweeps: all of them under ``DSH_LONG=1``; by default
    asyncio takes the even ones and trio the odd ones (the two runs cover every offset between them), and both
    take the first and the last."""
    if LONG:
        return list(range(start, stop))
    name = anyio_backend[0] if isinstance(anyio_backend, tuple) else anyio_backend
    phase = (start + (name == "trio")) % 2
    return sorted({*range(start + phase, stop, 2), start, stop - 1})


@pytest.fixture(params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=[False, True], ids=["plain", "sealed"])
def sealed(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweeps test the torn/damage decision, not durability: skip the (slow) fsyncs."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    # The sweeps call the backend's decode directly (no worker thread): nothing to cancel between batches.
    for module in ("_backend", "_backend_core", "_backend_reads"):
        monkeypatch.setattr(f"dsh.session_persistence_jsonl.{module}._checkpoint", lambda: None)


def _overwrite(path: Path, data: bytes, at: int = 0, size: int | None = None) -> None:
    """Write in place without O_TRUNC (ext4's auto_da_alloc makes truncate-and-rewrite flush to disk)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, at)
        if size is not None:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)


async def _build(
    tmp_path: Path, compression: str, fmt: str = "v1", sealed: bool = False
) -> tuple[JsonlBackend, Any, list[list[Any]], Path, int]:
    """A realistic session, one batch per turn, the last turn's batch open (no turn/end), as a crash leaves it."""
    factory = sealed_backend if sealed else JsonlBackend
    backend = factory(tmp_path / "root", compression=compression)
    st = storage()
    batches = turn_batches(TURNS, tokens=TOKENS)
    batches[-1] = batches[-1][:-1]
    if fmt == "v0":
        path = write_v0(tmp_path / "root", st, batches[:-1], compression)
        last_start = path.stat().st_size
        path = write_v0(tmp_path / "root", st, batches, compression)
        return backend, st, batches, path, last_start
    for i, batch in enumerate(batches[:-1]):
        await backend.append_batch(st, batch, i > 0)
    path = Path(backend.locate(st.meta).path)
    last_start = path.stat().st_size
    await backend.append_batch(st, batches[-1], True)
    return backend, st, batches, path, last_start


def _decode(backend: JsonlBackend, path: Path, data: bytes) -> Any:
    """The backend's whole read decision for these bytes (decode + identity), without the file round trip."""
    log = backend._core._decode(data, str(path))
    check_identity(backend.root, backend.compression, str(path), log.header, "s1")
    return log


async def _repair_round(backend: JsonlBackend, st: Any, path: Path, committed_bytes: bytes, events: list[Any]) -> None:
    loaded = await backend.load_stored("s1")
    assert loaded is not None
    assert loaded.events == events
    closers = interrupted_turn_closers(events)
    await backend.commit_repair(st, loaded.torn_marker, closers)
    repaired = await backend.load_stored("s1")
    assert repaired is not None
    assert repaired.torn_marker is None
    assert repaired.events == events + closers
    after = path.read_bytes()
    assert after.startswith(committed_bytes)
    assert pairs(after, backend.compression)[-1].end == len(after)
    again = await backend.load_stored("s1")
    assert again is not None
    assert again.revision == repaired.revision


async def test_v1_every_cut_of_the_last_batch_is_the_committed_prefix_plus_a_tear(
    tmp_path: Path, compression: str, sealed: bool, anyio_backend: object
) -> None:
    backend, st, batches, path, last_start = await _build(tmp_path, compression, sealed=sealed)
    full = path.read_bytes()
    committed = [e for b in batches[:-1] for e in b]
    for cut in _offsets(anyio_backend, last_start, len(full)):
        log = _decode(backend, path, full[:cut])
        assert log.events == committed, cut
        assert (log.torn is None) == (cut == last_start), cut  # a cut at the boundary is one batch fewer
        if log.torn is not None:
            assert log.torn.truncate_to == last_start
            assert log.torn.recovered_events == []
        if (cut - last_start) % REPAIR_STRIDE == 0 or cut == len(full) - 1:
            _overwrite(path, full[last_start:], last_start, cut)
            await _repair_round(backend, st, path, full[:last_start], committed)
            _overwrite(path, full[last_start:], last_start, len(full))
    assert _decode(backend, path, full).events == committed + batches[-1]


async def test_v1_zero_filled_tails_are_torn_not_damage(
    tmp_path: Path, compression: str, sealed: bool, anyio_backend: object
) -> None:
    """The size reached the disk, the bytes did not: zeros from any offset of the last batch to the end.

    Zeros from the batch start or from a sector boundary inside its declaration, or data turning to zeros from a
    sector boundary, are a torn write; a batch missing only its last byte is restored (the CRC finds the byte) and
    kept, whichever it was. Zeros that start and end inside one sector of the declaration or of the data are
    damage (no crash leaves that: a disk loses whole sectors).
    """
    for attempt in range(8):
        backend, st, batches, path, last_start = await _build(tmp_path / str(attempt), compression, sealed=sealed)
        full = path.read_bytes()
        # The sweep needs the last two bytes non-zero. The format fixes only the last (a frame ends in 0x0A); in a
        # sealed log the byte before it is the AES-GCM tag's last, zero once in 256 sessions: build another then.
        if full[-2] != 0:
            break
    committed = [e for b in batches[:-1] for e in b]
    last = pairs(full, compression)[-1]
    assert last.start == last_start
    assert full[-1] != 0, "a frame ends in a non-zero byte"
    assert full[-2:].count(0) == 0, "eight sessions in a row had a tag ending in zero"
    outcomes = {"torn": 0, "restored": 0, "damage": 0}
    for zero_from in _offsets(anyio_backend, last_start, len(full)):
        state = full[:zero_from] + b"\0" * (len(full) - zero_from)
        zeros = len(state.rstrip(b"\0"))  # where the run of zeros really starts
        boundary = -(-zeros // SECTOR) * SECTOR
        # Inside the declaration a tear starts where the write did, or at a sector boundary inside it: the bytes
        # from the run's start to that boundary must have been zeros already (a disk loses whole sectors; a run
        # starting mid-sector in a JSON declaration is damage; a sealed batch's random CRC length moves the
        # declaration across sector boundaries from run to run, so this case does come up).
        intact_to_boundary = full[zeros:boundary] == bytes(boundary - zeros)
        in_declaration = zeros == last_start or (
            zeros < last.data_start and boundary < last.data_start and intact_to_boundary
        )
        # The declaration survives whole when the zeros cover only its own zero bytes (a zstd declaration's own
        # CRC ends in a zero once in 256 sessions, more often in a sealed log, whose CRCs change every run): then
        # the data's zeros start at its first byte, and that is a torn write if they cross a sector boundary.
        data_zeros = max(zeros, last.data_start)
        declaration_whole = full[zeros:data_zeros] == bytes(data_zeros - zeros)
        in_data = declaration_whole and -(-data_zeros // SECTOR) * SECTOR < len(full)
        if in_declaration or zero_from == len(full) - 1 or in_data:
            log = _decode(backend, path, state)
            assert log.torn is not None and log.torn.truncate_to == last_start, zero_from
            if zero_from == len(full) - 1:
                assert log.events == committed + batches[-1]
                assert log.torn.recovered_events == batches[-1]
                outcomes["restored"] += 1
            else:
                assert log.events == committed, zero_from
                assert log.torn.recovered_events == []
                outcomes["torn"] += 1
        else:
            with pytest.raises(SessionPersistenceError, match=r"fails its (own )?CRC|not a batch declaration"):
                _decode(backend, path, state)
            outcomes["damage"] += 1
    assert outcomes["torn"] > outcomes["damage"] and outcomes["restored"] == 1, outcomes
    # Zeros past a whole batch, of any length (a later append's size without its bytes).
    for extra in (1, 31, 32, 4096, 70_000):
        log = _decode(backend, path, full + b"\0" * extra)
        assert log.events == committed + batches[-1]
        assert log.torn is not None and log.torn.truncate_to == len(full)
    path.write_bytes(full[:last_start] + b"\0" * (len(full) - last_start))
    await _repair_round(backend, st, path, full[:last_start], committed)


def _flip_sweep(
    backend: JsonlBackend, path: Path, full: bytes, offsets: Sequence[int], everything: list[Any]
) -> dict[str, int]:
    stats = {"damage": 0, "refused": 0, "unchanged": 0, "restored": 0, "silent": 0}
    masks = MASKS if LONG else None
    for offset in offsets:
        for mask in masks or (MASKS[offset % len(MASKS)],):
            damaged = bytearray(full)
            damaged[offset] ^= mask
            try:
                log = _decode(backend, path, bytes(damaged))
            except SessionFormatUnsupportedError:
                stats["refused"] += 1
                continue
            except (SessionKeyError, SessionDecryptError):
                stats["silent"] += 1  # the CRC must find every flip before the cipher sees the bytes
                stats.setdefault("first_silent_offset", offset)
                continue
            except SessionPersistenceError:
                stats["damage"] += 1
                continue
            if log.events == everything and log.torn is None:
                stats["unchanged"] += 1
            elif log.events == everything and log.torn is not None and log.torn.recovered_events:
                stats["restored"] += 1  # the last byte zeroed: found again by the CRC and kept (harmless)
            else:
                stats["silent"] += 1
                stats.setdefault("first_silent_offset", offset)
    return stats


async def test_v1_every_flipped_byte_is_refused_as_damage(
    tmp_path: Path, compression: str, sealed: bool, anyio_backend: object
) -> None:
    """Header, every batch, the last one included: a CRC-32 covers every byte, so no flip goes unnoticed."""
    backend, _st, batches, path, _last_start = await _build(tmp_path, compression, sealed=sealed)
    everything = [e for b in batches for e in b]
    full = path.read_bytes()
    offsets = _offsets(anyio_backend, 0, len(full))
    stats = _flip_sweep(backend, path, full, offsets, everything)
    assert stats["silent"] == 0, stats
    assert stats["unchanged"] == 0, stats  # every byte is checked: no flip goes unnoticed
    total = len(offsets) * (len(MASKS) if LONG else 1)
    assert stats["damage"] + stats["refused"] + stats["restored"] == total, stats
    assert path.read_bytes() == full


async def test_v0_truncation_sweep_keeps_complete_frames_and_lines(tmp_path: Path, compression: str) -> None:
    """v0 logs (written by 0.1) keep their read rules: a cut never loses a complete frame or line."""
    backend, _st, batches, path, last_start = await _build(tmp_path, compression, "v0")
    full = path.read_bytes()
    committed = [e for b in batches[:-1] for e in b]
    everything = committed + batches[-1]
    lines: list[tuple[int, int]] = []
    pos = count = 0
    for line in encode_storage_lines(batches[-1], pack_chunks=True).split(b"\n")[:-1]:
        pos += len(line) + 1
        count += len(decode_storage_line(line))
        lines.append((pos, count))
    for cut in range(last_start, len(full)):
        log = _decode(backend, path, full[:cut])
        assert log.events == everything[: len(log.events)], cut
        assert len(log.events) >= len(committed), cut
        if compression == "none":
            complete = [n for end, n in lines if end <= cut - last_start]
            assert len(log.events) == len(committed) + (complete[-1] if complete else 0), cut


async def test_v0_flips_in_complete_frames_are_refused(tmp_path: Path) -> None:
    backend, _st, batches, path, last_start = await _build(tmp_path, "zstd", "v0")
    everything = [e for b in batches for e in b]
    full = path.read_bytes()
    stats = _flip_sweep(backend, path, full, range(last_start), everything)
    assert stats["silent"] == 0, stats


def test_a_compressed_batch_that_would_end_in_zeros_is_stored_raw() -> None:
    """The writer's half of the zero-tail rule: no declared zstd batch ends in a zero byte."""
    import zstandard
    from dsh.session_persistence_jsonl._format.frames import compress_frame
    from dsh.session_persistence_jsonl._format.v1 import encode_declared_batch

    found = 0
    for n in range(4000):
        plaintext = b'{"type":"x","n":%d}\n' % n
        pair = encode_declared_batch("zstd", 0, 1, plaintext)
        assert 0 not in pair[-2:], n
        data = pair[32:]
        with zstandard.ZstdDecompressor().stream_reader(data) as reader:
            assert reader.read() == plaintext
        if 0 in compress_frame(plaintext)[-2:]:
            found += 1
            assert data.endswith(b"}\n")  # the stored (raw-block) frame
    assert found > 0  # the fallback was exercised
