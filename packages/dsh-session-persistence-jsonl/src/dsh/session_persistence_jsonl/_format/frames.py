"""Zstandard framing: the structural frame scan, per-frame validation and torn-frame recovery (spec §2.3, §2.6).

python-zstandard's one-shot APIs silently stop at the first frame and silently drop a torn one, so every
frame is located by a pure-Python structural walk and decoded with a *fresh* ``decompressobj`` whose ``eof``
and ``unused_data`` are checked. Compressor and decompressor objects are not thread-safe: one per call (a read
shares one decompressor between its frames).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

import zstandard

from .bounded import DEFAULT_MAX_BATCH_BYTES, FrameError, decompress_frame_bounded, decompress_partial_bounded

__all__ = [
    "MAGIC",
    "FrameError",
    "FrameScan",
    "compress_frame",
    "decode_frame",
    "decode_partial",
    "find_later_complete_frame",
    "raw_frame",
    "scan_frames",
]

#: Frame magic number 0xFD2FB528, little-endian on disk.
#: How a transcript stores its batches: zstd frames (``.jsonl.zstd``) or plain lines (``.jsonl``).
Compression = Literal["zstd", "none"]

MAGIC = b"\x28\xb5\x2f\xfd"
_CORRUPT = "corrupt Zstandard session log: "


@dataclass(frozen=True, slots=True)
class FrameScan:
    """Byte ranges ``[start, end)`` of complete frames, and where an incomplete final frame starts."""

    frames: list[tuple[int, int]]
    torn_start: int | None


_local = threading.local()


def compress_frame(plaintext: bytes) -> bytes:
    """One standard frame with a content checksum (level 3, content size pledged, no dictionary).

    Each thread reuses one compressor: ``compress()`` writes an independent frame every call (same bytes as a
    fresh compressor), and creating the compression context was most of the cost of a small batch's frame.
    """
    compressor = getattr(_local, "compressor", None)
    if compressor is None:
        compressor = _local.compressor = zstandard.ZstdCompressor(level=3, write_checksum=True)
    return compressor.compress(plaintext)


_RAW_BLOCK_MAX = 128 << 10


def raw_frame(plaintext: bytes) -> bytes:
    """A standard frame of raw (stored) blocks, content size pledged, no checksum: it ends with ``plaintext``.

    Used for a declared batch whose compressed frame would end in a zero byte: a committed batch never ends in
    zeros, which is what lets a zero-filled tail (the size reached the disk, the bytes did not) be told apart
    from damage. The declaration's CRC-32 protects the bytes.
    """
    size = len(plaintext)
    if size < 256:
        header = bytes([0x20]) + size.to_bytes(1, "little")  # single segment, 1-byte content size
    elif size < 65536 + 256:
        header = bytes([0x60]) + (size - 256).to_bytes(2, "little")
    elif size < 1 << 32:
        header = bytes([0xA0]) + size.to_bytes(4, "little")
    else:  # pragma: no cover - batches are capped far below 4 GiB
        header = bytes([0xE0]) + size.to_bytes(8, "little")
    parts = [MAGIC, header]
    for start in range(0, size, _RAW_BLOCK_MAX):
        chunk = plaintext[start : start + _RAW_BLOCK_MAX]
        last = start + _RAW_BLOCK_MAX >= size
        parts.append(((len(chunk) << 3) | int(last)).to_bytes(3, "little"))
        parts.append(chunk)
    return b"".join(parts)


def _frame_end(buf: bytes | memoryview, start: int) -> int | None:
    """End offset of the frame starting at ``start``, ``None`` if the buffer ends inside it."""
    size = len(buf)
    pos = start
    if size - pos < 4:
        return None
    if bytes(buf[pos : pos + 4]) != MAGIC:
        raise FrameError(f"{_CORRUPT}invalid frame magic at byte {pos}")
    pos += 4
    if pos >= size:
        return None
    fhd = buf[pos]
    if fhd & 0x18:
        raise FrameError(f"{_CORRUPT}reserved frame-header bit at byte {pos}")
    pos += 1
    single_segment = bool(fhd & 0x20)
    did_flag = fhd & 0x03
    fcs_flag = fhd >> 6
    header_rest = (0 if single_segment else 1) + (0, 1, 2, 4)[did_flag]
    header_rest += (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    pos += header_rest
    if pos > size:
        return None
    while True:
        if size - pos < 3:
            return None
        block = buf[pos] | (buf[pos + 1] << 8) | (buf[pos + 2] << 16)
        block_type = (block >> 1) & 0x03
        if block_type == 3:
            raise FrameError(f"{_CORRUPT}reserved block type at byte {pos}")
        pos += 3 + (1 if block_type == 1 else block >> 3)
        if pos > size:
            return None
        if block & 1:
            break
    if fhd & 0x04:
        pos += 4
        if pos > size:
            return None
    return pos


def scan_frames(buf: bytes | memoryview, max_frames: int | None = None, start: int = 0) -> FrameScan:
    """Walk the frames of ``buf`` without decompressing; raises :class:`FrameError` on structural corruption.

    A torn result is only possible for the last frame: the walk stops there.
    """
    frames: list[tuple[int, int]] = []
    pos = start
    while pos < len(buf) and (max_frames is None or len(frames) < max_frames):
        end = _frame_end(buf, pos)
        if end is None:
            return FrameScan(frames, pos)
        frames.append((pos, end))
        pos = end
    return FrameScan(frames, None)


def decode_frame(
    frame: bytes | memoryview,
    offset: int,
    decompressor: zstandard.ZstdDecompressor | None = None,
    cap: int = DEFAULT_MAX_BATCH_BYTES,
) -> bytes:
    """Decode one complete frame with checksum validation, at most ``cap`` bytes; errors name the offset.

    ``decompressor`` may be shared by the frames of one read (same thread): each frame still gets a fresh
    ``decompressobj``, but creating the decompression context per frame was most of a small frame's cost.
    """
    return decompress_frame_bounded(frame, offset, cap, decompressor or zstandard.ZstdDecompressor())


def decode_partial(data: bytes | memoryview, cap: int = DEFAULT_MAX_BATCH_BYTES) -> bytes:
    """Whatever plaintext a streaming decoder yields from a torn frame (unverified: no checksum to check)."""
    return decompress_partial_bounded(data, cap)


def find_later_complete_frame(
    buf: bytes | memoryview, torn_start: int, cap: int = DEFAULT_MAX_BATCH_BYTES
) -> int | None:
    """Offset of a complete, checksum-valid frame after an apparent torn start, if any (spec §2.6 mitigation).

    A damaged length or flag field in an earlier frame can make it look torn; if a valid frame follows, the
    "torn" frame was committed and the log is corrupt, not torn.
    """
    data = bytes(buf)
    pos = data.find(MAGIC, torn_start + 1)
    while pos != -1:
        try:
            end = _frame_end(data, pos)
        except FrameError:
            end = None
        if end is not None:
            try:
                decode_frame(memoryview(data)[pos:end], pos, cap=cap)
            except FrameError:
                pass
            else:
                return pos
        pos = data.find(MAGIC, pos + 1)
    return None
