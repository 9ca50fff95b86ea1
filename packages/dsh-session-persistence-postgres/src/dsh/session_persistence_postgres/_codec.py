"""Row codec: one stored event is its compact JSON line, zstd-compressed when that pays."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ._core import SessionEvent, decode_event_line, encode_event

if TYPE_CHECKING:  # imported at the first (de)compression: the plugin module loads this one in every CLI process
    import zstandard

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
        self._level = level
        # zstandard contexts must not be shared between threads: one pair per thread.
        self._local = threading.local()

    def _contexts(self) -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
        pair: tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor] | None = getattr(self._local, "pair", None)
        if pair is None:
            import zstandard

            pair = (zstandard.ZstdCompressor(level=self._level), zstandard.ZstdDecompressor())
            self._local.pair = pair
        return pair

    def encode(self, event: SessionEvent) -> tuple[int, bool, bytes]:
        """The row of one event."""
        raw = encode_event(event)
        if len(raw) >= self.threshold:
            packed = self._contexts()[0].compress(raw)
            if len(packed) < len(raw):
                return event.seq, True, packed
        return event.seq, False, raw

    def raw(self, compressed: bool, body: bytes) -> bytes:
        """The JSON line of one row (raises ``zstandard.ZstdError`` for a damaged frame)."""
        return self._contexts()[1].decompress(body) if compressed else body

    def decode(self, compressed: bool, body: bytes) -> SessionEvent:
        """The event of one row (raises ``ValueError`` or ``zstandard.ZstdError`` for a damaged row)."""
        return decode_event_line(self.raw(compressed, body))
