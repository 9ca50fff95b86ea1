"""Decompression that never allocates more than a cap: a 33 KB frame that expands to 1 GiB is damage, not memory.

A frame that pledges its content size is checked against the cap before any output exists, and libzstd then
refuses to write past the pledge. A frame without a pledged size (never written by this package, possible in
hand-made or foreign v0 logs) is streamed in bounded steps and given up on as soon as the output passes the cap.
"""

from __future__ import annotations

import zstandard

__all__ = [
    "DEFAULT_MAX_BATCH_BYTES",
    "FrameError",
    "OversizedError",
    "decompress_declared",
    "decompress_frame_bounded",
    "decompress_partial_bounded",
]

#: Default cap on one batch's data and on its decompressed size: far above any real batch.
DEFAULT_MAX_BATCH_BYTES = 256 << 20

_STEP = 1 << 20
# An RLE block is 4 input bytes for up to 128 KiB of output: 256 input bytes never yield more than 8 MiB.
_PARTIAL_STEP = 256
_CORRUPT = "corrupt Zstandard session log: "


class FrameError(ValueError):
    """The byte structure is corrupt at a complete position (not a torn tail)."""


class OversizedError(FrameError):
    """A declaration or frame states (or expands to) more bytes than this backend's ``max_batch_bytes``."""


def _oversized(offset: int, size: int | str, cap: int) -> OversizedError:
    return OversizedError(
        f"{_CORRUPT}frame at byte {offset} expands to {size} bytes, above max_batch_bytes={cap} "
        "(raise the backend's max_batch_bytes if this log is genuine)"
    )


_FCS_BYTES = (0, 2, 4, 8)


def _content_size(frame: bytes | memoryview) -> int | None:
    """The content size a frame header pledges, ``None`` if it pledges none (or is not a frame header)."""
    if len(frame) < 6 or frame[:4] != b"\x28\xb5\x2f\xfd":
        return None
    fhd = frame[4]
    single = fhd & 0x20
    width = _FCS_BYTES[fhd >> 6] or (1 if single else 0)
    if width == 0:
        return None
    start = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 0x03]
    if len(frame) < start + width:
        return None
    size = int.from_bytes(frame[start : start + width], "little")
    return size + 256 if width == 2 else size


def decompress_declared(frame: bytes | memoryview, offset: int, cap: int, dctx: zstandard.ZstdDecompressor) -> bytes:
    """A v1 batch's frame, whose bytes already passed their CRC: it must pledge a size in ``(0, cap]``."""
    size = _content_size(frame)
    if size is None or size == 0:
        raise FrameError(f"{_CORRUPT}frame at byte {offset} does not state its content size")
    if size > cap:
        raise _oversized(offset, size, cap)
    try:
        out = dctx.decompress(frame)
    except zstandard.ZstdError as exc:
        raise FrameError(f"{_CORRUPT}frame at byte {offset} failed validation") from exc
    if len(out) != size:
        raise FrameError(f"{_CORRUPT}frame at byte {offset} failed validation")
    return out


def _stream(frame: bytes | memoryview, offset: int, cap: int, dctx: zstandard.ZstdDecompressor) -> bytes:
    parts: list[bytes] = []
    total = 0
    with dctx.stream_reader(bytes(frame), read_across_frames=False) as reader:
        while True:
            chunk = reader.read(_STEP)
            if not chunk:
                return b"".join(parts)
            total += len(chunk)
            if total > cap:
                # Free the output now: the traceback keeps this frame (and its locals) alive until collected.
                parts.clear()
                raise _oversized(offset, f"more than {cap}", cap)
            parts.append(chunk)


def decompress_frame_bounded(
    frame: bytes | memoryview, offset: int, cap: int, dctx: zstandard.ZstdDecompressor
) -> bytes:
    """A complete v0 frame with checksum validation, its output bounded by ``cap``."""
    size = _content_size(frame)
    if size is not None and size > cap:
        raise _oversized(offset, size, cap)
    if size is None:
        try:
            return _stream(frame, offset, cap, dctx)
        except zstandard.ZstdError as exc:
            raise FrameError(f"{_CORRUPT}frame at byte {offset} failed validation") from exc
    dobj = dctx.decompressobj()
    try:
        out = dobj.decompress(frame)
    except zstandard.ZstdError as exc:
        raise FrameError(f"{_CORRUPT}frame at byte {offset} failed validation") from exc
    if not dobj.eof or dobj.unused_data:
        raise FrameError(f"{_CORRUPT}frame at byte {offset} failed validation")
    return out


def decompress_partial_bounded(data: bytes | memoryview, cap: int) -> bytes:
    """Whatever plaintext a torn v0 frame yields, at most ``cap`` bytes (unverified: it has no checksum)."""
    parts: list[bytes] = []
    total = 0
    dobj = zstandard.ZstdDecompressor().decompressobj()
    view = memoryview(bytes(data))
    try:
        for start in range(0, len(view), _PARTIAL_STEP):
            out = dobj.decompress(view[start : start + _PARTIAL_STEP])
            total += len(out)
            if total > cap:
                break
            parts.append(out)
            if dobj.eof:
                break
    except zstandard.ZstdError:
        pass
    return b"".join(parts)
