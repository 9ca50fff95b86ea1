"""Log format v1: declared batches, encoded and walked (torn versus damaged decided from the declarations).

A v1 transcript is a sequence of *(declaration, data)* pairs. The first pair holds the header line (count 0);
each later pair holds one durable batch (count >= 1, seqs contiguous across batches). A reader walks the
declarations and verifies each batch's data against its CRC:

* **torn tail** (a write that never completed, cut by ``load``): the file ends inside a declaration or inside
  its declared data, or only zero bytes (possibly after the start of a declaration) follow the last complete
  batch, or the last batch's data turns to zeros from a sector boundary to the end of the file (its size reached
  the disk, its data did not; committed data never ends in a zero byte);
* **damage** (``SessionPersistenceCorruptionError``, never cut): a complete declaration that fails its own CRC
  or states an impossible or oversized batch, data that fails its CRC or does not decode to exactly the
  declared events, anywhere, the last batch included.

Recovered events: none, except a final batch missing only its last byte (restored and verified by the CRC).
A torn batch's bytes were never acknowledged and cannot be verified, so ``load`` drops them (v0 logs keep their
partial-frame recovery).
"""

from __future__ import annotations

import operator
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import zstandard
from dsh.session_persistence.backend import (
    SessionEvent,
    SessionHeader,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    StorageLineError,
    StoredEvents,
    decode_stored_batch,
)

from ..encryption import KeyProvider
from .bounded import decompress_declared
from .frames import Compression, FrameError, compress_frame, raw_frame
from .records import NotAHeaderError, corrupt, parse_header_line
from .sealed import BatchSeal, header_seal, open_batch, seal_batch
from .sources import BufferSource, FdSource, Source
from .v0 import HEADER_CAP, DecodedLog, TornTail
from .v1_declarations import (
    LINE_DECLARATION_MAX,
    LINE_DECLARATION_PREFIX,
    MAX_DECLARED_BYTES,
    ZSTD_DECLARATION_MAGIC,
    ZSTD_DECLARATION_SIZE,
    Declaration,
    DeclarationError,
    data_crc,
    line_declaration,
    parse_line_declaration,
    parse_zstd_declaration,
    zstd_declaration,
)
from .v1_fast import clean_span
from .v1_torn import rest_is_torn, zero_filled_write

__all__ = [
    "DECLARED_FORMAT_VERSION",
    "HEADER_CAP",
    "BatchDamage",
    "BatchTooLargeError",
    "BufferSource",
    "FdSource",
    "Source",
    "encode_declared_batch",
    "encode_declared_header",
    "is_declared",
    "open_declared",
    "read_seal",
    "walk_declared",
]

#: The header version every declared (v1) transcript carries.
DECLARED_FORMAT_VERSION = 1
Checkpoint = Callable[[], None]
_seq_of = operator.attrgetter("seq")
#: How far a walk gets between two cancellation checks: a batch's own bytes or more (a check per small batch
#: cost a tenth of a reload's walk), well under a millisecond of work.
_CHECKPOINT_BYTES = 1 << 16


class BatchDamage(SessionPersistenceCorruptionError):
    """Damage in the batch whose declaration starts at ``offset`` (raised by :func:`walk_declared`).

    ``declaration`` and ``end`` are known when the declaration itself verified (then only its data is damaged).
    """

    def __init__(self, message: str, offset: int, declaration: Declaration | None, end: int | None) -> None:
        super().__init__(message)
        self.offset = offset
        self.declaration = declaration
        self.end = end


class BatchTooLargeError(SessionPersistenceError, ValueError):
    """A batch (or header) would need more bytes than the backend's ``max_batch_bytes``; nothing was written."""


def _prefix(compression: Compression) -> str:
    return "corrupt Zstandard session log: " if compression == "zstd" else "corrupt session log: "


def is_declared(head: bytes, compression: Compression) -> bool:
    """Whether a transcript starting with ``head`` is a declared (v1) log rather than a v0 one."""
    marker = ZSTD_DECLARATION_MAGIC if compression == "zstd" else LINE_DECLARATION_PREFIX
    return head.startswith(marker)


# ------------------------------------------------------------------------------------------------------------
# Writing


def encode_declared_batch(
    compression: Compression, first_seq: int, count: int, plaintext: bytes, seal: BatchSeal | None = None
) -> bytes:
    """One pair ready for a single ``write``: declaration, then the batch's frame (zstd) or lines (none).

    With ``seal`` (a sealed log) the data is the seal of that frame or those lines (``sealed``).
    """
    if seal is not None:
        inner = compress_frame(plaintext) if compression == "zstd" else plaintext
        data = seal_batch(seal, first_seq, count, inner)
        declare = zstd_declaration if compression == "zstd" else line_declaration
        return declare(first_seq, count, data) + data
    if compression == "zstd":
        data = compress_frame(plaintext)
        if 0 in data[-2:]:
            data = raw_frame(plaintext)  # ends with the plaintext's "}\n": committed data never ends in zeros
        return zstd_declaration(first_seq, count, data) + data
    return line_declaration(first_seq, count, plaintext) + plaintext


