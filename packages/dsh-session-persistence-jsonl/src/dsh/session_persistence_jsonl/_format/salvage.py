"""Salvage: the events of a damaged transcript that precede its first damage (read-only, for ``export --salvage``).

A normal load refuses a log with damage in its committed region as a whole. Salvage walks the same bytes
front to back and stops at the first defect: a frame whose structure or checksum fails, a line that does not
decode, a seq gap, or a torn tail. Everything before it was written and read back intact; nothing after it is
kept, because later bytes cannot be trusted to continue what was lost.
"""

from __future__ import annotations

import zstandard
from dsh.session_persistence.backend import SalvagedLog, SessionHeader

from ..encryption import KeyProvider
from .frames import Compression, FrameError, decode_frame, scan_frames
from .records import NotAHeaderError, corrupt, parse_header_line
from .v0 import LineScanner
from .v1 import BatchDamage, BufferSource, walk_declared

__all__ = ["salvage_declared", "salvage_raw", "salvage_zstd"]


def _header(line: bytes, path: str) -> tuple[SessionHeader, int]:
    try:
        return parse_header_line(line, path)
    except NotAHeaderError as exc:
        raise corrupt(f"cannot salvage: {exc}", path) from exc


def _damage(scanner: LineScanner, what: str | None) -> str | None:
    if scanner.defect is not None:
        return scanner.defect
    return what


def salvage_raw(data: bytes, path: str) -> SalvagedLog:
    """The prefix of a plain JSONL transcript before the first undecodable line or seq gap."""
    end = data.find(b"\n")
    if end < 0:
        raise corrupt("cannot salvage: empty or header-less session log", path)
    header, cut = _header(data[:end], path)
    scanner = LineScanner(strict=False)
    scanner.feed(data[end + 1 :])
    tail = "a torn tail (an unfinished last line)" if scanner.has_fragment else None
    return SalvagedLog(header, cut, scanner.events, _damage(scanner, tail))


def salvage_zstd(data: bytes, path: str) -> SalvagedLog:
    """The prefix of a Zstandard transcript: whole frames, in order, until the first frame that fails."""
    view = memoryview(data)
    try:
        first = scan_frames(view, max_frames=1)
        if not first.frames:
            raise corrupt("cannot salvage: empty or header-less Zstandard session log", path)
        start, stop = first.frames[0]
        head = decode_frame(view[start:stop], start)
    except FrameError as exc:
        raise corrupt(f"cannot salvage: the header frame is damaged ({exc})", path) from exc
    if not head.endswith(b"\n") or head.count(b"\n") != 1:
        raise corrupt("cannot salvage: the first frame is not exactly one header line", path)
    header, cut = _header(head[:-1], path)
    scanner = LineScanner(strict=False)
    decompressor = zstandard.ZstdDecompressor()
    damage: str | None = None
    pos = stop
    while pos < len(data) and scanner.defect is None:
        try:
            scan = scan_frames(view, max_frames=1, start=pos)
        except FrameError as exc:
            damage = str(exc)
            break
        if not scan.frames:
            damage = f"a torn tail (an unfinished frame at byte {pos})"
            break
        start, stop = scan.frames[0]
        try:
            plaintext = decode_frame(view[start:stop], start, decompressor)
        except FrameError as exc:
            damage = str(exc)
            break
        kept = len(scanner.events)
        scanner.feed(plaintext)
        if scanner.has_fragment or (scanner.defect is not None):
            # A frame is one batch, all or nothing: a frame with a defect contributes none of its events.
            del scanner.events[kept:]
            damage = scanner.defect or f"frame at byte {start} does not end on a complete record"
            break
        pos = stop
    return SalvagedLog(header, cut, scanner.events, damage)


def salvage_declared(
    data: bytes, compression: Compression, path: str, cap: int, keys: KeyProvider | None = None
) -> SalvagedLog:
    """The prefix of a declared (v1) transcript: the walk is repeated over the bytes before each damaged batch
    until it reads cleanly (every retry ends strictly earlier, so this stops)."""
    limit = len(data)
    damage: str | None = None
    while True:
        try:
            log = walk_declared(BufferSource(data[:limit]), compression, path, cap, keys=keys)
        except BatchDamage as exc:
            if not 0 < exc.offset < limit:
                raise corrupt(f"cannot salvage: {exc}", path) from exc
            damage = damage or str(exc)
            limit = exc.offset
            continue
        if damage is None and log.torn is not None:
            damage = f"a torn tail (an unfinished last batch at byte {log.torn.truncate_to})"
        return SalvagedLog(log.header, log.inherited_event_count, list(log.events), damage)
