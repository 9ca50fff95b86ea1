"""A sealed store stays sealed (issue 36 item 3), as the JSONL backend's marker does: once the schema version says
the store holds sealed sessions, a backend without keys refuses to write plaintext rows (typed, nothing written)
unless it opts out with ``allow_plaintext=True``; it still reads and lists without a key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from dsh.session_persistence.backend import StorageMetadata
from dsh.session_persistence.encryption import SessionKeyError
from dsh.session_persistence.events import OpaqueEvent, SessionEvent
from dsh.session_persistence.testing import meta
from dsh.session_persistence_postgres import PostgresBackend, SealedStoreError

from ._sealed import provider

pytestmark = pytest.mark.anyio


def _blob(seq: int, value: str) -> SessionEvent:
    return OpaqueEvent(type="plugin/blob", seq=seq, time=7, data={"v": value}, ignorable=True)


def _ids(dsn: str, schema: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows: list[Any] = conn.execute(f'SELECT id FROM "{schema}".dsh_sessions ORDER BY id'.encode()).fetchall()
    return [row[0] for row in rows]


async def _append(backend: PostgresBackend, session_id: str, events: list[SessionEvent], created: bool) -> None:
    await backend.append_batch(StorageMetadata(meta(session_id)), events, created)


async def test_a_keyless_backend_refuses_plaintext_rows_in_a_sealed_store(
    postgres_dsn: str, fresh_schema: Callable[[], str]
) -> None:
    schema = fresh_schema()
    plain = PostgresBackend(postgres_dsn, schema=schema)
    sealed = PostgresBackend(postgres_dsn, schema=schema, encryption=provider())
    try:
        await _append(plain, "older", [_blob(0, "a")], False)  # a plaintext store (v1) yet: allowed
        await _append(sealed, "secret", [_blob(0, "s")], False)
    finally:
        await plain.aclose()
        await sealed.aclose()
    keyless = PostgresBackend(postgres_dsn, schema=schema)
    opted = PostgresBackend(postgres_dsn, schema=schema, allow_plaintext=True)
    try:
        with pytest.raises(SealedStoreError, match="allow_plaintext=True") as info:
            await _append(keyless, "new", [_blob(0, "n")], False)
        assert isinstance(info.value, SessionKeyError)
        with pytest.raises(SealedStoreError):
            await _append(keyless, "older", [_blob(1, "b")], True)
        assert _ids(postgres_dsn, schema) == ["older", "secret"]  # nothing written
        assert sorted(h.id for h in await keyless.list()) == ["older", "secret"]  # listing needs no key
        stored = await keyless.load_stored("older")
        assert stored is not None and list(stored.events) == [_blob(0, "a")]
        await _append(opted, "older", [_blob(1, "b")], True)
        await _append(opted, "new", [_blob(0, "n")], False)
        assert _ids(postgres_dsn, schema) == ["new", "older", "secret"]
    finally:
        await keyless.aclose()
        await opted.aclose()
