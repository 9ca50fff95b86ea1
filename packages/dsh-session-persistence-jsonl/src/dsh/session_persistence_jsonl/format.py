"""The transcript format face: write a JSONL transcript's bytes without a backend (offline tools: imports,
benchmarks, fixtures). What :class:`~dsh.session_persistence_jsonl.JsonlBackend` writes, minus the syncs and the
writer lease: a caller writing files this way is responsible for both. The format itself (log format v1, declared
batches) is documented in the repository's ``docs/operations.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

from dsh.session_persistence.backend import SessionEvent, StorageMetadata, encode_storage_lines

from ._files.layout import transcript_path
from ._format.frames import Compression
from ._format.records import encode_header_line
from ._format.v1 import encode_declared_batch, encode_declared_header

__all__ = ["Compression", "encode_event_batch", "encode_header_batch", "encode_storage_batch", "transcript_path"]


def encode_header_batch(storage: StorageMetadata, compression: Compression = "zstd") -> bytes:
    """The first declared batch of a transcript: its header line (a batch of 0 events)."""
    return encode_declared_header(compression, encode_header_line(storage))


def encode_event_batch(
    events: Sequence[SessionEvent], compression: Compression = "zstd", *, pack_chunks: bool = True
) -> bytes:
    """One declared batch holding ``events`` (contiguous seqs, the first one next after what precedes it)."""
    if not events:
        raise ValueError("a declared event batch holds at least one event")
    return encode_declared_batch(
        compression, events[0].seq, len(events), encode_storage_lines(events, pack_chunks=pack_chunks)
    )


def encode_storage_batch(first_seq: int, count: int, storage_lines: bytes, compression: Compression = "zstd") -> bytes:
    """One declared batch of ``count`` events from ``first_seq`` whose storage lines are already encoded (for
    callers that build the lines themselves, e.g. from plain-JSON events with ``pack_chunk_rows``); ``count`` is
    the number of events the lines expand to."""
    return encode_declared_batch(compression, first_seq, count, storage_lines)
