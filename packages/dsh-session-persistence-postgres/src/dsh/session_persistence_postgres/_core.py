"""The ``dsh.session_persistence`` names this backend is built on: the backend protocol, events, header, errors.

Everything the backend needs from the core comes through this one module, so the package shows exactly which
surface a third-party backend depends on: the value types of the backend protocol, the event codec, the header
struct, the typed errors and the hook marker's project name.
"""

from __future__ import annotations

from dsh.session_persistence._backend import (
    SessionLocation,
    SessionSnapshot,
    StorageMetadata,
    StoredPrefix,
    StoredSuffix,
)
from dsh.session_persistence._errors import (
    IncompleteInheritedPrefixError,
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionFormatUnsupportedError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    UnsupportedOperationError,
)
from dsh.session_persistence._events import SessionEvent, decode_event_line, encode_event
from dsh.session_persistence._header import SessionHeader, header_to_builtins
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
    "SessionSnapshot",
    "StorageMetadata",
    "StoredPrefix",
    "StoredSuffix",
    "UnsupportedOperationError",
    "decode_event_line",
    "encode_event",
    "header_to_builtins",
]
