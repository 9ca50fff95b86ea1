"""The transcript format face: bytes written offline with dsh.session_persistence_jsonl.format load through the
backend exactly as if the backend had written them (both encodings, packed and unpacked chunk rows)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from dsh.session_persistence.backend import StorageMetadata, encode_storage_lines
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl.format import (
    encode_event_batch,
    encode_header_batch,
    encode_storage_batch,
    transcript_path,
)

pytestmark = pytest.mark.anyio


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)


@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.parametrize("pack_chunks", [True, False])
async def test_an_offline_transcript_loads_as_written(tmp_path: Path, compression: str, pack_chunks: bool) -> None:
    header = meta("offline", cwd="/work")
    first = one_turn_log()
    second = simple_turn(len(first), 2)
    path = transcript_path(str(tmp_path), header.cwd, header.id, compression)  # type: ignore[arg-type]
    os.makedirs(os.path.dirname(path))
    lines = encode_storage_lines(second, pack_chunks=pack_chunks)
    _write(
        path,
        encode_header_batch(StorageMetadata(header, 0), compression)  # type: ignore[arg-type]
        + encode_event_batch(first, compression, pack_chunks=pack_chunks)  # type: ignore[arg-type]
        + encode_storage_batch(second[0].seq, len(second), lines, compression),  # type: ignore[arg-type]
    )
    backend = JsonlBackend(str(tmp_path), compression=compression)  # type: ignore[arg-type]
    try:
        stored = await backend.load_stored("offline")
    finally:
        await backend.aclose()
    assert stored is not None
    assert list(stored.events) == first + second
    assert (stored.meta.id, stored.meta.cwd, stored.meta.created_at) == (header.id, header.cwd, header.created_at)


def test_an_empty_event_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one event"):
        encode_event_batch([])
