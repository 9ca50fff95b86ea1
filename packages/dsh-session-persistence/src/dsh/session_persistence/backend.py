"""The backend author face: the storage protocol, its value types, the one wire codec and the storage errors.

A backend implements small durable primitives (:class:`SessionBackend`); the
:class:`~dsh.session_persistence.PersistenceCoordinator` owns serialization, cursors, lazy materialization,
validation and crash repair on top of them. Everything a backend needs to encode, decode and check what it
stores is exported here, so a third-party backend is built on the same public names as the JSONL and PostgreSQL
backends. Import these names from this module; the modules whose names start with ``_`` are private.
"""

from __future__ import annotations

from ._backend import (
    RawArtifact,
    SessionBackend,
    SessionLocation,
    SessionSnapshot,
    StorageMetadata,
    StoredArtifact,
    StoredPrefix,
    StoredSuffix,
    SupportsArtifactScan,
    SupportsCompact,
    SupportsDelete,
    SupportsListPage,
)
from ._chunk_rows import (
    CHUNK_ROW_TAGS,
    ChunkRowError,
    expand_chunk_row,
    expand_chunk_rows,
    pack_chunk_rows,
    row_member_count,
)
from ._errors import (
    IncompleteInheritedPrefixError,
    LifecycleArgumentError,
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionChangedError,
    SessionCursorError,
    SessionFormatUnsupportedError,
    SessionLiveError,
    SessionLockedError,
    SessionNeedsRepairError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionStorageError,
    SessionWriteInDoubtError,
    UnsupportedOperationError,
)
from ._events import (
    EVENT_TYPES,
    SessionEvent,
    decode_event,
    decode_event_line,
    encode_event,
    event_to_builtins,
    first_refused_unknown,
)
from ._format import check_format_version, refuse_unknown_events
from ._header import SESSION_FORMAT_VERSION, SessionHeader, header_from_builtins, header_to_builtins
from ._host import hookimpl
from ._json import MAX_SAFE_INTEGER, is_safe_int
from ._listing import (
    LIST_ORDERS,
    ListOrder,
    ListPosition,
    ListQuery,
    SessionListing,
    SessionPage,
    decode_list_cursor,
    encode_list_cursor,
    page_of,
)

__all__ = [
    "CHUNK_ROW_TAGS",
    "EVENT_TYPES",
    "LIST_ORDERS",
    "MAX_SAFE_INTEGER",
    "SESSION_FORMAT_VERSION",
    "ChunkRowError",
    "IncompleteInheritedPrefixError",
    "LifecycleArgumentError",
    "ListOrder",
    "ListPosition",
    "ListQuery",
    "RawArtifact",
    "SeqMismatchError",
    "SessionAlreadyExistsError",
    "SessionBackend",
    "SessionChangedError",
    "SessionCursorError",
    "SessionEvent",
    "SessionFormatUnsupportedError",
    "SessionHeader",
    "SessionListing",
    "SessionLiveError",
    "SessionLocation",
    "SessionLockedError",
    "SessionNeedsRepairError",
    "SessionNotFoundError",
    "SessionPage",
    "SessionPersistenceCorruptionError",
    "SessionPersistenceError",
    "SessionSnapshot",
    "SessionStorageError",
    "SessionWriteInDoubtError",
    "StorageMetadata",
    "StoredArtifact",
    "StoredPrefix",
    "StoredSuffix",
    "SupportsArtifactScan",
    "SupportsCompact",
    "SupportsDelete",
    "SupportsListPage",
    "UnsupportedOperationError",
    "check_format_version",
    "decode_event",
    "decode_event_line",
    "decode_list_cursor",
    "encode_event",
    "encode_list_cursor",
    "event_to_builtins",
    "expand_chunk_row",
    "expand_chunk_rows",
    "first_refused_unknown",
    "header_from_builtins",
    "header_to_builtins",
    "hookimpl",
    "is_safe_int",
    "pack_chunk_rows",
    "page_of",
    "refuse_unknown_events",
    "row_member_count",
]
