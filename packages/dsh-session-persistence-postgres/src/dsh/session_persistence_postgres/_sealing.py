"""Sealed event rows: each event's ``body`` (after compression) under AES-256-GCM, bound to its place.

A session created by a backend given ``encryption=provider`` is *sealed*: its ``dsh_sessions`` row carries
``seal_id``, 128 random bits (32 hex digits) drawn when the row is inserted, and every event row of it stores
``key_id`` (the provider's current key when the row was written), ``nonce`` (96 fresh random bits) and as
``body`` the ciphertext with its tag (the core's :func:`~dsh.session_persistence.encryption.seal`). The
associated data binds a row to its place: the store id (``dsh_schema.store_id``), the session id, the
session's ``seal_id`` (its incarnation: a deleted and re-created id draws a new one, as a revision would), the
seq and the compression flag. A row copied to another store, session, incarnation or seq, or with its flag
flipped, fails authentication. The ``dsh_sessions`` row (header, ``next_seq``, revision, ``updated_at``) stays
plaintext: listing, ``prune``, ``rm`` and the lease need no key.

A session is sealed or plaintext for its whole life, never mixed: an encrypting backend appends plaintext rows
to a plaintext session (its compaction seals it), and a backend without keys refuses to write to a sealed one.
A plaintext row in a sealed session, or a sealed row in a plaintext one, is refused on read, never decoded.

Why ``seal_id`` and not ``created_revision``: the revision is drawn by the server inside the insert, after the
client has sealed the rows it sends in the same statement (one round trip); ``seal_id`` is drawn by the client.
"""

from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._arrays import bigint_array, bool_array, bytea_array, text_array
from ._core import (
    KeyProvider,
    SessionDecryptError,
    SessionKeyError,
    SessionPersistenceCorruptionError,
    check_key,
    check_key_id,
    open_sealed_many,
    seal,
    sealed_opener,
)
from ._errors import SealedStoreError
from ._limits import SEALED_SCHEMA_VERSION

__all__ = ["Row", "RowSealer", "SealCache", "SealedRows", "StoredRow", "new_seal_id"]

#: A plaintext row as the codec makes it: (seq, compressed, body).
Row = tuple[int, bool, bytes]
#: A row as read: (seq, compressed, body, key_id, nonce); ``key_id``/``nonce`` ``None`` for a plaintext row.
StoredRow = tuple[Any, ...]

_AD_TAG = b"dsh.pg.sealed.v1\n"
#: How many sessions' ``seal_id`` a backend remembers (a miss costs one read; a stale entry is refused by the
#: write's own check, never used to seal rows a reader could not open).
SEAL_CACHE_SIZE = 4096


def new_seal_id() -> str:
    """A fresh incarnation id for a sealed session: 128 random bits as 32 hex digits."""
    return os.urandom(16).hex()


