"""Exhaustive crash sweeps over a realistic transcript (spec/jsonl.md §5 #71, #82; DESIGN §7).

* Truncation: cut the file at every byte offset of its last frame (zstd) / last batch (raw). Every cut loads as
  the committed prefix plus a torn marker, never raises and never loses a committed event; repair then leaves
  a clean file that starts with the committed bytes, and a second load changes nothing.
* Bit flips: flip every byte of the committed frames / lines. Each flip is detected as corruption (or a format
  refusal) or loads unchanged; it never silently drops a committed event.

Default mode keeps the file small; ``DSH_LONG=1`` uses a bigger session and every flip mask.
"""
# ruff: noqa: ASYNC240

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from dsh.session_persistence import interrupted_turn_closers
from dsh.session_persistence.backend import SessionPersistenceError, decode_storage_line, encode_storage_lines
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl._frames import scan_frames

from ._sessions import storage, turn_batches

LONG = os.environ.get("DSH_LONG") == "1"
pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(1800 if LONG else 120)]

TURNS, TOKENS = (6, 40) if LONG else (3, 12)
MASKS = (0x01, 0x10, 0x80, 0xFF)
#: Every cut is loaded; repair + reload (four durable calls) runs on every REPAIR_STRIDE-th cut and the last one.
REPAIR_STRIDE = 1 if LONG else 5


