"""The clean-batch fast path of the v1 walk (:mod:`.v1`): a span of batches that verify, decoded in one loop.

A load walks hundreds of small batches; the general walk spends more on its per-batch machinery (a declaration
object, a seal parsed into copies, a call per step) than on the batch's own decompress and decode. :func:`clean_span`
walks an in-memory zstd transcript's batches in a few loops and takes a batch only when *every* rule of the general
walk holds for it (declaration shape and own CRC, count, seq, length within the cap and the file, data CRC, a seal
well-formed and opened under a key the walk already holds, the frame's pledged size (read by zstd's own header
parser) within the cap and met, the lines decoding to exactly the declared events, contiguous). At the first batch
where anything is off it stops and the general walk takes that batch from its first byte, so every error, torn-tail
decision and text comes from one place; a span is the same events, plaintexts and ends the general walk would give,
only cheaper.

A span's seals are parsed in place (slices of the read buffer, no copy) and opened in one pass
(:func:`~dsh.session_persistence.encryption.open_sealed_many`) under the key the walk already fetched for their key
id; a key id it has not fetched yet leaves the batch to the general walk, which fetches it (and raises its key
errors) exactly as before.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Protocol

import zstandard
from dsh.session_persistence.backend import SessionEvent, StorageLineError, decode_stored_batch
from dsh.session_persistence.encryption import open_sealed_many

from .sealed import NONCE_BYTES, SEAL_FRAME_MAGIC, TAG_BYTES, BatchSeal
from .v1_declarations import _ZSTD_FIXED_INT, _ZSTD_WHOLE, ZSTD_DECLARATION_SIZE

__all__ = ["Span", "Walk", "clean_span"]

_OWN = ZSTD_DECLARATION_SIZE - 4
_unpack_whole = _ZSTD_WHOLE.unpack_from  # fixed prefix (one integer), first seq, count, length, data CRC, own CRC
_u32 = struct.Struct("<I").unpack_from
_crc32 = zlib.crc32
_LF = 0x0A
_AEAD_CODE = 1
_SEAL_MIN = 10 + NONCE_BYTES + TAG_BYTES + 1
_content_size = zstandard.frame_content_size


class Walk(Protocol):
    """What a span needs of the general walk's state (``v1._Walk``)."""

    cap: int
    seal: BatchSeal | None
    dctx: zstandard.ZstdDecompressor


#: Verified declarations: ``(first_seq, count, data_start, end)`` of each batch.
Declared = list[tuple[int, int, int, int]]
#: ``(batches, ends, plaintexts, expected)``: the clean batches in order, where each ends, their plaintexts, and the
#: seq the next batch must start at.
Span = tuple[list[Sequence[SessionEvent]], list[int], list[bytes], int]


def _declared(buf: bytes, view: memoryview, pos: int, stop: int, expected: int, from_seq: int, cap: int) -> Declared:
    """The batches from ``pos`` whose declarations and data verify, in order, up to the first that does not (or
    starts at or past ``stop``, or is a batch to skip, or the file ends): ``(first_seq, count, data_start, end)``."""
    size = len(buf)
    out: Declared = []
    while pos < stop and pos + ZSTD_DECLARATION_SIZE <= size:
        fixed, first_seq, count, length, crc, own = _unpack_whole(buf, pos)
        data_start = pos + ZSTD_DECLARATION_SIZE
        end = data_start + length
        if (
            fixed != _ZSTD_FIXED_INT
            or count == 0
            or first_seq != expected
            or length > cap
            or end > size
            or first_seq + count <= from_seq
            or _crc32(view[pos : pos + _OWN]) != own
            or _crc32(view[data_start:end]) != crc
        ):
            break
        out.append((first_seq, count, data_start, end))
        expected = first_seq + count
        pos = end
    return out


