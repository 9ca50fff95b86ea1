"""Network faults between the backend and a real server, injected by a loopback proxy (``_proxy.py``).

A lost ``COMMIT`` reply, a black-holed connection and an unreachable server during the read-back: the backend
settles each by reading back (never a blind re-append, never a session wedged on its own committed write), or
reports it typed. Also: one round trip per append.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import psycopg
import pytest
from dsh.session_persistence import PersistenceCoordinator
from dsh.session_persistence.backend import SessionStorageError, SessionWriteInDoubtError, StorageMetadata
from dsh.session_persistence.testing import ConformanceRig, meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import PostgresBackend

from ._proxy import PgProxy
from ._sealed import sealed_factory

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True, params=["plain", "sealed"])
def sealing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: on a plaintext backend and on a sealed one (this module's ``PostgresBackend`` name bound
    to the real class with ``encryption=`` given)."""
    if request.param == "sealed":
        monkeypatch.setitem(globals(), "PostgresBackend", sealed_factory())
    return str(request.param)


@pytest.fixture
def schema(fresh_schema: Callable[[], str]) -> str:
    return fresh_schema()


async def _stored(dsn: str, schema: str, session_id: str) -> list[object] | None:
    backend = PostgresBackend(dsn, schema=schema)
    try:
        stored = await backend.load_stored(session_id)
    finally:
        await backend.aclose()
    return None if stored is None else list(stored.events)


async def test_lost_commit_reply_of_a_later_batch_is_settled_by_reading_back(
    proxy: PgProxy, proxy_dsn: str, postgres_dsn: str, schema: str
) -> None:
    storage = StorageMetadata(meta("lost"))
    backend = PostgresBackend(proxy_dsn, schema=schema)
    try:
        await backend.append_batch(storage, one_turn_log(), False)
        proxy.drop_commit_reply()
        # Committed on the server, reply lost: the call must still succeed, exactly once.
        await backend.append_batch(storage, simple_turn(6, 2), True)
        assert proxy.commit_replies_dropped == 1
        # Not wedged: the next batch goes on at the next seq.
        await backend.append_batch(storage, simple_turn(9, 3), True)
    finally:
        await backend.aclose()
    assert await _stored(postgres_dsn, schema, "lost") == one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)


async def test_lost_commit_reply_of_the_first_batch_is_settled_by_reading_back(
    proxy: PgProxy, proxy_dsn: str, postgres_dsn: str, schema: str
) -> None:
    storage = StorageMetadata(meta("first"))
    backend = PostgresBackend(proxy_dsn, schema=schema)
    try:
        await backend.list()  # the schema exists before the fault is armed
        proxy.drop_commit_reply()
        await backend.append_batch(storage, one_turn_log(), False)
        assert proxy.commit_replies_dropped == 1
        await backend.append_batch(storage, simple_turn(6, 2), True)
    finally:
        await backend.aclose()
    assert await _stored(postgres_dsn, schema, "first") == one_turn_log() + simple_turn(6, 2)


async def test_lost_reply_that_cannot_be_read_back_is_reported_in_doubt(
    proxy: PgProxy, proxy_dsn: str, postgres_dsn: str, schema: str
) -> None:
    storage = StorageMetadata(meta("doubt"))
    backend = PostgresBackend(proxy_dsn, schema=schema, retry_timeout=0.5, min_size=1, max_size=1)
    try:
        await backend.append_batch(storage, one_turn_log(), False)
        proxy.drop_commit_reply()
        proxy.refuse_new = True  # the read-back cannot reach the server
        with pytest.raises(SessionWriteInDoubtError, match="read the session back before writing again") as info:
            await backend.append_batch(storage, simple_turn(6, 2), True)
        assert isinstance(info.value, SessionStorageError)
        assert isinstance(info.value.__cause__, psycopg.OperationalError)
        proxy.refuse_new = False
        # Once the server is reachable the same instance settles it: the batch had committed.
        stored = await backend.load_stored("doubt")
        assert stored is not None and list(stored.events) == one_turn_log() + simple_turn(6, 2)
    finally:
        await backend.aclose()


async def test_black_holed_connection_is_dropped_at_the_client_deadline_and_settled(
    proxy: PgProxy, proxy_dsn: str, postgres_dsn: str, schema: str
) -> None:
    storage = StorageMetadata(meta("hole"))
    backend = PostgresBackend(proxy_dsn, schema=schema, client_timeout=1.0, min_size=1, max_size=1)
    try:
        await backend.append_batch(storage, one_turn_log(), False)
        assert proxy.blackhole() >= 1  # the pooled connection now leads nowhere
        with anyio.fail_after(60):  # a safety net for a hang, not a timing assertion
            await backend.append_batch(storage, simple_turn(6, 2), True)
            assert proxy.blackhole() >= 1
            stored = await backend.load_stored("hole")
    finally:
        await backend.aclose()
    assert stored is not None and list(stored.events) == one_turn_log() + simple_turn(6, 2)


async def test_an_append_is_one_round_trip(proxy: PgProxy, proxy_dsn: str, schema: str) -> None:
    storage = StorageMetadata(meta("rt"))
    backend = PostgresBackend(proxy_dsn, schema=schema, min_size=1, max_size=1)
    try:
        await backend.append_batch(storage, one_turn_log(), False)
        await backend.append_batch(storage, simple_turn(6, 1), True)  # warm: the pooled connection exists
        for index in range(3):
            before = proxy.client_turns
            await backend.append_batch(storage, simple_turn(9 + 3 * index, 2 + index), True)
            assert proxy.client_turns - before == 1
        before = proxy.client_turns
        await backend.load_stored("rt")
        assert proxy.client_turns - before == 1
    finally:
        await backend.aclose()


async def _no_plant(*args: object, **kwargs: object) -> None:
    raise AssertionError("not used")


async def test_lost_commit_reply_end_to_end_through_the_coordinator(
    proxy: PgProxy, proxy_dsn: str, postgres_dsn: str, schema: str
) -> None:
    rig = ConformanceRig(lambda: PostgresBackend(proxy_dsn, schema=schema), _no_plant)
    async with rig.open() as p:
        assert isinstance(p.persistence, PersistenceCoordinator)
        await p.persistence.create(meta("e2e"))
        await p.persistence.append("e2e", one_turn_log())
        proxy.drop_commit_reply()
        await p.persistence.append("e2e", simple_turn(6, 2))
        assert proxy.commit_replies_dropped == 1
        await p.persistence.append("e2e", simple_turn(9, 3))
        loaded = await p.persistence.load("e2e")
        assert list(loaded.events) == one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)
        session = p.store.create("e2e-live", meta=meta("e2e-live"))
        proxy.drop_commit_reply()
        for event in one_turn_log():
            session.append_event(event)
        assert await p.store.flush(session) is True
        assert proxy.commit_replies_dropped == 2
    # Disposal drained cleanly; a restarted instance reads exactly what was acknowledged.
    assert await _stored(postgres_dsn, schema, "e2e") == one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)
    assert await _stored(postgres_dsn, schema, "e2e-live") == one_turn_log()
