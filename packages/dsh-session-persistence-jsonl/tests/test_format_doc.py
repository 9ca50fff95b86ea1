"""``docs/operations.md`` ("Reading the format from outside") is enough to read a v1 log: a small reader written
from that section alone (struct, zlib, a stock Zstandard decoder; none of the backend's format code) walks real
logs of both encodings and finds what the backend stored.

The public codec (``decode_storage_lines_from``) is used only to expand the stored lines into events, which is
what the doc says ``count`` counts.
"""
# ruff: noqa: ASYNC240

from __future__ import annotations

import json
import os
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
import zstandard
from dsh.session_persistence.backend import decode_storage_lines_from, encode_event
from dsh.session_persistence_jsonl import JsonlBackend

from ._sessions import Builder, storage

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    return str(request.param)


_LINE = re.compile(rb'\{"type":"dsh\.batch","seq":(\d+),"count":(\d+),"bytes":(\d+),"crc32":(\d+),"check":(\d+)\}')
_ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"


def _frame_has_checksum(frame: bytes) -> bool:
    assert frame[:4] == _ZSTD_FRAME_MAGIC
    return bool(frame[4] & 0x04)  # Frame_Header_Descriptor, Content_Checksum_flag (RFC 8878)


def read_outside(data: bytes, compression: str) -> list[dict[str, Any]]:
    """Every (declaration, data) pair of a v1 log, read as the doc describes it."""
    pairs: list[dict[str, Any]] = []
    pos = 0
    while pos < len(data):
        if compression == "zstd":
            magic, size, seq, count, length, crc, own = struct.unpack_from("<IIQIIII", data, pos)
            assert magic == 0x184D2A5D and size == 24
            assert zlib.crc32(data[pos : pos + 28]) == own
            start = pos + 32
        else:
            lf = data.index(b"\n", pos)
            line = data[pos:lf]
            match = _LINE.fullmatch(line)
            assert match is not None, line
            seq, count, length, crc, own = (int(g) for g in match.groups())
            assert zlib.crc32(line[: line.rindex(b',"check":')]) == own
            start = lf + 1
        body = data[start : start + length]
        assert len(body) == length and zlib.crc32(body) == crc
        if compression == "zstd":
            plaintext = zstandard.ZstdDecompressor().decompress(body)
            checksummed = _frame_has_checksum(body)
        else:
            plaintext, checksummed = body, False
        pairs.append({"seq": seq, "count": count, "plaintext": plaintext, "body": body, "checksum": checksummed})
        pos = start + length
    return pairs


async def test_a_reader_written_from_the_doc_reads_a_real_log(
    tmp_path: Path, compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # hundreds of tiny batches: durability is not the point
    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    st = storage()
    builder = Builder(seed=11)
    builder.turn(0, steps=2, tokens=12)  # one batch with runs of text deltas: packed rows
    await backend.append_batch(st, builder.events, False)
    path = Path(backend.locate(st.meta).path)
    turn = 1
    # Single-event batches until a zstd frame would end in a zero byte (about one in 128) and was stored raw.
    while turn < 200:
        start = len(builder.events)
        builder.turn(turn, steps=1, tokens=2)
        for event in builder.events[start:]:
            await backend.append_batch(st, [event], True)
        turn += 1
        if compression == "none" or any(not p["checksum"] for p in read_outside(path.read_bytes(), "zstd")[1:]):
            break
    pairs = read_outside(path.read_bytes(), compression)

    header = pairs[0]
    assert (header["seq"], header["count"]) == (0, 0)
    assert header["plaintext"].endswith(b"\n") and header["plaintext"].count(b"\n") == 1
    assert json.loads(header["plaintext"])["version"] == 1
    expected_seq = 0
    events = []
    packed = 0
    for pair in pairs[1:]:
        assert pair["seq"] == expected_seq and pair["count"] >= 1
        decoded, contiguous = decode_storage_lines_from(pair["plaintext"], pair["seq"])
        assert contiguous and len(decoded) == pair["count"]  # count counts expanded events
        packed += pair["plaintext"].count(b"\n") < pair["count"]
        assert pair["body"][-1] != 0  # committed data never ends in a zero byte
        events.extend(decoded)
        expected_seq += pair["count"]
    assert packed >= 1
    if compression == "zstd":
        raw = [p for p in pairs[1:] if not p["checksum"]]
        assert raw, "no batch was stored as raw blocks"
        for pair in raw:
            assert pair["body"][-len(pair["plaintext"]) :] == pair["plaintext"]  # raw blocks: the plaintext last
    stored = await backend.load_stored("s1")
    assert stored is not None
    assert [encode_event(e) for e in events] == [encode_event(e) for e in stored.events]
