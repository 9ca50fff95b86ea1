"""Zstd structural frame scan and per-frame validation (spec/jsonl.md §2.3, §6.2, §5 #64-#67)."""

from __future__ import annotations

import pytest
import zstandard
from dsh.session_persistence_jsonl._format.frames import (
    MAGIC,
    FrameError,
    compress_frame,
    decode_frame,
    decode_partial,
    scan_frames,
)


def test_scan_ranges_and_checksums() -> None:
    assert scan_frames(b"").frames == []
    a, b = compress_frame(b'{"type":"session"}\n'), compress_frame(b'{"seq":0}\n')
    buf = a + b
    scan = scan_frames(buf)
    assert scan.frames == [(0, len(a)), (len(a), len(buf))]
    assert scan.torn_start is None
    assert scan_frames(buf, max_frames=1).frames == [(0, len(a))]
    for start, end in scan.frames:
        assert zstandard.get_frame_parameters(buf[start:end]).has_checksum
        assert buf[start + 4] & 0x04
    assert b"".join(decode_frame(buf[s:e], s) for s, e in scan.frames) == b'{"type":"session"}\n{"seq":0}\n'


@pytest.mark.parametrize(
    "buf",
    [
        MAGIC[:2],
        MAGIC,
        MAGIC + b"\x00",  # window descriptor missing
        MAGIC + b"\x20\x00\x01\x00",  # 2 of 3 block-header bytes
        MAGIC + b"\x20\x00" + (5 << 3 | 1).to_bytes(3, "little") + b"ab",  # raw block of 5 with 2 present
    ],
)
def test_scan_torn_at_zero(buf: bytes) -> None:
    scan = scan_frames(buf)
    assert scan.frames == []
    assert scan.torn_start == 0


@pytest.mark.parametrize(
    ("buf", "text"),
    [
        (b"\x00\x00\x00\x00", "invalid frame magic at byte 0"),
        (MAGIC + b"\x08", "reserved frame-header bit at byte 4"),
        (MAGIC + b"\x20\x00" + (3 << 1 | 1).to_bytes(3, "little"), "reserved block type at byte 6"),
        (b"\x50\x2a\x4d\x18" + b"\x00" * 8, "invalid frame magic"),  # skippable frame
    ],
)
def test_scan_corrupt(buf: bytes, text: str) -> None:
    with pytest.raises(FrameError, match=text):
        scan_frames(buf)


def _empty_frame(fhd: int) -> bytes:
    single = bool(fhd & 0x20)
    rest = (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + (1 if single else 0, 2, 4, 8)[fhd >> 6]
    header = MAGIC + bytes([fhd]) + b"\x00" * rest
    return header + (1).to_bytes(3, "little") + (b"\x00" * 4 if fhd & 0x04 else b"")


@pytest.mark.parametrize("fhd", [0x00, 0x21, 0x42, 0x83, 0xE3, 0x04])
def test_scan_accepts_hand_built_frames(fhd: int) -> None:
    frame = _empty_frame(fhd)
    assert scan_frames(frame).frames == [(0, len(frame))]
    if fhd & 0x04:
        assert scan_frames(frame[:-1]).torn_start == 0


def test_scan_rle_and_multi_block() -> None:
    rle = MAGIC + b"\x20\x00" + (7 << 3 | 1 << 1 | 1).to_bytes(3, "little") + b"x"
    assert scan_frames(rle).frames == [(0, len(rle))]
    two = MAGIC + b"\x20\x03" + (2 << 3).to_bytes(3, "little") + b"ab" + (1 << 3 | 1).to_bytes(3, "little") + b"c"
    assert scan_frames(two + rle).frames == [(0, len(two)), (len(two), len(two) + len(rle))]
    assert decode_frame(two, 0) == b"abc"


def test_every_truncation_of_a_real_frame_is_torn_and_partial_decode_never_raises() -> None:
    plaintext = b"".join(b'{"seq":%d,"text":"%s"}\n' % (i, b"x" * (i % 50)) for i in range(400))
    frame = compress_frame(plaintext)
    for cut in range(len(frame)):
        scan = scan_frames(frame[:cut])
        assert scan.frames == []
        assert scan.torn_start == (0 if cut else None)
        out = decode_partial(frame[:cut])
        assert plaintext.startswith(out)
    assert decode_partial(frame) == plaintext


def test_decode_frame_validates_checksum_and_content_size_zero() -> None:
    frame = bytearray(compress_frame(b"hello\n"))
    frame[-1] ^= 0xFF
    with pytest.raises(FrameError, match="frame at byte 7 failed validation"):
        decode_frame(bytes(frame), 7)
    empty = bytearray(compress_frame(b""))
    empty[-1] ^= 0xFF  # one-shot decompress() would accept this (content size 0 skips the checksum)
    with pytest.raises(FrameError):
        decode_frame(bytes(empty), 0)
    no_size = zstandard.ZstdCompressor(write_checksum=True, write_content_size=False).compress(b"abc\n")
    assert decode_frame(no_size, 0) == b"abc\n"
    with pytest.raises(FrameError):
        decode_frame(no_size + b"\x00", 0)  # trailing bytes after the frame
