"""The ``dsh.session_persistence`` names this backend is built on: the backend protocol, events, header, errors.

Everything the backend needs from the core comes through this one module, so the package shows exactly which
surface a third-party backend depends on: the value types of the backend protocol, the event codec, the header
struct, the typed errors and the hook marker.
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
    SessionLockedError,
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
    check_contiguous,
    decode_event_line,
    encode_event,
    header_to_builtins,
    hookimpl,
)

__all__ = [
    "IncompleteInheritedPrefixError",
    "SeqMismatchError",
    "SessionAlreadyExistsError",
    "SessionEvent",
    "SessionFormatUnsupportedError",
    "SessionHeader",
    "SessionLocation",
    "SessionLockedError",
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
    "check_contiguous",
    "decode_event_line",
    "encode_event",
    "header_to_builtins",
    "hookimpl",
]
