"""Sealed logs (log format v2 = v1 with every batch's data sealed by AES-256-GCM): the seal's wire rules.

A sealed transcript is a v1 transcript whose header line says ``"version":2`` and carries
``"sealed":{"aead":"AES-256-GCM","log":"<32 hex digits>"}`` (``log``: 128 random bits drawn when the header is
written). The header stays plaintext (listing and lifecycle need no key); each later batch keeps its v1
declaration (seq, count, length, CRC-32 of the bytes on disk), and its data is a *seal* holding the key id, a
random 96-bit nonce and the AEAD ciphertext of what v1 would have stored (the zstd frame, or the JSONL lines):

* ``zstd``: one Zstandard skippable frame (magic ``0x184D2A5E``): ``u8 1`` (AES-256-GCM), ``u8`` id length, the
  key id, the nonce, the ciphertext with its 16-byte tag, and a final ``0x0A`` (committed data never ends in a
  zero byte, so the v1 zero-tail rules hold unchanged);
* ``none``: one line ``{"type":"dsh.sealed","aead":"AES-256-GCM","key":K,"nonce":B64,"data":B64}``.

The associated data (:func:`associated_data`) binds a batch to its place: the SHA-256 of the header line (session
id, creation time, lineage, the random ``log``), the compression, and the declared first seq and count. The walk
demands contiguous seqs, so the seq range is the batch's position: a batch moved to another session, another
incarnation of the same id, or another position (its declaration rewritten to fit) fails authentication.
A 0.2 reader refuses ``version`` 2 as a newer format (``SessionFormatUnsupportedError``) before reading a batch.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from dsh.session_persistence.backend import SESSION_FORMAT_VERSION, SessionPersistenceCorruptionError
from dsh.session_persistence.encryption import check_cipher_available, check_key, check_key_id, sealed_opener
from dsh.session_persistence.encryption import seal as seal_bytes

from ..encryption import KeyProvider, SessionDecryptError, SessionKeyError
from .frames import Compression

__all__ = [
    "AEAD_NAME",
    "SEALED_FORMAT_VERSION",
    "BatchSeal",
    "HeaderSeal",
    "associated_data",
    "check_cipher_available",
    "header_seal",
    "open_batch",
    "seal_batch",
    "seal_header_line",
    "unsealed_header_object",
]

#: The header version of a sealed log (v1's declared batches, sealed data).
SEALED_FORMAT_VERSION = 2
AEAD_NAME = "AES-256-GCM"
_AEAD_CODE = 1
NONCE_BYTES = 12
TAG_BYTES = 16
SEAL_FRAME_MAGIC = b"\x5e\x2a\x4d\x18"  # skippable frame 0x184D2A5E (v1 declarations use ...5D), little-endian
_END = b"\n"
_LINE = re.compile(
    rb'\{"type":"dsh\.sealed","aead":"AES-256-GCM","key":"([A-Za-z0-9._-]{1,64})",'
    rb'"nonce":"([A-Za-z0-9+/=]{16})","data":"([A-Za-z0-9+/=]*)"\}\n'
)
_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
_HEX32 = re.compile(r"[0-9a-f]{32}")


def corrupt(message: str, path: str) -> SessionPersistenceCorruptionError:
    # records.corrupt's text; not imported from there, as records reads sealed headers through this module
    return SessionPersistenceCorruptionError(f"{message} (session log: {path})")


@dataclass(frozen=True, slots=True)
class HeaderSeal:
    """What a sealed header line states: the session id and the digest every batch's associated data carries."""

    session_id: str
    digest: bytes


def _marker_ok(marker: object) -> bool:
    return (
        type(marker) is dict
        and marker.get("aead") == AEAD_NAME
        and type(marker.get("log")) is str
        and _HEX32.fullmatch(marker["log"]) is not None
        and len(marker) == 2
    )


