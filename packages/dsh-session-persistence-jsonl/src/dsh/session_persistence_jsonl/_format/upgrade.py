"""The first write to a v0 transcript upgrades it to v1: the whole log re-encoded as declared batches.

v0 logs (written by 0.1) have no batch declarations, so a v1 batch cannot simply be appended to them: the file
would be neither format. The upgrade builds the complete v1 file in memory (header with version 1, the
committed events as declared batches, then the new batch), proves it by decoding it back to exactly the same
header and events, and only then replaces the old file atomically (staging file, fsync, ``rename`` after
checking the old file is unchanged, directory fsync). A crash leaves either the old v0 file or the new v1 one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec
from dsh.session_persistence.backend import (
    READABLE_FORMAT_VERSIONS,
    SESSION_FORMAT_VERSION,
    SessionEvent,
    SessionHeader,
    StorageMetadata,
    encode_storage_lines,
)

from .frames import Compression
from .records import corrupt, encode_header_line
from .v1 import BatchTooLargeError, BufferSource, encode_declared_batch, encode_declared_header, walk_declared

__all__ = ["UPGRADE_BATCH_EVENTS", "current_header", "declared_log", "split_batches"]

#: Committed v0 events are re-declared in batches of at most this many events (and at most the byte cap).
UPGRADE_BATCH_EVENTS = 4096


def current_header(storage: StorageMetadata) -> StorageMetadata:
    """``storage`` with an older readable header version raised to the one this build writes.

    Versions this build cannot read (newer, or older than every readable one) are kept, so the log is refused
    on its next read exactly as if it had been written elsewhere.
    """
    meta = storage.meta
    if meta.version not in READABLE_FORMAT_VERSIONS or meta.version >= SESSION_FORMAT_VERSION:
        return storage
    upgraded: SessionHeader = msgspec.structs.replace(meta, version=SESSION_FORMAT_VERSION)
    return StorageMetadata(upgraded, storage.inherited_event_count)


def split_batches(
    events: Sequence[SessionEvent], encode: Callable[[Sequence[SessionEvent]], bytes], cap: int
) -> list[tuple[int, bytes]]:
    """``(event count, plaintext)`` groups of ``events`` in order, each within ``cap`` bytes (or one event)."""
    out: list[tuple[int, bytes]] = []
    pending = [list(events[i : i + UPGRADE_BATCH_EVENTS]) for i in range(0, len(events), UPGRADE_BATCH_EVENTS)]
    while pending:
        group = pending.pop(0)
        plaintext = encode(group)
        if len(plaintext) <= cap or len(group) == 1:
            out.append((len(group), plaintext))
            continue
        half = len(group) // 2
        pending[:0] = [group[:half], group[half:]]
    return out


def declared_log(
    storage: StorageMetadata,
    committed: Sequence[SessionEvent],
    new_batch: Sequence[SessionEvent],
    compression: Compression,
    pack_chunks: bool,
    cap: int,
    path: str,
) -> bytes:
    """The complete v1 file for ``committed`` (re-declared) plus ``new_batch`` (one batch), proven by a decode."""
    storage = current_header(storage)

    def encode(group: Sequence[SessionEvent]) -> bytes:
        return encode_storage_lines(group, pack_chunks=pack_chunks)

    parts = [encode_declared_header(compression, encode_header_line(storage))]
    groups = split_batches(committed, encode, cap)
    if new_batch:
        groups.append((len(new_batch), encode(new_batch)))
    seq = 0
    for count, plaintext in groups:
        if len(plaintext) > cap:
            raise BatchTooLargeError(
                f'cannot upgrade "{path}" to log format v1: the events from seq {seq} need {len(plaintext)} bytes '
                f"in one batch, above max_batch_bytes={cap}"
            )
        parts.append(encode_declared_batch(compression, seq, count, plaintext))
        seq += count
    content = b"".join(parts)
    check = walk_declared(BufferSource(content), compression, path, cap)
    expected = [*committed, *new_batch]
    if check.events != expected or check.header != storage.meta or check.torn is not None:
        raise corrupt(f'refusing to upgrade "{path}" to log format v1: the re-encoded log does not read back equal')
    return content
