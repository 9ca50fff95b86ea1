"""Encrypted sessions: the key-provider protocol, the stock providers and the typed key errors.

``JsonlBackend(root, encryption=provider)`` seals every batch of every session it creates with AES-256-GCM
(``cryptography``, the ``[encryption]`` extra); see ``docs/operations.md`` ("Encrypted sessions") for the format.
The names here are the core's shared face, :mod:`dsh.session_persistence.encryption` (one seal for every
backend), re-exported so code written against this face keeps working.

A key that is not provided raises :class:`SessionKeyError`; a batch that fails authentication (wrong key, altered
or moved bytes whose CRC was recomputed) raises :class:`SessionDecryptError`. Both name the session and the batch;
neither is ever a garbage decode or a skipped batch.
"""

from __future__ import annotations

from dsh.session_persistence.encryption import (
    KEY_BYTES,
    KEYS_ENV,
    CallbackKeyProvider,
    KeyProvider,
    SessionDecryptError,
    SessionKeyError,
    StaticKeyProvider,
    parse_keys,
)

__all__ = [
    "KEY_BYTES",
    "KEYS_ENV",
    "CallbackKeyProvider",
    "KeyProvider",
    "SessionDecryptError",
    "SessionKeyError",
    "StaticKeyProvider",
    "parse_keys",
]
