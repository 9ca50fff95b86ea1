"""PostgresBackend beyond the conformance kit: schema versioning, compression, database-enforced seqs, damage."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import anyio
import psycopg
import pytest
from dsh.session_persistence.backend import (
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionFormatUnsupportedError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    StorageMetadata,
)
from dsh.session_persistence.events import OpaqueEvent, SessionEvent
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import NAME, SCHEMA_VERSION, PostgresBackend, SchemaVersionError
from dsh.session_persistence_postgres._codec import EventCodec
from dsh.session_persistence_postgres._plugin import dsh_session_backends

pytestmark = pytest.mark.anyio


@pytest.fixture
def schema(fresh_schema: Callable[[], str]) -> str:
    return fresh_schema()


def _blob(seq: int, value: Any) -> SessionEvent:
    return OpaqueEvent(type="plugin/blob", seq=seq, time=7, data={"v": value}, ignorable=True)


def _sql(dsn: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query.encode(), params)
        return cur.fetchall() if cur.description is not None else []


async def test_schema_is_created_and_versioned(postgres_dsn: str, schema: str) -> None:
    backend = PostgresBackend(postgres_dsn, schema=schema)
    try:
        assert await backend.list() == []
    finally:
        await backend.aclose()
    [(version, store_id)] = _sql(postgres_dsn, f'SELECT version, store_id FROM "{schema}".dsh_schema')
    assert version == SCHEMA_VERSION == 1
    assert len(store_id) == 32


async def test_newer_schema_is_refused(postgres_dsn: str, schema: str) -> None:
    backend = PostgresBackend(postgres_dsn, schema=schema)
    await backend.append_batch(StorageMetadata(meta("kept")), one_turn_log(), False)
    await backend.aclose()
    _sql(postgres_dsn, f'UPDATE "{schema}".dsh_schema SET version = 3')
    newer = PostgresBackend(postgres_dsn, schema=schema)
    try:
        with pytest.raises(SchemaVersionError, match="schema v3, but this backend reads only v1 and v2") as info:
            await newer.load_stored("kept")
    finally:
        await newer.aclose()
    assert isinstance(info.value, SessionFormatUnsupportedError)
    assert info.value.version == 3
    assert "upgrade" in str(info.value)
    # Nothing was touched: the tables and the session are still there.
    assert _sql(postgres_dsn, f'SELECT count(*) FROM "{schema}".dsh_events') == [(6,)]


async def test_concurrent_first_use_creates_the_schema_once(postgres_dsn: str, schema: str) -> None:
    backends = [PostgresBackend(postgres_dsn, schema=schema) for _ in range(4)]
    revisions: list[str | None] = []
    try:
        async with anyio.create_task_group() as tg:
            for backend in backends:
                tg.start_soon(backend.list)
        await backends[0].append_batch(StorageMetadata(meta("one")), one_turn_log(), False)
        for backend in backends:
            revisions.append(await backend.read_stored_revision("one"))
    finally:
        for backend in backends:
            await backend.aclose()
    assert len(set(revisions)) == 1 and revisions[0] is not None
    assert _sql(postgres_dsn, f'SELECT count(*) FROM "{schema}".dsh_schema') == [(1,)]


async def test_large_events_are_compressed_when_it_pays(postgres_dsn: str, schema: str) -> None:
    events = [_blob(0, "small"), _blob(1, "compressible " * 1000), _blob(2, "x" * 100)]
    backend = PostgresBackend(postgres_dsn, schema=schema)
    try:
        await backend.append_batch(StorageMetadata(meta("zstd")), events, False)
        stored = await backend.load_stored("zstd")
    finally:
        await backend.aclose()
    assert stored is not None and stored.events == events
    rows = _sql(
        postgres_dsn,
        f'SELECT seq, compressed, length(body) FROM "{schema}".dsh_events WHERE session_id = %s ORDER BY seq',
        ("zstd",),
    )
    assert [(seq, compressed) for seq, compressed, _n in rows] == [(0, False), (1, True), (2, False)]
    assert rows[1][2] < 4096


def test_codec_keeps_json_when_compression_does_not_pay() -> None:
    codec = EventCodec(threshold=1)
    seq, compressed, body = codec.encode(_blob(0, "a"))  # a tiny event: a zstd frame would be larger
    assert (seq, compressed) == (0, False)
    assert codec.decode(compressed, body) == _blob(0, "a")
    with pytest.raises(ValueError, match="positive"):
        EventCodec(threshold=0)


async def test_database_refuses_gaps_restated_seqs_and_duplicate_ids(postgres_dsn: str, schema: str) -> None:
    storage = StorageMetadata(meta("strict"))
    backend = PostgresBackend(postgres_dsn, schema=schema)
    try:
        await backend.append_batch(storage, one_turn_log(), False)
        r0 = await backend.read_stored_revision("strict")
        with pytest.raises(SeqMismatchError, match='append seq mismatch for "strict": expected 6 at index 0, got 3'):
            await backend.append_batch(storage, simple_turn(3, 2), True)
        with pytest.raises(SeqMismatchError, match="expected 6 at index 0, got 9"):
            await backend.append_batch(storage, simple_turn(9, 2), True)
        with pytest.raises(SessionAlreadyExistsError):
            await backend.append_batch(storage, one_turn_log(), False)
        with pytest.raises(SessionAlreadyExistsError):
            await backend.materialize_header(storage)
        with pytest.raises(SessionNotFoundError):
            await backend.append_batch(StorageMetadata(meta("absent")), simple_turn(0, 1), True)
        assert await backend.read_stored_revision("strict") == r0
        stored = await backend.load_stored("strict")
        assert stored is not None and stored.events == one_turn_log() and stored.torn_marker is None
    finally:
        await backend.aclose()
    # The primary key is the last line of defence even against a writer that bypasses the backend.
    with pytest.raises(psycopg.errors.UniqueViolation):
        _sql(postgres_dsn, f"INSERT INTO \"{schema}\".dsh_events VALUES ('strict', 0, false, '\\x7b7d')")


async def test_seek_read_and_rewrite(postgres_dsn: str, schema: str) -> None:
    storage = StorageMetadata(meta("seek"))
    log = one_turn_log() + simple_turn(6, 2)
    backend = PostgresBackend(postgres_dsn, schema=schema)
    try:
        await backend.append_batch(storage, log, False)
        suffix = await backend.load_stored_from("seek", 6)
        assert suffix is not None and suffix.events == log[6:]
        beyond = await backend.load_stored_from("seek", 50)
        assert beyond is not None and beyond.events == []
        assert await backend.load_stored_from("absent", 0) is None
        r0 = await backend.read_stored_revision("seek")
        await backend.rewrite(storage, log[:6])
        assert await backend.read_stored_revision("seek") != r0
        stored = await backend.load_stored("seek")
        assert stored is not None and stored.events == log[:6]
        await backend.append_batch(storage, simple_turn(6, 3, "again"), True)
        with pytest.raises(SessionNotFoundError):
            await backend.rewrite(StorageMetadata(meta("absent")), [])
        assert [h.id for h in await backend.list()] == ["seek"]
        assert backend.locate(meta("seek")) is None
    finally:
        await backend.aclose()


async def test_client_bound_text_round_trips_verbatim(postgres_dsn: str, schema: str) -> None:
    """Parameters are bound on the client (one message per primitive): placeholder-like text, quotes, backslashes,
    semicolons and non-ASCII in an id, a header and event payloads come back byte for byte."""
    tricky = "it's 100%s %(id)s 50%% \\x00 \\'; COMMIT; -- \u00e9\u4e2d\U0001f600"
    session_id = f"s%s;'{tricky[:20]}"
    storage = StorageMetadata(meta(session_id, cwd=f"/work/{tricky}"))
    log = [_blob(0, {"text": tricky, "nested": [tricky, {"k": tricky}]}), _blob(1, tricky * 50)]
    backend = PostgresBackend(postgres_dsn, schema=schema)
    try:
        await backend.append_batch(storage, log, False)
        await backend.append_batch(storage, [_blob(2, tricky)], True)
        stored = await backend.load_stored(session_id)
        assert stored is not None
        assert stored.meta == storage.meta
        assert list(stored.events) == [*log, _blob(2, tricky)]
        assert [h.cwd for h in await backend.list()] == [f"/work/{tricky}"]
    finally:
        await backend.aclose()


async def test_damaged_rows_are_corruption(postgres_dsn: str, schema: str) -> None:
    backend = PostgresBackend(postgres_dsn, schema=schema)
    try:
        await backend.append_batch(StorageMetadata(meta("gap")), one_turn_log(), False)
        await backend.append_batch(StorageMetadata(meta("bits")), [_blob(0, "compressible " * 1000)], False)
        _sql(postgres_dsn, f"DELETE FROM \"{schema}\".dsh_events WHERE session_id = 'gap' AND seq = 2")
        with pytest.raises(SessionPersistenceCorruptionError, match="seq gap in committed rows"):
            await backend.load_stored("gap")
        _sql(
            postgres_dsn,
            f"UPDATE \"{schema}\".dsh_events SET body = overlay(body placing '\\xdeadbeef' from 20) WHERE session_id = 'bits'",
        )
        with pytest.raises(SessionPersistenceCorruptionError, match='stored session "bits" failed validation') as info:
            await backend.load_stored("bits")
        assert info.value.__cause__ is not None
    finally:
        await backend.aclose()


def test_plugin_registers_the_backend() -> None:
    assert NAME == "postgres"
    assert dsh_session_backends() == [PostgresBackend]
    found = [ep for ep in entry_points(group="dsh.session") if ep.name == "postgres"]
    assert [ep.value for ep in found] == ["dsh.session_persistence_postgres._plugin"]


async def test_a_damaged_header_leaves_only_its_session_out_of_list(postgres_dsn: str, schema: str) -> None:
    backend = PostgresBackend(postgres_dsn, schema=schema)
    try:
        await backend.append_batch(StorageMetadata(meta("good")), one_turn_log(), False)
        await backend.append_batch(StorageMetadata(meta("bad")), one_turn_log(), False)
        _sql(postgres_dsn, f"UPDATE \"{schema}\".dsh_sessions SET header = '{{\"id\": 7}}' WHERE id = 'bad'")
        assert [h.id for h in await backend.list()] == ["good"]
        with pytest.raises(SessionPersistenceCorruptionError, match='stored session "bad" failed validation'):
            await backend.load_stored("bad")
    finally:
        await backend.aclose()
