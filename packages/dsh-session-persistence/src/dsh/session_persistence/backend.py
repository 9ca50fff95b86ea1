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
    StoredPrefix,
    StoredSuffix,
    SupportsAclose,
    SupportsLocate,
    SupportsMaterializeHeader,
    SupportsRawArtifacts,
    SupportsRewrite,
    SupportsSeek,
    SupportsWriterLease,
    WriterLease,
)
from ._chunk_rows import (
    CHUNK_ROW_TAGS,
    ChunkRowError,
    expand_chunk_row,
    expand_chunk_rows,
    pack_chunk_rows,
    row_member_count,
)
from ._contiguity import check_contiguous, first_seq_gap
from ._errors import (
    IncompleteInheritedPrefixError,
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionFormatUnsupportedError,
    SessionLockedError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionStorageError,
    SessionWriteInDoubtError,
    UnsupportedOperationError,
)
from ._event_codec import (
    check_message_shape,
    check_source_event_seqs,
    decode_event,
    decode_event_line,
    encode_event,
    event_to_builtins,
    first_refused_unknown,
)
from ._events import EVENT_TYPES, SessionEvent
from ._format import check_format_version, refuse_unknown_events
from ._header import (
    READABLE_FORMAT_VERSIONS,
    SESSION_FORMAT_VERSION,
    SessionHeader,
    header_from_builtins,
    header_from_stored,
    header_to_builtins,
)
from ._host import hookimpl
from ._json import MAX_SAFE_INTEGER, is_safe_int
from ._storage_lines import StorageLineError, decode_storage_line, decode_storage_lines, encode_storage_lines

__all__ = [
    "CHUNK_ROW_TAGS",
    "ChunkRowError",
    "EVENT_TYPES",
    "IncompleteInheritedPrefixError",
    "MAX_SAFE_INTEGER",
    "RawArtifact",
    "READABLE_FORMAT_VERSIONS",
    "SESSION_FORMAT_VERSION",
    "SeqMismatchError",
    "SessionAlreadyExistsError",
    "SessionBackend",
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
    "StorageLineError",
    "StorageMetadata",
    "StoredPrefix",
    "StoredSuffix",
    "SupportsAclose",
    "SupportsLocate",
    "SupportsMaterializeHeader",
    "SupportsRawArtifacts",
    "SupportsRewrite",
    "SupportsSeek",
    "SupportsWriterLease",
    "UnsupportedOperationError",
    "check_contiguous",
    "WriterLease",
    "check_format_version",
    "check_message_shape",
    "check_source_event_seqs",
    "decode_event",
    "decode_event_line",
    "decode_storage_line",
    "decode_storage_lines",
    "encode_event",
    "encode_storage_lines",
    "event_to_builtins",
    "expand_chunk_row",
    "expand_chunk_rows",
    "first_refused_unknown",
    "first_seq_gap",
    "header_from_builtins",
    "header_from_stored",
    "header_to_builtins",
    "hookimpl",
    "is_safe_int",
    "pack_chunk_rows",
    "refuse_unknown_events",
    "row_member_count",
]