def encode_declared_header(compression: Compression, header_line: bytes) -> bytes:
    """The first pair of a v1 transcript: the header line (LF-terminated) declared as a batch of 0 events."""
    return encode_declared_batch(compression, 0, 0, header_line)


def _declaration_at(src: Source, pos: int, compression: Compression) -> tuple[Declaration, int]:
    """The declaration at ``pos`` and where its data starts; :class:`DeclarationError` if incomplete or bad."""
    if compression == "zstd":
        end = pos + ZSTD_DECLARATION_SIZE
        if end > src.size:
            raise DeclarationError("file ends inside a batch declaration")
        return parse_zstd_declaration(src.read(pos, end)), end
    window = bytes(src.read(pos, min(src.size, pos + LINE_DECLARATION_MAX + 1)))
    lf = window.find(b"\n")
    if lf < 0:
        if len(window) <= LINE_DECLARATION_MAX:
            raise DeclarationError("file ends inside a batch declaration")
        raise DeclarationError("line at a declaration position is not a batch declaration")
    return parse_line_declaration(window[:lf]), pos + lf + 1


@dataclass(slots=True)
class _Walk:
    compression: Compression
    path: str
    cap: int
    dctx: zstandard.ZstdDecompressor
    keys: KeyProvider | None = None
    seal: BatchSeal | None = None  # set by the header of a sealed log

    def opened(self, data: bytes | memoryview, decl: Declaration, offset: int) -> bytes | memoryview:
        """A batch's stored data with its seal opened (a sealed log), as v1 would have stored it."""
        return data if self.seal is None else open_batch(self.seal, data, decl.first_seq, decl.count, offset)

    def damage(self, message: str) -> Exception:
        return corrupt(f"{_prefix(self.compression)}{message}", self.path)

    def plaintext(self, data: bytes | memoryview, offset: int, cap: int | None = None) -> bytes:
        """``cap``: the decompressed bound when tighter than the walk's (the header's: its declared length is the
        compressed one, and a few KB may pledge hundreds of MiB)."""
        if self.compression == "none":
            return bytes(data)
        try:
            return decompress_declared(data, offset, self.cap if cap is None else cap, self.dctx)
        except FrameError as exc:
            raise corrupt(str(exc), self.path) from exc

    def events(self, plaintext: bytes, decl: Declaration, offset: int) -> Sequence[SessionEvent]:
        where = f"batch at byte {offset}"
        if not plaintext.endswith(b"\n"):
            raise self.damage(f"{where} does not end with a complete JSONL record")
        try:
            events, contiguous = decode_stored_batch(plaintext, decl.first_seq)
        except StorageLineError as exc:
            raise self.damage(f"{where}: unparsable committed event: {exc}") from exc
        # The count first: a declared count is never turned into a list (a crafted one could be 4 billion).
        if len(events) != decl.count or not contiguous:
            seqs = list(map(_seq_of, events))
            raise self.damage(
                f"{where} declares {decl.count} event(s) from seq {decl.first_seq} but holds seqs "
                f"{seqs[:1]}..{seqs[-1:]} ({len(seqs)} event(s))"
            )
        return events


def _read_header(
    src: Source, walk: _Walk, header_cap: int, refuse_versions: bool, plaintexts: list[bytes] | None
) -> tuple[SessionHeader, int, int]:
    """The header pair at byte 0: header, inherited cut, end of the pair."""
    try:
        decl, data_start = _declaration_at(src, 0, walk.compression)
    except DeclarationError as exc:
        raise walk.damage(f"header declaration: {exc}") from exc
    if decl.count != 0 or decl.first_seq != 0:
        raise walk.damage("the first declaration is not a header declaration")
    if decl.length > header_cap:
        raise walk.damage(f"header declares {decl.length} bytes, above the header cap of {header_cap}")
    end = data_start + decl.length
    if end > src.size:
        raise walk.damage("empty or header-less session log (the file ends inside its header)")
    data = src.read(data_start, end)
    if data_crc(data) != decl.crc:
        raise walk.damage("header data fails its CRC")
    plaintext = walk.plaintext(data, data_start, header_cap)
    if not plaintext.endswith(b"\n") or plaintext.count(b"\n") != 1:
        raise walk.damage("header batch is not exactly one header line")
    try:
        header, cut = parse_header_line(plaintext[:-1], walk.path, refuse_versions=refuse_versions)
    except NotAHeaderError as exc:
        raise corrupt(str(exc), walk.path) from exc
    sealed = header_seal(bytes(plaintext[:-1]))
    if sealed is not None:
        walk.seal = BatchSeal(sealed, walk.keys, walk.compression, walk.path)
    # A newer version is refused by parse_header_line (or listed, for list); an older one cannot be declared.
    if header.version < DECLARED_FORMAT_VERSION:
        raise walk.damage(f"declared (v1) log carries a v{header.version} header")
    if plaintexts is not None:
        plaintexts.append(plaintext)
    return header, cut, end


