"""Torn tails of log format v1: what a write that never completed can leave after the last complete batch.

The rules :mod:`.v1` walks by (its module docstring states them): only zeros, a declaration cut short, or the start
of a declaration (or a batch's data) followed by zeros from a sector boundary to the end of the file.
"""

from __future__ import annotations

from .frames import Compression
from .sources import Source
from .v1_declarations import (
    LINE_DECLARATION_MAX,
    ZSTD_DECLARATION_SIZE,
    could_be_torn_line_declaration,
    could_be_torn_zstd_declaration,
    torn_line_declaration_fits,
    torn_zstd_declaration_fits,
)

__all__ = ["SECTOR", "head_end", "rest_is_torn", "zero_filled_write"]

_SCAN_CHUNK = 1 << 20


def head_end(src: Source, pos: int) -> int:
    """End of the last non-zero byte at or after ``pos`` (``pos`` itself if only zeros follow)."""
    stop = src.size
    while stop > pos:
        start = max(pos, stop - _SCAN_CHUNK)
        kept = bytes(src.read(start, stop)).rstrip(b"\0")
        if kept:
            return start + len(kept)
        stop = start
    return pos


def _torn_declaration(head: bytes, compression: Compression, expected_seq: int | None, rest: int | None) -> bool:
    """Whether ``head`` can be the surviving start of the declaration of the batch in flight (see below)."""
    if compression == "zstd":
        if not could_be_torn_zstd_declaration(head.rstrip(b"\0")):
            return False
        return expected_seq is None or torn_zstd_declaration_fits(head, expected_seq, rest)
    if b"\0" in head or not could_be_torn_line_declaration(head):
        return False  # a declaration line never holds a zero byte of its own
    return expected_seq is None or torn_line_declaration_fits(head, expected_seq, rest)


def rest_is_torn(
    src: Source, pos: int, compression: Compression, expected_seq: int | None = None, cap: int | None = None
) -> bool:
    """Whether what follows ``pos`` (the end of the last complete batch) can be one write that never completed.

    That write is the batch in flight, declared from ``expected_seq``, at most one batch long (``cap``): only
    zeros (its size reached the disk, none of its bytes), or its declaration cut short, or the start of its
    declaration followed by zeros from a sector boundary inside it to the end of the file, where every declared
    field that survived must fit that batch (its seq, and its length, which must end it exactly at the end of the
    file). Zeros reaching further than one batch, or a surviving length that ends elsewhere, are damage: a crash
    only ever tears the final batch.
    """
    limit = ZSTD_DECLARATION_SIZE if compression == "zstd" else LINE_DECLARATION_MAX + 1
    if cap is not None and src.size - pos > limit + cap:
        return False  # longer than any one batch
    end = head_end(src, pos)
    if end == pos:
        return True
    if src.size - pos <= limit and _torn_declaration(bytes(src.read(pos, src.size)), compression, expected_seq, None):
        return True  # the file ends inside the declaration (any zeros in it are its own bytes)
    if end == src.size:
        return False
    # Zeros follow the surviving bytes: a sector boundary inside the declaration must start them (a whole
    # declaration would have parsed); the bytes before that boundary are the write's own, zeros included.
    boundary = -(-end // SECTOR) * SECTOR
    if boundary >= min(src.size, pos + limit):
        return False
    return _torn_declaration(bytes(src.read(pos, boundary)), compression, expected_seq, src.size - pos)


#: The unit a disk persists atomically: a write whose data did not reach the disk reads as zeros from a sector
#: boundary on.
SECTOR = 512


def zero_filled_write(src: Source, data_start: int, end: int) -> bool:
    """Whether a batch that fails its CRC is a write whose size reached the disk but whose data did not.

    That leaves zeros from a sector boundary inside the batch's data to the end of the file. A single damaged byte
    (one zero) never qualifies: the run must cover a sector boundary inside the data and be two bytes or more.
    """
    zeros_from = head_end(src, data_start)
    boundary = -(-zeros_from // SECTOR) * SECTOR
    return boundary < end and src.size - zeros_from >= 2
