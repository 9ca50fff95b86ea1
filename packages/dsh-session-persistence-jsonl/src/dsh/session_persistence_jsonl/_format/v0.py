"""The line scanner and the torn-tail vs corruption decision for whole transcripts (spec §2.4-§2.6, DESIGN §7).

DESIGN §7 is stricter than the reference: only a structurally incomplete final frame (zstd), or a final
incomplete line / damage with no valid line after it (raw), is a torn tail. A damaged complete frame, or damage
followed by any later valid line or frame, is committed-region corruption and raises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import zstandard
from dsh.session_persistence.backend import (
    SessionEvent,
    SessionHeader,
    StorageLineError,
    decode_storage_line,
    decode_storage_lines,
    first_seq_gap,
)

from .bounded import DEFAULT_MAX_BATCH_BYTES
from .frames import FrameError, decode_frame, decode_partial, find_later_complete_frame, scan_frames
from .records import NotAHeaderError, corrupt, parse_header_line

__all__ = [
    "HEADER_CAP",
    "CommittedDamage",
    "DecodedLog",
    "LineScanner",
    "TornTail",
    "decode_raw_log",
    "decode_zstd_log",
]

_RAW_FEED_CHUNK = 1 << 20
#: A header is read by ``list`` for every session: one larger than this is damage, not a read.
HEADER_CAP = 1 << 20
_TORN_RECORD = "corrupt Zstandard session log: complete frame contains a torn JSONL record"


class CommittedDamage(ValueError):
    """Damage inside the committed region (the message is the spec's text for the first defect)."""


@dataclass(slots=True)
class TornTail:
    """The backend's opaque torn marker: cut the file at ``truncate_to``, then re-append ``recovered_events``.

    ``expected_size`` is the file size when the tail was observed; repair refuses to cut a file that has
    changed since (it would destroy bytes nobody has read).
    """

    truncate_to: int
    recovered_events: list[SessionEvent]
    expected_size: int


@dataclass(slots=True)
class DecodedLog:
    """A decoded transcript: header, cut, the contiguous event prefix and the torn tail if any."""

    header: SessionHeader
    inherited_event_count: int
    events: Sequence[SessionEvent]
    torn: TornTail | None = None
    size: int = 0
    committed_end: int = 0
    frames: list[tuple[int, int]] = field(default_factory=list)


class LineScanner:
    """Accepts plaintext in arbitrary chunks and keeps the longest contiguous, seq-checked event prefix.

    Only LF-terminated lines count; a trailing fragment survives chunk splits (even inside a multi-byte
    character) and is otherwise ignored. On the first defect the scanner freezes ``committed`` before the
    defective line. In ``strict`` mode a later line that decodes raises the remembered defect (damage inside
    committed data, DESIGN §7); with ``strict=False`` (a torn frame's unverified plaintext) scanning just stops.
    """

    def __init__(self, *, strict: bool = True) -> None:
        self.events: list[SessionEvent] = []
        self.strict = strict
        self.fed = 0
        self.committed = 0
        self.defect: str | None = None
        self.defect_cause: Exception | None = None
        self._fragment = b""
        self._line_no = 0

    @property
    def has_fragment(self) -> bool:
        """Whether bytes without a terminating LF are pending."""
        return bool(self._fragment)

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Scan the complete lines that ``chunk`` finishes; the caller's buffer is copied, never kept."""
        data = self._fragment + bytes(chunk)
        lines = data.split(b"\n")
        self._fragment = lines.pop()
        for line in lines:
            self._take(line)

    def feed_frame(self, plaintext: bytes) -> None:
        """:meth:`feed` for a complete frame's plaintext, with every line decoded in one batch when it can be.

        The batch is taken only when nothing is pending (no defect, no fragment), the frame ends on LF, every line
        decodes (:func:`decode_storage_lines`) and the seqs continue contiguously: exactly the case in which
        :meth:`_take` would accept each line in turn, so the same bookkeeping is applied at once. Anything else is
        fed line by line from the start of the frame.
        """
        if self.defect is None and not self._fragment:
            try:
                events = decode_storage_lines(plaintext)
            except StorageLineError:
                pass
            else:
                if first_seq_gap(events, len(self.events)) is None:
                    self.events.extend(events)
                    self._line_no += plaintext.count(b"\n")
                    self.fed += len(plaintext)
                    self.committed = self.fed
                    return
        self.feed(plaintext)

    def _take(self, line: bytes) -> None:
        self._line_no += 1
        size = len(line) + 1
        if self.defect is not None:
            if self.strict and _decodes(line):
                raise CommittedDamage(self.defect) from self.defect_cause
            self.fed += size
            return
        expected = len(self.events)
        try:
            events = decode_storage_line(line)
        except StorageLineError as exc:
            self.defect = f"corrupt session log: unparsable committed event at line {self._line_no}: {exc}"
            self.defect_cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
        else:
            gap = first_seq_gap(events, expected)
            if gap is None:
                self.events.extend(events)
                self.committed = self.fed + size
            else:
                self.defect = (
                    f"corrupt session log: seq gap in committed region at line {self._line_no} "
                    f"(expected {expected + gap}, got {events[gap].seq})"
                )
                # A row that closes a turn was committed as a whole: its gap cannot be a torn tail.
                if self.strict and any(e.type == "turn/end" for e in events):
                    raise CommittedDamage(self.defect)
        self.fed += size


def _decodes(line: bytes) -> bool:
    try:
        decode_storage_line(line)
    except StorageLineError:
        return False
    return True


def _split_header(path: str, text: bytes) -> tuple[SessionHeader, int]:
    try:
        return parse_header_line(text, path)
    except NotAHeaderError as exc:
        raise corrupt(str(exc), path) from exc


def decode_raw_log(buf: bytes, path: str, checkpoint: Callable[[], None] | None = None) -> DecodedLog:
    """Decode a ``compression="none"`` transcript. The torn marker is present iff bytes follow the prefix."""
    end = buf.find(b"\n")
    if end < 0:
        raise corrupt("corrupt session log: empty or header-less session log", path)
    header, cut = _split_header(path, buf[:end])
    scanner = LineScanner(strict=True)
    view = memoryview(buf)
    try:
        for start in range(end + 1, len(buf), _RAW_FEED_CHUNK):
            if checkpoint is not None:
                checkpoint()
            scanner.feed(view[start : start + _RAW_FEED_CHUNK])
    except CommittedDamage as exc:
        raise corrupt(str(exc), path) from (exc.__cause__ or exc)
    committed_end = end + 1 + scanner.committed
    torn = None
    if committed_end < len(buf):
        torn = TornTail(truncate_to=committed_end, recovered_events=[], expected_size=len(buf))
    return DecodedLog(header, cut, scanner.events, torn, len(buf), committed_end)


def _feed_complete_frames(
    view: memoryview,
    frames: list[tuple[int, int]],
    scanner: LineScanner,
    checkpoint: Callable[[], None] | None,
    cap: int,
) -> None:
    """Complete frames are all-or-nothing: each must decode, end on LF and hold no defect."""
    decompressor = zstandard.ZstdDecompressor()
    for start, stop in frames:
        if checkpoint is not None:
            checkpoint()
        plaintext = decode_frame(view[start:stop], start, decompressor, cap)
        scanner.feed_frame(plaintext)
        if scanner.has_fragment or not plaintext:
            raise CommittedDamage(_TORN_RECORD)
    if scanner.defect is not None:
        raise CommittedDamage(f"{_TORN_RECORD} ({scanner.defect})") from scanner.defect_cause


def decode_zstd_log(
    buf: bytes, path: str, checkpoint: Callable[[], None] | None = None, cap: int = DEFAULT_MAX_BATCH_BYTES
) -> DecodedLog:
    """Decode a ``compression="zstd"`` transcript: complete frames all-or-nothing, then the torn last frame."""
    view = memoryview(buf)
    try:
        scan = scan_frames(view)
    except FrameError as exc:
        raise corrupt(str(exc), path) from exc
    torn_start = scan.torn_start
    if torn_start is not None:
        later = find_later_complete_frame(view, torn_start, cap)
        if later is not None:
            raise corrupt(
                f"corrupt Zstandard session log: apparent torn frame at byte {torn_start} "
                f"is followed by a complete frame at byte {later}",
                path,
            )
    if not scan.frames:
        raise corrupt("corrupt Zstandard session log: empty or header-less Zstandard session log", path)
    try:
        first = decode_frame(view[scan.frames[0][0] : scan.frames[0][1]], 0, cap=min(cap, HEADER_CAP))
    except FrameError as exc:
        raise corrupt(str(exc), path) from exc
    if not first.endswith(b"\n") or first.count(b"\n") != 1:
        raise corrupt("corrupt Zstandard session log: first frame is not exactly one header line", path)
    header, cut = _split_header(path, first[:-1])
    scanner = LineScanner(strict=True)
    try:
        _feed_complete_frames(view, scan.frames[1:], scanner, checkpoint, cap)
    except (FrameError, CommittedDamage) as exc:
        raise corrupt(str(exc), path) from (exc.__cause__ or exc)
    committed_end = scan.frames[-1][1]
    torn = None
    if torn_start is not None:
        count = len(scanner.events)
        scanner.strict = False
        scanner.feed(decode_partial(view[torn_start:], cap))
        torn = TornTail(truncate_to=torn_start, recovered_events=scanner.events[count:], expected_size=len(buf))
    return DecodedLog(header, cut, scanner.events, torn, len(buf), committed_end, scan.frames)