@pytest.fixture(params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweeps test the torn/corrupt decision, not durability: skip the (slow) fsyncs."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def _overwrite(path: Path, data: bytes, at: int = 0, size: int | None = None) -> None:
    """Write in place without O_TRUNC (ext4's auto_da_alloc makes truncate-and-rewrite flush to disk)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, at)
        if size is not None:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)


async def _build(tmp_path: Path, compression: str) -> tuple[JsonlBackend, Any, list[list[Any]], Path, int]:
    """Write a realistic session one batch per turn, with the last turn's batch open (no turn/end)."""
    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    st = storage()
    batches = turn_batches(TURNS, tokens=TOKENS)
    batches[-1] = batches[-1][:-1]  # the last batch leaves its turn open, as a crash would
    for i, batch in enumerate(batches[:-1]):
        await backend.append_batch(st, batch, i > 0)
    path = Path(backend.locate(st.meta).path)
    last_start = path.stat().st_size
    await backend.append_batch(st, batches[-1], True)
    return backend, st, batches, path, last_start


def _raw_line_model(batch: list[Any]) -> list[tuple[int, int]]:
    """(end offset within the batch, events in the file up to that line) for the last batch's lines."""
    body = encode_storage_lines(batch, pack_chunks=True)
    out: list[tuple[int, int]] = []
    pos = count = 0
    for line in body.split(b"\n")[:-1]:
        pos += len(line) + 1
        count += len(decode_storage_line(line))
        out.append((pos, count))
    return out


async def test_truncate_at_every_offset_of_the_last_frame(tmp_path: Path, compression: str) -> None:
    backend, st, batches, path, last_start = await _build(tmp_path, compression)
    full = path.read_bytes()
    committed = [e for b in batches[:-1] for e in b]
    everything = committed + batches[-1]
    model = _raw_line_model(batches[-1])
    for cut in range(last_start, len(full)):
        _overwrite(path, full[last_start:], last_start, cut)
        loaded = await backend.load_stored("s1")
        assert loaded is not None
        events = loaded.events
        assert events == everything[: len(events)], cut
        assert len(events) >= len(committed), cut
        if compression == "none":
            complete = [n for end, n in model if end <= cut - last_start]
            assert len(events) == len(committed) + (complete[-1] if complete else 0), cut
            at_boundary = cut == last_start or any(end == cut - last_start for end, _ in model)
            assert (loaded.torn_marker is None) == at_boundary, cut
        else:
            assert (loaded.torn_marker is None) == (cut == last_start), cut
            if cut == len(full) - 1:  # only the checksum's last byte is missing: the whole batch is recovered
                assert events == everything
        if (cut - last_start) % REPAIR_STRIDE and cut != len(full) - 1:
            continue
        closers = interrupted_turn_closers(events)
        await backend.commit_repair(st, loaded.torn_marker, closers)
        repaired = await backend.load_stored("s1")
        assert repaired is not None
        assert repaired.torn_marker is None, cut
        assert repaired.events == events + closers, cut
        after = path.read_bytes()
        assert after.startswith(full[:last_start]), cut
        if compression == "zstd":
            assert scan_frames(after).torn_start is None
        again = await backend.load_stored("s1")
        assert again is not None
        assert again.revision == repaired.revision


def _flip_sweep(
    backend: JsonlBackend, path: Path, offsets: range, n_events: int, everything: list[Any]
) -> dict[str, int]:
    """Runs in one worker thread: flip each byte, read through the backend's own read path, classify."""
    full = path.read_bytes()
    stats = {"corrupt": 0, "unchanged": 0, "changed_values": 0, "torn_prefix": 0}
    # Long mode: every mask on checksummed zstd frames; two on raw lines (no checksum: masks add little there).
    masks = (MASKS if backend.compression == "zstd" else MASKS[::3]) if LONG else None
    for offset in offsets:
        for mask in masks or (MASKS[offset % len(MASKS)],):
            damaged = bytes([full[offset] ^ mask])
            _overwrite(path, damaged, offset)
            try:
                result = backend._read_log("s1")
            except SessionPersistenceError:
                stats["corrupt"] += 1
                continue
            finally:
                # Reading never modifies the file (checked by size and the flipped byte), then undo the flip.
                with path.open("rb") as fh:
                    assert os.fstat(fh.fileno()).st_size == len(full)
                    fh.seek(offset)
                    assert fh.read(1) == damaged
                _overwrite(path, full[offset : offset + 1], offset)
            assert result is not None
            log, _rev = result
            if log.events == everything and log.torn is None:
                stats["unchanged"] += 1
            elif len(log.events) == n_events and log.torn is None:
                stats["changed_values"] += 1  # raw mode only: no checksum, but nothing was lost
            else:
                stats["torn_prefix"] += 1
                stats.setdefault("first_torn_offset", offset)
    return stats


async def test_flip_every_byte_of_committed_frames(tmp_path: Path, compression: str) -> None:
    backend, _st, batches, path, last_start = await _build(tmp_path, compression)
    everything = [e for b in batches for e in b]
    full = path.read_bytes()
    if compression == "zstd":
        offsets = range(0, last_start)  # header frame + every complete non-final frame
    else:
        # Every byte up to the LF that ends the second-to-last line: damage there is followed by a valid line.
        second_last_lf = full.rfind(b"\n", 0, len(full) - 1)
        offsets = range(0, second_last_lf)
    stats = await anyio.to_thread.run_sync(_flip_sweep, backend, path, offsets, len(everything), everything)
    assert stats["torn_prefix"] == 0, stats
    if compression == "zstd":
        assert stats["changed_values"] == 0, stats  # checksummed frames: a flip is caught or harmless
    assert stats["corrupt"] > 0


async def test_flip_every_byte_of_the_final_frame_never_invents_events(tmp_path: Path, compression: str) -> None:
    """The final frame / line: a flip is corruption, unchanged, or (documented residual, spec §2.6) a tear."""
    backend, _st, batches, path, last_start = await _build(tmp_path, compression)
    everything = [e for b in batches for e in b]
    full = path.read_bytes()
    start = last_start if compression == "zstd" else full.rfind(b"\n", 0, len(full) - 1)
    stats = await anyio.to_thread.run_sync(
        _flip_sweep, backend, path, range(start, len(full)), len(everything), everything
    )
    assert stats["corrupt"] + stats["unchanged"] + stats["changed_values"] + stats["torn_prefix"] >= len(full) - start
