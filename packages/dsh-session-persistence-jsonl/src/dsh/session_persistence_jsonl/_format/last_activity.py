"""A transcript's own last activity: the time of its last committed event, read from the log (never its mtime).

A listing orders, filters (``since``) and prunes by this time, so a transcript copied, restored or touched keeps
the activity its events say. A v1 log is walked by its declarations alone (a few bytes per batch) and only its
last complete batch is read, verified and decoded (bounded by ``cap`` on decompressed bytes, as a load is); a v0
log is decoded whole (legacy, rare). A log with no events answers its header's ``createdAt``. Where the log cannot
say (a sealed batch without its key, damage in the last batch, an unreadable header) the answer is ``None`` and
the caller decides (the listing falls back to the file's mtime, the only activity readable then).

Blocking code for worker threads.
"""

from __future__ import annotations

import os

import zstandard
from dsh.session_persistence.backend import SessionPersistenceError

from ..encryption import KeyProvider
from .frames import Compression, FrameError
from .sources import FdSource
from .v0 import HEADER_CAP, decode_raw_log, decode_zstd_log
from .v1 import _declaration_at, _read_header, _Walk, is_declared
from .v1_declarations import MAX_DECLARED_BYTES, Declaration, DeclarationError, data_crc

__all__ = ["last_event_time"]


def last_event_time(
    fd: int, size: int, compression: Compression, path: str, cap: int, keys: KeyProvider | None
) -> int | None:
    """Milliseconds of the last committed event of the transcript open on ``fd`` (``size`` bytes), or ``None``."""
    try:
        if is_declared(os.pread(fd, 64, 0), compression):
            return _declared(FdSource(fd, size), compression, path, cap, keys)
        return _legacy(fd, size, compression, path, cap)
    except (SessionPersistenceError, FrameError, DeclarationError, ValueError, MemoryError):
        return None


def _declared(src: FdSource, compression: Compression, path: str, cap: int, keys: KeyProvider | None) -> int | None:
    walk = _Walk(compression, path, min(cap, MAX_DECLARED_BYTES), zstandard.ZstdDecompressor(), keys)
    if keys is not None:  # the header names the seal its batches are opened with
        _read_header(src, walk, min(walk.cap, HEADER_CAP), False, None)
    # Without keys the header is only stepped over (parsing it is most of the cost): a sealed batch then fails to
    # decode (no time: the caller's fallback), and a log with no batch has its header read for its createdAt.
    decl, data_start = _declaration_at(src, 0, compression)
    if decl.count != 0 or decl.first_seq != 0:
        return None
    pos = data_start + decl.length
    # The complete batches, by their declarations only; the walk stops where a torn tail or damage starts (the
    # activity the log vouches for is that of its last batch before it).
    complete: list[tuple[int, int, Declaration]] = []
    expected = 0
    while pos < src.size:
        try:
            decl, data_start = _declaration_at(src, pos, compression)
        except DeclarationError:
            break
        end = data_start + decl.length
        if decl.count == 0 or decl.first_seq != expected or decl.length > walk.cap or end > src.size:
            break
        complete.append((pos, data_start, decl))
        if len(complete) > 2:
            del complete[0]
        expected = decl.first_seq + decl.count
        pos = end
    # The last batch may be a write whose data never reached the disk (zeros, fails its CRC): the one before it.
    for pos, data_start, decl in reversed(complete):
        data = src.read(data_start, data_start + decl.length)
        if data_crc(data) != decl.crc:
            continue
        plaintext = walk.plaintext(walk.opened(data, decl, pos), data_start)
        return walk.events(plaintext, decl, pos)[-1].time
    return _read_header(src, walk, min(walk.cap, HEADER_CAP), False, None)[0].created_at


def _legacy(fd: int, size: int, compression: Compression, path: str, cap: int) -> int | None:
    data = bytearray()
    while len(data) < size:
        chunk = os.pread(fd, size - len(data), len(data))
        if not chunk:
            break
        data += chunk
    buf = bytes(data)
    log = decode_zstd_log(buf, path, None, cap) if compression == "zstd" else decode_raw_log(buf, path)
    committed = len(log.events) - (len(log.torn.recovered_events) if log.torn is not None else 0)
    return log.events[committed - 1].time if committed > 0 else log.header.created_at