def read_seal(src: Source, compression: Compression, path: str, cap: int, keys: KeyProvider | None) -> BatchSeal | None:
    """The seal a declared transcript's header states (``None``: a plaintext log); damage raises as for a walk."""
    walk = _Walk(compression, path, min(cap, MAX_DECLARED_BYTES), zstandard.ZstdDecompressor(), keys)
    _read_header(src, walk, min(walk.cap, HEADER_CAP), True, None)
    return walk.seal


def _zero_filled_end(
    src: Source, walk: _Walk, data: bytes | memoryview, decl: Declaration, pos: int, data_start: int, end: int
) -> list[SessionEvent] | None:
    """A final batch whose size reached the disk but whose last bytes did not: ``None`` if it is damage.

    Committed data never ends in a zero byte (``none``: every batch ends with ``}\\n``; ``zstd``: the writer
    falls back to a stored frame ending in the plaintext when a compressed one would end in zeros), so no change
    of one byte in committed data can end it in two zeros. Zeros from a sector boundary to the end of the file
    (:func:`~.v1_torn.zero_filled_write`) are a torn write: dropped (``[]``). Data ending in exactly one zero is either
    a write torn before its last byte or a committed batch whose last byte was damaged: if some last byte makes the
    CRC verify, the batch is exactly known and its events are kept (repair re-appends them), so neither case
    loses anything.
    """
    if src.size != end:
        return None  # bytes follow (zeros or not): the file does not end with this batch, so it is not torn
    raw = bytes(data)
    if raw.endswith(b"\0\0"):
        return [] if zero_filled_write(src, data_start, end) else None
    if not raw.endswith(b"\0"):
        return None
    prefix_crc = data_crc(raw[:-1])
    for last in range(1, 256):
        if zlib.crc32(bytes((last,)), prefix_crc) == decl.crc:
            restored = raw[:-1] + bytes((last,))
            return list(walk.events(walk.plaintext(walk.opened(restored, decl, pos), data_start), decl, pos))
    return None


def _verify_skipped(src: Source, walk: _Walk, skipped: tuple[int, int, Declaration] | None) -> None:
    """A batch skipped unread that a torn tail follows must verify: its data turned to zeros (or bytes lost up to
    the tail) is damage to a batch that was complete before the final one, never part of the tear."""
    if skipped is None:
        return
    pos, data_start, decl = skipped
    end = data_start + decl.length
    if data_crc(src.read(data_start, end)) != decl.crc:
        damage = walk.damage(f"batch at byte {pos} fails its CRC ({decl.count} event(s) from seq {decl.first_seq})")
        raise BatchDamage(str(damage), pos, decl, end)


def _check_declaration(walk: _Walk, decl: Declaration, pos: int, expected: int) -> None:
    if decl.count == 0 or decl.first_seq != expected:
        raise walk.damage(
            f"batch declaration at byte {pos} declares {decl.count} event(s) from seq {decl.first_seq}, "
            f"expected a batch from seq {expected}"
        )
    if decl.length > walk.cap:
        raise walk.damage(
            f"batch at byte {pos} declares {decl.length} bytes, above max_batch_bytes={walk.cap} "
            "(raise the backend's max_batch_bytes if this log is genuine)"
        )


def walk_declared(
    src: Source,
    compression: Compression,
    path: str,
    cap: int,
    *,
    from_seq: int = 0,
    header_only: bool = False,
    plaintexts: list[bytes] | None = None,
    refuse_versions: bool = True,
    checkpoint: Checkpoint | None = None,
    keys: KeyProvider | None = None,
) -> DecodedLog:
    """Walk a declared transcript: header, then every batch; the torn tail (if any) becomes a marker.

    Batches that end before ``from_seq`` are skipped without reading their data (their declarations are still
    verified). ``header_only`` stops after the header pair; ``plaintexts`` collects the verified plaintext of the
    header and of every batch read. Damage raises ``SessionPersistenceCorruptionError`` (:class:`BatchDamage`,
    naming the damaged batch, past the header).
    """
    log, batches = open_declared(
        src,
        compression,
        path,
        cap,
        from_seq=from_seq,
        plaintexts=plaintexts,
        refuse_versions=refuse_versions,
        checkpoint=checkpoint,
        keys=keys,
    )
    if header_only:
        return log
    # Packed chunk rows stay packed: a reader expands the runs it asks for (StoredEvents).
    log.events = StoredEvents.concat([log.events, *batches])
    return log


