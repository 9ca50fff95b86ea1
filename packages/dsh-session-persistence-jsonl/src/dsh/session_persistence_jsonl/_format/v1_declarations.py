"""Batch declarations of log format v1: the small record written before each batch's data, in the same write.

A declaration states the batch's first seq, its event count, the length of its data and a CRC-32 of the data,
and carries a CRC-32 of its own bytes, so a reader can tell a write that never completed (the file ends inside
a declaration or its declared data) from damage (a complete declaration or data that does not verify), and can
walk a log batch by batch without decompressing it. One encoding per compression mode:

* ``zstd``: a Zstandard *skippable frame* (magic ``0x184D2A5D``, 24 payload bytes), which ``zstd -d`` and every
  conforming decoder skip, so the file stays a valid concatenation of frames;
* ``none``: one JSON line ``{"type":"dsh.batch","seq":S,"count":N,"bytes":L,"crc32":C,"check":K}`` that ``jq``
  reads like any other line; ``K`` is the CRC-32 of the line's bytes before ``,"check":``.

Each wire rule is one function here: :func:`zstd_declaration` / :func:`parse_zstd_declaration`,
:func:`line_declaration` / :func:`parse_line_declaration`, :func:`data_crc`, and the torn-prefix rules
:func:`could_be_torn_zstd_declaration` / :func:`could_be_torn_line_declaration`.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass

__all__ = [
    "LINE_DECLARATION_MAX",
    "LINE_DECLARATION_PREFIX",
    "MAX_DECLARED_BYTES",
    "ZSTD_DECLARATION_MAGIC",
    "ZSTD_DECLARATION_SIZE",
    "Declaration",
    "DeclarationError",
    "could_be_torn_line_declaration",
    "could_be_torn_zstd_declaration",
    "data_crc",
    "line_declaration",
    "parse_line_declaration",
    "parse_zstd_declaration",
    "torn_line_declaration_fits",
    "torn_zstd_declaration_fits",
    "zstd_declaration",
]

#: Skippable-frame magic (0x184D2A50-0x184D2A5F are reserved for skippable frames; ``D`` is ours), little-endian.
ZSTD_DECLARATION_MAGIC = b"\x5d\x2a\x4d\x18"
_ZSTD_PAYLOAD = struct.Struct("<QIII")  # first seq, count, data length, data CRC-32
_ZSTD_FIXED = ZSTD_DECLARATION_MAGIC + struct.pack("<I", _ZSTD_PAYLOAD.size + 4)
_ZSTD_WHOLE = struct.Struct("<QQIIII")  # fixed prefix (as one integer), payload, own CRC
(_ZSTD_FIXED_INT,) = struct.unpack("<Q", _ZSTD_FIXED)
#: Where the data length sits in a zstd declaration (after magic, frame size, first seq and count).
_LENGTH_AT = len(_ZSTD_FIXED) + 8 + 4
#: Total bytes of one zstd declaration: magic, frame size, payload, own CRC-32.
ZSTD_DECLARATION_SIZE = len(_ZSTD_FIXED) + _ZSTD_PAYLOAD.size + 4
#: Data lengths and counts are 32-bit on disk; a cap can never exceed this.
MAX_DECLARED_BYTES = (1 << 32) - 1

#: Every ``none``-mode declaration line starts with these bytes.
LINE_DECLARATION_PREFIX = b'{"type":"dsh.batch","seq":'
_CHECK_KEY = b',"check":'
_LINE = re.compile(
    rb'\{"type":"dsh\.batch","seq":(0|[1-9][0-9]{0,19}),"count":(0|[1-9][0-9]{0,9}),'
    rb'"bytes":(0|[1-9][0-9]{0,9}),"crc32":(0|[1-9][0-9]{0,9}),"check":(0|[1-9][0-9]{0,9})\}'
)
#: Longest possible declaration line, LF excluded (every number at its widest).
LINE_DECLARATION_MAX = len(b'{"type":"dsh.batch","seq":,"count":,"bytes":,"crc32":,"check":}') + 20 + 4 * 10


class DeclarationError(ValueError):
    """A complete declaration that does not verify (wrong bytes, wrong CRC, impossible values)."""


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ is several times slower, and one is made per batch
class Declaration:
    """One parsed declaration: ``count`` events from ``first_seq`` in ``length`` data bytes with CRC ``crc``."""

    first_seq: int
    count: int
    length: int
    crc: int


def data_crc(data: bytes | memoryview) -> int:
    """The CRC-32 (zlib polynomial) a declaration carries for its data."""
    return zlib.crc32(data)


def zstd_declaration(first_seq: int, count: int, data: bytes) -> bytes:
    """The skippable frame that declares ``data`` (one zstd frame) as ``count`` events from ``first_seq``."""
    body = _ZSTD_FIXED + _ZSTD_PAYLOAD.pack(first_seq, count, len(data), data_crc(data))
    return body + struct.pack("<I", zlib.crc32(body))


def parse_zstd_declaration(raw: bytes | memoryview) -> Declaration:
    """Parse exactly :data:`ZSTD_DECLARATION_SIZE` bytes; raise :class:`DeclarationError` unless they verify."""
    if len(raw) != ZSTD_DECLARATION_SIZE:
        raise DeclarationError(f"declaration has {len(raw)} bytes, expected {ZSTD_DECLARATION_SIZE}")
    fixed, first_seq, count, length, crc, own = _ZSTD_WHOLE.unpack(raw)
    if fixed != _ZSTD_FIXED_INT:
        raise DeclarationError("bytes at a declaration position are not a batch declaration")
    if zlib.crc32(raw[: ZSTD_DECLARATION_SIZE - 4]) != own:
        raise DeclarationError("batch declaration fails its own CRC")
    return Declaration(first_seq, count, length, crc)


def could_be_torn_zstd_declaration(head: bytes | memoryview) -> bool:
    """Whether ``head`` (a tail with trailing zero bytes removed) can be the start of an unfinished declaration.

    A write that never completed leaves a prefix of our bytes, possibly followed by zeros where the size
    reached the disk but the data did not; a committed batch never looks like this (its data never ends in a
    run of zeros that reaches back into its declaration).
    """
    head = bytes(head)
    return len(head) < ZSTD_DECLARATION_SIZE and _ZSTD_FIXED.startswith(head[: len(_ZSTD_FIXED)])


def torn_zstd_declaration_fits(head: bytes, first_seq: int, rest: int | None) -> bool:
    """Whether ``head``, the surviving first bytes of a declaration, can start the one a writer would write for a
    batch from ``first_seq`` whose declaration and data are ``rest`` bytes long (``None``: unknown, the write was
    cut short). The magic, frame size and seq are known in advance, and so is the data length when ``rest`` is;
    the count and the CRCs are not."""
    length = None if rest is None else rest - ZSTD_DECLARATION_SIZE
    if length is not None and not 0 <= length <= MAX_DECLARED_BYTES:
        return False
    known = _ZSTD_FIXED + first_seq.to_bytes(8, "little")
    if head[: len(known)] != known[: len(head)]:
        return False
    if length is None or len(head) <= _LENGTH_AT:
        return True
    surviving = head[_LENGTH_AT : _LENGTH_AT + 4]
    return surviving == length.to_bytes(4, "little")[: len(surviving)]


def line_declaration(first_seq: int, count: int, data: bytes) -> bytes:
    """The ``none``-mode declaration line (LF-terminated) for ``data`` (the batch's LF-terminated lines)."""
    body = b'%s%d,"count":%d,"bytes":%d,"crc32":%d' % (
        LINE_DECLARATION_PREFIX,
        first_seq,
        count,
        len(data),
        data_crc(data),
    )
    return b"%s%s%d}\n" % (body, _CHECK_KEY, zlib.crc32(body))


def parse_line_declaration(line: bytes | memoryview) -> Declaration:
    """Parse one declaration line (LF excluded); raise :class:`DeclarationError` unless it verifies exactly."""
    line = bytes(line)
    match = _LINE.fullmatch(line)
    if match is None:
        raise DeclarationError("line at a declaration position is not a batch declaration")
    first_seq, count, length, crc, own = (int(g) for g in match.groups())
    if zlib.crc32(line[: line.rindex(_CHECK_KEY)]) != own:
        raise DeclarationError("batch declaration fails its own CRC")
    if first_seq >= 1 << 64 or max(count, length, crc) > MAX_DECLARED_BYTES:
        raise DeclarationError("batch declaration states an impossible value")
    return Declaration(first_seq, count, length, crc)


_LINE_TO_BYTES = re.compile(rb'\{"type":"dsh\.batch","seq":[0-9]+,"count":[0-9]+,"bytes":([0-9]+),')
_LINE_REST_MIN = len(b'"crc32":0,"check":0}\n')
_LINE_REST_MAX = len(b'"crc32":4294967295,"check":4294967295}\n')


def torn_line_declaration_fits(head: bytes, first_seq: int, rest: int | None) -> bool:
    """:func:`torn_zstd_declaration_fits` for a ``none``-mode declaration line: its first bytes up to the seq are
    known in advance; when ``rest`` is known and the ``"bytes"`` field survived, the line it starts (whose CRC
    fields are 1 to 10 digits each) plus that many data bytes must be ``rest`` bytes long."""
    known = b'%s%d,"count":' % (LINE_DECLARATION_PREFIX, first_seq)
    if head[: len(known)] != known[: len(head)]:
        return False
    match = _LINE_TO_BYTES.match(head)
    if rest is None or match is None:
        return True
    after = rest - match.end() - int(match.group(1))
    return _LINE_REST_MIN <= after <= _LINE_REST_MAX


def could_be_torn_line_declaration(head: bytes | memoryview) -> bool:
    """Whether ``head`` (a tail with trailing zero bytes removed) can be the start of an unfinished line."""
    head = bytes(head)
    if b"\n" in head or len(head) > LINE_DECLARATION_MAX:
        return False
    return LINE_DECLARATION_PREFIX.startswith(head[: len(LINE_DECLARATION_PREFIX)])
