"""Test helpers for the two on-disk formats: a v0 writer (what 0.1 wrote) and v1 (declared) file surgery.

The v0 writer is written from the 0.1 format, not from the backend: header line (version 0) and one zstd frame
per batch (``zstd``), or header line and event lines (``none``). It was checked byte for byte against files
written by the 0.1.0 code (commit 0b120c9).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
from dsh.session_persistence.backend import SessionEvent, StorageMetadata, encode_storage_lines
from dsh.session_persistence_jsonl._files.layout import transcript_path
from dsh.session_persistence_jsonl._format.frames import compress_frame
from dsh.session_persistence_jsonl._format.records import encode_header_line
from dsh.session_persistence_jsonl._format.v1 import BufferSource, encode_declared_batch, walk_declared
from dsh.session_persistence_jsonl._format.v1_declarations import (
    ZSTD_DECLARATION_SIZE,
    parse_line_declaration,
    parse_zstd_declaration,
)


def v0_bytes(storage: StorageMetadata, batches: Sequence[Sequence[SessionEvent]], compression: str) -> bytes:
    """A v0 transcript: the header with version 0, then one frame (or the lines) per batch."""
    v0 = StorageMetadata(msgspec.structs.replace(storage.meta, version=0), storage.inherited_event_count)
    header = encode_header_line(v0)
    bodies = [encode_storage_lines(batch, pack_chunks=True) for batch in batches if batch]
    if compression == "zstd":
        return compress_frame(header) + b"".join(compress_frame(b) for b in bodies)
    return header + b"".join(bodies)


def write_v0(root: Path, storage: StorageMetadata, batches: Sequence[Sequence[SessionEvent]], compression: str) -> Path:
    """Plant a v0 transcript where 0.1 would have put it (directories 0700, file 0600)."""
    cwd = storage.meta.cwd if isinstance(storage.meta.cwd, str) else None
    path = Path(transcript_path(str(root), cwd, storage.meta.id, compression))  # type: ignore[arg-type]
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_bytes(v0_bytes(storage, batches, compression))
    os.chmod(path, 0o600)
    return path


@dataclass(frozen=True)
class Pair:
    """One declared pair in a v1 file: declaration at ``start``, data ``[data_start, end)``."""

    start: int
    data_start: int
    end: int
    first_seq: int
    count: int


def pairs(data: bytes, compression: str) -> list[Pair]:
    """Every complete declared pair of a v1 file (header first), by walking the declarations."""
    out: list[Pair] = []
    pos = 0
    while pos < len(data):
        if compression == "zstd":
            if pos + ZSTD_DECLARATION_SIZE > len(data):
                break
            decl = parse_zstd_declaration(data[pos : pos + ZSTD_DECLARATION_SIZE])
            data_start = pos + ZSTD_DECLARATION_SIZE
        else:
            lf = data.find(b"\n", pos)
            if lf < 0:
                break
            decl = parse_line_declaration(data[pos:lf])
            data_start = lf + 1
        end = data_start + decl.length
        if end > len(data):
            break
        out.append(Pair(pos, data_start, end, decl.first_seq, decl.count))
        pos = end
    return out


def plaintext(data: bytes, compression: str) -> bytes:
    """The logical JSONL text of a v1 file (header line and event lines, declarations left out)."""
    parts: list[bytes] = []
    walk_declared(BufferSource(data), compression, "<test>", 1 << 28, plaintexts=parts)  # type: ignore[arg-type]
    return b"".join(parts)


def rewrite_plaintexts(path: Path, compression: str, edit: Callable[[int, bytes], bytes]) -> None:
    """Re-encode a v1 file with each pair's plaintext passed through ``edit(index, plaintext)`` (valid CRCs)."""
    data = path.read_bytes()
    texts: list[bytes] = []
    walk_declared(BufferSource(data), compression, str(path), 1 << 28, plaintexts=texts)  # type: ignore[arg-type]
    found = pairs(data, compression)
    out = b"".join(
        encode_declared_batch(compression, p.first_seq, p.count, edit(i, text))  # type: ignore[arg-type]
        for i, (p, text) in enumerate(zip(found, texts, strict=True))
    )
    path.write_bytes(out)


def declared(compression: str, first_seq: int, count: int, plaintext: bytes) -> bytes:
    """One declared pair, as the backend writes it."""
    return encode_declared_batch(compression, first_seq, count, plaintext)  # type: ignore[arg-type]