def unsealed_header_object(obj: dict[str, Any]) -> dict[str, Any]:
    """A sealed header object as the v1 header it wraps (version 1, no ``sealed`` key); any other object as is.

    ``version`` 2 without a well-formed ``sealed`` marker is left alone, so it is refused as a newer format.
    """
    if obj.get("version") == SEALED_FORMAT_VERSION and _marker_ok(obj.get("sealed")):
        return {k: (SESSION_FORMAT_VERSION if k == "version" else v) for k, v in obj.items() if k != "sealed"}
    return obj


def header_seal(line: bytes) -> HeaderSeal | None:
    """The seal a verified header line (LF excluded) declares, or ``None`` for a plaintext (v1) header."""
    try:
        obj = _decoder.decode(line)
    except msgspec.DecodeError:
        return None
    if type(obj) is not dict or obj.get("version") != SEALED_FORMAT_VERSION or not _marker_ok(obj.get("sealed")):
        return None
    return HeaderSeal(str(obj.get("id")), hashlib.sha256(line).digest())


def seal_header_line(line: bytes) -> tuple[bytes, HeaderSeal]:
    """The sealed form of a header line (LF-terminated) and its seal: a fresh random ``log`` in the marker, and
    version 2 for a v1 header.

    A header of a version this build does not write (only planted ones: a newer or older format) keeps its
    version, so its log is refused on read, before any batch, exactly as if written elsewhere; its batches are
    sealed all the same.
    """
    obj = _decoder.decode(line)
    if obj.get("version") == SESSION_FORMAT_VERSION:
        obj["version"] = SEALED_FORMAT_VERSION
    obj["sealed"] = {"aead": AEAD_NAME, "log": os.urandom(16).hex()}
    sealed = _encoder.encode(obj)
    return sealed + b"\n", HeaderSeal(str(obj.get("id")), hashlib.sha256(sealed).digest())


def associated_data(seal: HeaderSeal, compression: Compression, first_seq: int, count: int) -> bytes:
    """The AEAD associated data of one batch: header digest, compression, declared first seq and count."""
    return _log_part(seal, compression) + _batch_part(first_seq, count)


def _log_part(seal: HeaderSeal, compression: Compression) -> bytes:
    """What the associated data of every batch of one log shares (computed once per log by :class:`BatchSeal`)."""
    return b"dsh.sealed.v1\n" + seal.digest + (b"z" if compression == "zstd" else b"n")


_batch_part = struct.Struct("<QI").pack  # the declared first seq and count


