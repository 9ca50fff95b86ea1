"""The ``dsh.session_persistence`` names this backend is built on: the backend protocol, events, header, errors.

Everything the backend needs from the core comes through this one module and only from the public backend face
(``dsh.session_persistence.backend``) and ``hookspecs``, so the package shows exactly which surface a
third-party backend depends on.
"""

from __future__ import annotations

from dsh.session_persistence.backend import (
    IncompleteInheritedPrefixError,
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionEvent,
    SessionFormatUnsupportedError,
    SessionHeader,
    SessionLocation,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionSnapshot,
    SessionStorageError,
    SessionWriteInDoubtError,
    StorageMetadata,
    StoredPrefix,
    StoredSuffix,
    UnsupportedOperationError,
    decode_event_line,
    encode_event,
    header_to_builtins,
)
from dsh.session_persistence.hookspecs import PROJECT_NAME

__all__ = [
    "PROJECT_NAME",
    "IncompleteInheritedPrefixError",
    "SeqMismatchError",
    "SessionAlreadyExistsError",
    "SessionEvent",
    "SessionFormatUnsupportedError",
    "SessionHeader",
    "SessionLocation",
    "SessionNotFoundError",
    "SessionPersistenceCorruptionError",
    "SessionPersistenceError",
    "SessionSnapshot",
    "SessionStorageError",
    "SessionWriteInDoubtError",
    "StorageMetadata",
    "StoredPrefix",
    "StoredSuffix",
    "UnsupportedOperationError",
    "decode_event_line",
    "encode_event",
    "header_to_builtins",
]
