"""Row codec: one stored event is its compact JSON line, zstd-compressed when that pays."""

from __future__ import annotations

import zstandard

from ._core import SessionEvent, decode_event_line, encode_event

__all__ = ["DEFAULT_COMPRESS_THRESHOLD", "EventCodec"]

#: Events whose encoded JSON is at least this long are stored compressed when that makes them smaller.
DEFAULT_COMPRESS_THRESHOLD = 4096


class EventCodec:
    """Encodes events into ``(seq, compressed, body)`` rows and back.

    Compression is decided per event: small events stay plain JSON (readable with ``convert_from(body, 'UTF8')``
    in SQL), and a large one is stored compressed only when the zstd frame is smaller than the JSON.
    """

    def __init__(self, threshold: int = DEFAULT_COMPRESS_THRESHOLD, level: int = 3) -> None:
        if threshold < 1:
            raise ValueError("compress_threshold must be a positive number of bytes")
        self.threshold = threshold
        self._compressor = zstandard.ZstdCompressor(level=level)
        self._decompressor = zstandard.ZstdDecompressor()

    def encode(self, event: SessionEvent) -> tuple[int, bool, bytes]:
        """The row of one event."""
        raw = encode_event(event)
        if len(raw) >= self.threshold:
            packed = self._compressor.compress(raw)
            if len(packed) < len(raw):
                return event.seq, True, packed
        return event.seq, False, raw

    def decode(self, compressed: bool, body: bytes) -> SessionEvent:
        """The event of one row (raises ``ValueError`` or ``zstandard.ZstdError`` for a damaged row)."""
        raw = self._decompressor.decompress(body) if compressed else body
        return decode_event_line(raw)