@dataclass(frozen=True, slots=True)
class BatchSeal:
    """A sealed log's header seal with the keys to use on it (``keys`` ``None``: a backend without keys).

    Made once per walk or writer: it keeps what every batch of the log shares (the associated data's log part,
    the keys already fetched and checked, by id), so a batch costs its own open and nothing per log.
    """

    header: HeaderSeal
    keys: KeyProvider | None
    compression: Compression
    path: str
    log_part: bytes = field(init=False, repr=False, compare=False)
    _openers: dict[str, Callable[[bytes, bytes, bytes], bytes | None]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    _keys: dict[str, bytes] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_part", _log_part(self.header, self.compression))

    def associated_data(self, first_seq: int, count: int) -> bytes:
        """:func:`associated_data` of a batch of this log (its shared part computed once)."""
        return self.log_part + _batch_part(first_seq, count)

    def where(self, offset: int, first_seq: int, count: int) -> str:
        return (
            f'session "{self.header.session_id}": batch at byte {offset} (seqs {first_seq}..{first_seq + count - 1}, '
            f'"{self.path}")'
        )

    def key(self, key_id: str, where: str) -> bytes:
        if self.keys is None:
            raise SessionKeyError(f'{where} is sealed with key "{key_id}", and this backend has no key provider')
        key = self.keys.key(key_id)
        if key is None:
            raise SessionKeyError(f'{where} is sealed with key "{key_id}", which the key provider does not hold')
        return check_key(key_id, key)

    def opener(
        self, key_id: str, offset: int, first_seq: int, count: int
    ) -> Callable[[bytes, bytes, bytes], bytes | None]:
        """The seal opener of :meth:`key` for a batch's stated key id, fetched and checked once per id for this log."""
        opener = self._openers.get(key_id)
        if opener is None:
            key = self.key(check_key_id(key_id), self.where(offset, first_seq, count))
            opener = sealed_opener(key)
            self._openers[key_id] = opener
            self._keys[key_id] = key
        return opener

    def fetched_key(self, key_id: str) -> bytes | None:
        """The key of ``key_id`` if :meth:`opener` already fetched and checked it for this log, else ``None``."""
        return self._keys.get(key_id)


def seal_batch(seal: BatchSeal, first_seq: int, count: int, inner: bytes) -> bytes:
    """The sealed data of one batch (``inner``: the zstd frame or the JSONL lines v1 would have stored)."""
    if seal.keys is None:
        raise SessionKeyError(
            f'session "{seal.header.session_id}" is sealed, and this backend has no key provider to write to it'
        )
    key_id = check_key_id(seal.keys.current_key_id())
    key = seal.key(key_id, f'session "{seal.header.session_id}": the current key')
    # a random nonce per batch (the shared seal's): see docs/operations.md for why not a counter
    nonce, sealed = seal_bytes(key, inner, seal.associated_data(first_seq, count))
    if seal.compression == "zstd":
        payload = bytes((_AEAD_CODE, len(key_id))) + key_id.encode("ascii") + nonce + sealed + _END
        return SEAL_FRAME_MAGIC + struct.pack("<I", len(payload)) + payload
    return b'{"type":"dsh.sealed","aead":"%s","key":"%s","nonce":"%s","data":"%s"}\n' % (
        AEAD_NAME.encode(),
        key_id.encode("ascii"),
        base64.b64encode(nonce),
        base64.b64encode(sealed),
    )


def _parse_zstd(data: bytes, offset: int, first_seq: int, count: int, seal: BatchSeal) -> tuple[str, bytes, bytes]:
    def bad() -> SessionPersistenceCorruptionError:  # its text names the batch: built only when it is raised
        where = seal.where(offset, first_seq, count)
        return corrupt(f"corrupt Zstandard session log: {where} is not a well-formed seal", seal.path)

    if len(data) < 10 or data[:4] != SEAL_FRAME_MAGIC or data[-1:] != _END:
        raise bad()
    (size,) = struct.unpack_from("<I", data, 4)
    if size != len(data) - 8 or data[8] != _AEAD_CODE:
        raise bad()
    id_end = 10 + data[9]
    if len(data) < id_end + NONCE_BYTES + TAG_BYTES + 1:
        raise bad()
    key_id = data[10:id_end].decode("ascii", "replace")
    return key_id, data[id_end : id_end + NONCE_BYTES], data[id_end + NONCE_BYTES : -1]


def _parse_line(data: bytes, offset: int, first_seq: int, count: int, seal: BatchSeal) -> tuple[str, bytes, bytes]:
    where, path = seal.where(offset, first_seq, count), seal.path
    match = _LINE.fullmatch(data)
    if match is None:
        raise corrupt(f"corrupt session log: {where} is not a well-formed seal line", path)
    try:
        nonce = base64.b64decode(match.group(2), validate=True)
        sealed = base64.b64decode(match.group(3), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise corrupt(f"corrupt session log: {where} has a seal that is not valid base64", path) from exc
    if len(nonce) != NONCE_BYTES or len(sealed) < TAG_BYTES:
        raise corrupt(f"corrupt session log: {where} has a seal of impossible size", path)
    return match.group(1).decode("ascii"), nonce, sealed


def open_batch(seal: BatchSeal, data: bytes | memoryview, first_seq: int, count: int, offset: int) -> bytes:
    """The inner bytes of one verified-CRC sealed batch; typed errors for a missing key or failed authentication."""
    raw = bytes(data)
    parse = _parse_zstd if seal.compression == "zstd" else _parse_line
    key_id, nonce, sealed = parse(raw, offset, first_seq, count, seal)
    opened = seal.opener(key_id, offset, first_seq, count)(nonce, sealed, seal.associated_data(first_seq, count))
    if opened is None:
        raise SessionDecryptError(
            f"{seal.where(offset, first_seq, count)} fails authentication under key "
            f'"{key_id}": the key is wrong, or the batch was altered or moved'
        )
    return opened