def open_declared(
    src: Source,
    compression: Compression,
    path: str,
    cap: int,
    *,
    from_seq: int = 0,
    plaintexts: list[bytes] | None = None,
    refuse_versions: bool = True,
    checkpoint: Checkpoint | None = None,
    keys: KeyProvider | None = None,
) -> tuple[DecodedLog, Iterator[Sequence[SessionEvent]]]:
    """The header (read now, into a log with no events) and an iterator over the batches, one list each.

    The iterator yields the events of every batch that reaches ``from_seq`` (whole batches: the first may start
    before it), reading nothing else, so a caller can consume a log of any length in the memory of one batch. When
    it is exhausted the log's ``committed_end`` and ``torn`` marker are set; damage raises as for
    :func:`walk_declared`. A sealed log's batches are opened with ``keys`` (``sealed``).
    """
    walk = _Walk(compression, path, min(cap, MAX_DECLARED_BYTES), zstandard.ZstdDecompressor(), keys)
    header, cut, pos = _read_header(src, walk, min(walk.cap, HEADER_CAP), refuse_versions, plaintexts)
    log = DecodedLog(header, cut, [], None, src.size, pos)
    return log, _batches(src, walk, log, pos, from_seq, plaintexts, checkpoint)


def _batches(
    src: Source,
    walk: _Walk,
    log: DecodedLog,
    pos: int,
    from_seq: int,
    plaintexts: list[bytes] | None,
    checkpoint: Checkpoint | None,
) -> Iterator[Sequence[SessionEvent]]:
    compression = walk.compression
    expected = 0
    recovered: list[SessionEvent] = []
    # The last batch skipped unread (before ``from_seq``): a torn tail right after it is one only if it verifies.
    skipped: tuple[int, int, Declaration] | None = None
    checked_at = -_CHECKPOINT_BYTES  # the first batch checks
    # An in-memory zstd transcript: clean batches in spans (v1_fast), each stopping where the next check is due.
    fast = src if compression == "zstd" and isinstance(src, BufferSource) and type(src.data) is bytes else None
    while pos < src.size:
        if checkpoint is not None and pos - checked_at >= _CHECKPOINT_BYTES:
            checkpoint()
            checked_at = pos
        if fast is not None:
            stop = (pos if checkpoint is None else checked_at) + _CHECKPOINT_BYTES
            span, ends, texts, next_seq = clean_span(
                fast.data, fast.view, pos, stop, expected, from_seq, walk, plaintexts is not None
            )
            if span:
                expected, skipped = next_seq, None
                for index, clean in enumerate(span):
                    if plaintexts is not None:
                        plaintexts.append(texts[index])
                    pos = log.committed_end = ends[index]
                    yield clean
                continue
        try:
            decl, data_start = _declaration_at(src, pos, compression)
        except DeclarationError as exc:
            if rest_is_torn(src, pos, compression, expected, walk.cap):
                _verify_skipped(src, walk, skipped)
                break
            damage = walk.damage(f"batch declaration at byte {pos}: {exc}")
            raise BatchDamage(str(damage), pos, None, None) from exc
        end = data_start + decl.length
        batch: Sequence[SessionEvent] | None = None
        try:
            _check_declaration(walk, decl, pos, expected)
            if end > src.size:
                _verify_skipped(src, walk, skipped)
                break  # the file ends inside the declared data: a write that never completed
            expected = decl.first_seq + decl.count
            skipped = (pos, data_start, decl) if expected <= from_seq else None
            if expected > from_seq:
                data = src.read(data_start, end)
                if data_crc(data) != decl.crc:
                    torn_events = _zero_filled_end(src, walk, data, decl, pos, data_start, end)
                    if torn_events is not None:
                        recovered = torn_events
                        break  # the size of a write that never completed reached the disk, its data did not
                    raise walk.damage(
                        f"batch at byte {pos} fails its CRC ({decl.count} event(s) from seq {decl.first_seq})"
                    )
                plaintext = walk.plaintext(walk.opened(data, decl, pos), data_start)
                batch = walk.events(plaintext, decl, pos)
                if plaintexts is not None:
                    plaintexts.append(plaintext)
        except BatchDamage:
            raise
        except SessionPersistenceCorruptionError as exc:
            verified = decl if end <= src.size and decl.count else None
            raise BatchDamage(str(exc), pos, verified, end if verified else None) from exc
        pos = end
        log.committed_end = pos
        if batch is not None:
            yield batch
    if pos < src.size:
        log.torn = TornTail(truncate_to=log.committed_end, recovered_events=recovered, expected_size=src.size)
    if recovered:
        # The torn write's decodable events: part of what load returns (repair appends them again), never committed.
        yield recovered