def _opened(seal: BatchSeal, buf: bytes, view: memoryview, batches: Declared) -> list[bytes]:
    """The inner frames of ``batches`` (sealed), opened in one pass, up to the first whose seal is not well formed,
    is under a key id other than the first's or one the walk has not fetched yet, or fails authentication.

    Read in place: the nonces and ciphertexts are views of the read buffer (only key ids are copied out). The first
    seal is parsed field by field; each later one is compared in one step with the header it must then have."""
    if not batches:
        return []
    seals: list[tuple[memoryview, memoryview, bytes]] = []
    append = seals.append
    startswith = buf.startswith
    associated = struct.Struct(f"<{len(seal.log_part)}sQI").pack  # what every seal of the log shares, then its own
    log_part = seal.log_part
    # The first seal, field by field: it names the key id every seal after it must carry.
    first_seq, count, start, end = batches[0]
    if end - start < _SEAL_MIN or not startswith(SEAL_FRAME_MAGIC, start) or buf[end - 1] != _LF:
        return []
    if _u32(buf, start + 4)[0] != end - start - 8 or buf[start + 8] != _AEAD_CODE:
        return []
    id_end = start + 10 + buf[start + 9]
    nonce_end = id_end + NONCE_BYTES
    if end < nonce_end + TAG_BYTES + 1:
        return []
    key_id = buf[start + 10 : id_end]
    append((view[id_end:nonce_end], view[nonce_end : end - 1], associated(log_part, first_seq, count)))
    # Every later seal: the same fields (magic, the length after them, the AEAD code, the same key id) compared in
    # one step against the header such a seal has; the nonce and ciphertext then sit at fixed offsets.
    header = struct.Struct(f"<4sIBB{len(key_id)}s").pack
    fixed = 10 + len(key_id)  # header bytes before the nonce
    least = fixed + NONCE_BYTES + TAG_BYTES + 1
    for first_seq, count, start, end in batches[1:]:
        size = end - start
        if size < least or buf[end - 1] != _LF:
            break
        if not startswith(header(SEAL_FRAME_MAGIC, size - 8, _AEAD_CODE, len(key_id), key_id), start):
            break  # not well formed, or another key id: the general walk (which fetches keys) takes it from here
        nonce_end = start + fixed + NONCE_BYTES
        append((view[start + fixed : nonce_end], view[nonce_end : end - 1], associated(log_part, first_seq, count)))
    key = seal.fetched_key(key_id.decode("ascii", "replace"))
    return [] if key is None else open_sealed_many(key, seals)


def clean_span(
    buf: bytes,
    view: memoryview,
    pos: int,
    stop: int,
    expected: int,
    from_seq: int,
    walk: Walk,
    keep_texts: bool,
) -> Span:
    """The clean batches from ``pos`` (a declaration position of a zstd transcript held in ``buf``, ``view`` a view
    of it), walked until one starts at or past ``stop`` or is not clean, or the file ends. ``expected`` is the seq
    the first must start at; only batches that reach ``from_seq`` are taken (a batch to skip is the general walk's).
    ``walk`` gives the cap, the seal and the decompressor; the plaintexts are kept only with ``keep_texts``."""
    cap, seal, dctx = walk.cap, walk.seal, walk.dctx
    declared = _declared(buf, view, pos, stop, expected, from_seq, cap)
    frames: Sequence[bytes | memoryview]  # each batch's frame: a view of the read buffer, or an opened seal
    if seal is None:
        frames = [view[start:end] for _first, _count, start, end in declared]
    else:
        frames = _opened(seal, buf, view, declared)
    batches: list[Sequence[SessionEvent]] = []
    ends: list[int] = []
    plaintexts: list[bytes] = []
    decompress = dctx.decompress
    for (first_seq, count, _start, end), frame in zip(declared, frames, strict=False):
        try:
            # What the frame header pledges (-1: no size, 0: a skippable frame): checked before a byte is inflated.
            pledged = _content_size(frame)
            if not 0 < pledged <= cap:
                break
            plaintext = decompress(frame)
        except zstandard.ZstdError:  # not a frame header, or a frame that does not decompress
            break
        if len(plaintext) != pledged or plaintext[-1] != _LF:
            break
        try:
            events, contiguous = decode_stored_batch(plaintext, first_seq)
        except StorageLineError:
            break
        if len(events) != count or not contiguous:
            break
        batches.append(events)
        ends.append(end)
        if keep_texts:
            plaintexts.append(plaintext)
        expected = first_seq + count
    return batches, ends, plaintexts, expected