def _field(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<I", len(raw)) + raw  # length-prefixed: no two field lists encode alike


def associated_data(store_id: str, session_id: str, seal_id: str, seq: int, compressed: bool) -> bytes:
    """What one row's seal is bound to: store, session, incarnation, seq and compression flag."""
    return _session_part(store_id, session_id, seal_id) + _row_part(seq, compressed)


def _session_part(store_id: str, session_id: str, seal_id: str) -> bytes:
    """The part of :func:`associated_data` every row of one session incarnation shares (built once per batch)."""
    return _AD_TAG + _field(store_id) + _field(session_id) + _field(seal_id)


_SEQ = struct.Struct("<Q")


def _row_part(seq: int, compressed: bool) -> bytes:
    """The part of :func:`associated_data` that is the row's own: its seq and compression flag."""
    return _SEQ.pack(seq) + (b"z" if compressed else b"n")


@dataclass(frozen=True, slots=True)
class SealedRows:
    """The arrays one write sends: the rows' bodies (sealed or plain) with their key ids and nonces."""

    seqs: list[int]
    flags: list[bool]
    bodies: list[bytes]
    key_ids: list[str | None]
    nonces: list[bytes | None]

    def params(self) -> dict[str, Any]:
        """The statement parameters: each array as its literal's text (see :mod:`._arrays`)."""
        return {
            "seqs": bigint_array(self.seqs),
            "flags": bool_array(self.flags),
            "bodies": bytea_array(self.bodies),
            "key_ids": text_array(self.key_ids),
            "nonces": bytea_array(self.nonces),
        }


class RowSealer:
    """Seals and opens one store's rows with ``keys`` (``None``: a backend without keys; plaintext only)."""

    def __init__(self, keys: KeyProvider | None, allow_plaintext: bool = False) -> None:
        self.keys = keys
        self.allow_plaintext = allow_plaintext
        #: The store's schema version says it holds sealed sessions (set when the backend starts).
        self.sealed_store = False

    def _key(self, session_id: str, key_id: str, what: str) -> bytes:
        if self.keys is None:
            raise SessionKeyError(
                f'session "{session_id}": {what} is sealed with key "{key_id}", and this backend has no key provider'
            )
        key = self.keys.key(key_id)
        if key is None:
            raise SessionKeyError(
                f'session "{session_id}": {what} is sealed with key "{key_id}", which the key provider does not hold'
            )
        return check_key(key_id, key)

    def seal_rows(self, store_id: str, session_id: str, seal_id: str | None, rows: Sequence[Row]) -> SealedRows:
        """The arrays of ``rows`` for a session of incarnation ``seal_id`` (``None``: a plaintext session)."""
        seqs = [seq for seq, _c, _b in rows]
        flags = [compressed for _s, compressed, _b in rows]
        if seal_id is None:
            if self.keys is None and self.sealed_store and not self.allow_plaintext:
                raise SealedStoreError(
                    f'refusing to write session "{session_id}" as plaintext: the store\'s schema version '
                    f"(v{SEALED_SCHEMA_VERSION}) says it holds sealed sessions and this backend has no key provider "
                    "(encryption=); give the store's keys, or opt out on purpose with allow_plaintext=True "
                    "(dsh-sessions: -o allow_plaintext=true). Nothing was written"
                )
            return SealedRows(seqs, flags, [body for _s, _c, body in rows], [None] * len(rows), [None] * len(rows))
        if self.keys is None:
            raise SessionKeyError(
                f'session "{session_id}" is sealed, and this backend has no key provider to write to it'
            )
        key_id = check_key_id(self.keys.current_key_id())
        current = self.keys.key(key_id)
        if current is None:
            raise SessionKeyError(f'session "{session_id}": the key provider does not hold its current key "{key_id}"')
        key = check_key(key_id, current)
        bodies: list[bytes] = []
        nonces: list[bytes | None] = []
        shared = _session_part(store_id, session_id, seal_id)
        for seq, compressed, body in rows:
            nonce, sealed = seal(key, body, shared + _row_part(seq, compressed))
            bodies.append(sealed)
            nonces.append(nonce)
        return SealedRows(seqs, flags, bodies, [key_id] * len(rows), nonces)

    def open_row(self, store_id: str, session_id: str, seal_id: str | None, row: StoredRow) -> bytes:
        """The plaintext body of one stored row; typed errors for a missing key, a failed or missing seal."""
        return self.open_rows(store_id, session_id, seal_id, (row,))[0]

    def open_rows(self, store_id: str, session_id: str, seal_id: str | None, rows: Sequence[StoredRow]) -> list[bytes]:
        """The plaintext bodies of one session's stored rows, in order (:meth:`open_row` of each, same errors).

        What the rows share is done once: the session part of the associated data, and each key id's key (fetched
        and checked on its first row); a row costs its own open. The text naming a row is built only for an error.
        """
        if seal_id is None:
            for seq, _compressed, _body, key_id, nonce in rows:
                if key_id is not None or nonce is not None:
                    raise SessionPersistenceCorruptionError(
                        f'corrupt session log "{session_id}": the event at seq {seq} is sealed, but the session is not'
                    )
            return [bytes(row[2]) for row in rows]
        shared = _session_part(store_id, session_id, seal_id)
        one_key = self._open_one_key(session_id, shared, rows)
        if one_key is not None:
            return one_key
        openers: dict[str, Callable[[bytes, bytes, bytes], bytes | None]] = {}
        out: list[bytes] = []
        for seq, compressed, body, key_id, nonce in rows:
            if key_id is None or nonce is None:
                raise SessionDecryptError(
                    f'session "{session_id}": the event at seq {seq} is not sealed, but the session is: it was altered '
                    "or planted"
                )
            opener = openers.get(key_id)
            if opener is None:
                opener = openers[key_id] = sealed_opener(self._key(session_id, str(key_id), f"the event at seq {seq}"))
            opened = opener(bytes(nonce), bytes(body), shared + _row_part(int(seq), bool(compressed)))
            if opened is None:
                raise SessionDecryptError(
                    f'session "{session_id}": the event at seq {seq} fails authentication under key "{key_id}": the '
                    "key is wrong, or the row was altered or moved"
                )
            out.append(opened)
        return out

    def _open_one_key(self, session_id: str, shared: bytes, rows: Sequence[StoredRow]) -> list[bytes] | None:
        """:meth:`open_rows` of a sealed session's rows when every row is sealed under one key id (the common case):
        the key fetched once, every seal opened in one pass (:func:`open_sealed_many`), the associated data built by
        one ``pack`` per row. ``None`` when the rows are of several key ids or one is not sealed (:meth:`open_rows`
        walks them row by row, naming the first defect). Same plaintexts and errors as :meth:`open_rows`."""
        if not rows:
            return []
        key_id = rows[0][3]
        if key_id is None or any(row[3] != key_id or row[4] is None for row in rows):
            return None
        key = self._key(session_id, str(key_id), f"the event at seq {rows[0][0]}")
        pack = struct.Struct(f"<{len(shared)}sQc").pack
        seals = ((nonce, body, pack(shared, int(seq), b"z" if flag else b"n")) for seq, flag, body, _k, nonce in rows)
        opened = open_sealed_many(key, seals)
        if len(opened) < len(rows):
            raise SessionDecryptError(
                f'session "{session_id}": the event at seq {rows[len(opened)][0]} fails authentication under key '
                f'"{key_id}": the key is wrong, or the row was altered or moved'
            )
        return opened


class SealCache:
    """The ``seal_id`` of recently seen sessions (``None``: plaintext), bounded and thread-safe.

    Entries are only hints for sealing: every write checks the row's ``seal_id`` in its own statement.
    """

    def __init__(self, size: int = SEAL_CACHE_SIZE) -> None:
        self._size = size
        self._known: OrderedDict[str, str | None] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str) -> tuple[bool, str | None]:
        """``(known, seal_id)``."""
        with self._lock:
            if session_id not in self._known:
                return False, None
            self._known.move_to_end(session_id)
            return True, self._known[session_id]

    def put(self, session_id: str, seal_id: str | None) -> None:
        with self._lock:
            self._known[session_id] = seal_id
            self._known.move_to_end(session_id)
            while len(self._known) > self._size:
                self._known.popitem(last=False)

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._known.pop(session_id, None)
