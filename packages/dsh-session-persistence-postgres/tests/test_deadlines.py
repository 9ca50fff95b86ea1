"""A caller's deadline (``anyio.fail_after``) bounds every call: the caller leaves at its deadline, the write it
abandoned goes on (bounded by the backend's own timeouts) and is settled before the session's next write.

Each test holds a fault that never ends by itself (a row lock held by the test, a black-holed network): a call
that waited for its thread would hang there, so the outer ``fail_after`` is a safety net for that hang, never a
timing assertion. That the caller left *at its deadline* is asserted by its outcome: ``TimeoutError`` from its
own scope while the fault is still held.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.to_thread
import psycopg
import pytest
from dsh.session_persistence import PersistenceCoordinator
from dsh.session_persistence.backend import SessionStorageError, StorageMetadata
from dsh.session_persistence.testing import ConformanceRig, meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import PostgresBackend

from ._proxy import PgProxy

pytestmark = pytest.mark.anyio

SAFETY_NET = 120  # seconds: a hang fails the test instead of blocking the run; never reached when it passes


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


async def _lock_row(dsn: str, schema: str, session_id: str) -> psycopg.Connection[object]:
    holder: psycopg.Connection[object] = await anyio.to_thread.run_sync(psycopg.connect, dsn)  # type: ignore[arg-type]
    query = f'SELECT 1 FROM "{schema}".dsh_sessions WHERE id = %s FOR UPDATE'.encode()
    await anyio.to_thread.run_sync(holder.execute, query, (session_id,))
    return holder


async def test_a_deadline_releases_the_caller_and_the_abandoned_write_is_settled_first(
    postgres_dsn: str, schema: str
) -> None:
    """An append waiting on a row lock: the caller leaves at its deadline; the append goes on and commits when
    the lock is released; the caller's retry of the same batch waits for it and finds it stored (read back), so
    it is acknowledged once, not refused as a seq mismatch nor stored twice."""
    storage = StorageMetadata(meta("dl"))
    backend = PostgresBackend(postgres_dsn, schema=schema, lock_timeout=None)
    try:
        await backend.append_batch(storage, one_turn_log(), False)
        holder = await _lock_row(postgres_dsn, schema, "dl")
        try:
            with anyio.fail_after(SAFETY_NET):
                with pytest.raises(TimeoutError):
                    with anyio.fail_after(0.5):
                        await backend.append_batch(storage, simple_turn(6, 2), True)
                async with anyio.create_task_group() as tg:
                    # The retry is sent while the lock is still held: it must wait for the abandoned write.
                    tg.start_soon(backend.append_batch, storage, simple_turn(6, 2), True)
                    await anyio.sleep(0.2)
                    await anyio.to_thread.run_sync(holder.rollback)
                await backend.append_batch(storage, simple_turn(9, 3), True)
        finally:
            await anyio.to_thread.run_sync(holder.close)
    finally:
        await backend.aclose()
    assert await _stored(postgres_dsn, schema, "dl") == one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)


async def test_a_deadline_bounds_calls_on_a_black_holed_network(
    proxy: PgProxy, proxy_dsn: str, postgres_dsn: str, schema: str
) -> None:
    """Every connection black-holed, new ones too (connects hang): an append and a load both end at the caller's
    deadline, though each reconnect could wait libpq's connect_timeout; once the network is back the abandoned
    append is settled before the next write and the log holds each batch once."""
    storage = StorageMetadata(meta("bh"))
    backend = PostgresBackend(
        proxy_dsn, schema=schema, client_timeout=1, retry_timeout=1, statement_timeout=0.5, min_size=1, max_size=1
    )
    try:
        await backend.append_batch(storage, one_turn_log(), False)
        proxy.blackhole_new = True
        assert proxy.blackhole() >= 1
        with anyio.fail_after(SAFETY_NET):
            with pytest.raises(TimeoutError):
                with anyio.fail_after(2):
                    await backend.append_batch(storage, simple_turn(6, 2), True)
            with pytest.raises(TimeoutError):
                with anyio.fail_after(2):
                    await backend.load_stored("bh")
            proxy.blackhole_new = False
            proxy.close_all()
            # The abandoned append either committed or not; the retry of the same batch is acknowledged once.
            await backend.append_batch(storage, simple_turn(6, 2), True)
            await backend.append_batch(storage, simple_turn(9, 3), True)
    finally:
        proxy.blackhole_new = False
        proxy.close_all()
        await backend.aclose()
    assert await _stored(postgres_dsn, schema, "bh") == one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)


async def test_a_deadline_releases_a_caller_of_the_coordinator(postgres_dsn: str, schema: str) -> None:
    """Through the coordinator (whose writes run shielded): the caller of ``append`` leaves at its deadline while
    the write waits on a row lock; the write goes on in the coordinator's task group, and the caller's retry of
    the same batch, sent before the lock is released, waits for it and is acknowledged once."""
    rig = ConformanceRig(lambda: PostgresBackend(postgres_dsn, schema=schema, lock_timeout=None), _no_plant)
    holder: psycopg.Connection[object] | None = None
    try:
        async with rig.open() as p:
            assert isinstance(p.persistence, PersistenceCoordinator)
            await p.persistence.create(meta("co"))
            await p.persistence.append("co", one_turn_log())
            holder = await _lock_row(postgres_dsn, schema, "co")
            with anyio.fail_after(SAFETY_NET):
                with pytest.raises(TimeoutError):
                    with anyio.fail_after(0.5):
                        await p.persistence.append("co", simple_turn(6, 2))
                async with anyio.create_task_group() as tg:
                    tg.start_soon(p.persistence.append, "co", simple_turn(6, 2))
                    await anyio.sleep(0.2)
                    await anyio.to_thread.run_sync(holder.rollback)
                await p.persistence.append("co", simple_turn(9, 3))
                loaded = await p.persistence.load("co")
                assert list(loaded.events) == one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)
    finally:
        if holder is not None:
            await anyio.to_thread.run_sync(holder.close)
    assert await _stored(postgres_dsn, schema, "co") == one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)


async def _no_plant(*args: object, **kwargs: object) -> None:
    raise AssertionError("not used")


async def test_a_reconnect_into_a_silent_server_is_bounded_by_connect_timeout(
    proxy: PgProxy, proxy_dsn: str, postgres_dsn: str, schema: str
) -> None:
    """The connection string sets no connect_timeout, so the backend's default applies (the client deadline,
    here 2 s). The one pooled connection goes silent and so does every new one (the proxy accepts and never
    answers): the pool's reconnect attempt hangs in libpq's connect. Once the network is back (the hung attempt
    is left open, not reset), a later call succeeds: the hung attempt ended at its connect_timeout and the pool
    tried again. Without the bound the attempt waits forever, holds the pool's only slot, and no call ever
    succeeds again (the loop below ends at the safety net)."""
    dsn = proxy_dsn.replace("connect_timeout=10", "").strip()
    assert "connect_timeout" not in dsn
    storage = StorageMetadata(meta("ct"))
    backend = PostgresBackend(
        dsn, schema=schema, client_timeout=1, retry_timeout=1, statement_timeout=0.5, min_size=1, max_size=1
    )
    try:
        await backend.append_batch(storage, one_turn_log(), False)
        proxy.blackhole_new = True
        assert proxy.blackhole() >= 1
        with anyio.fail_after(SAFETY_NET), pytest.raises(SessionStorageError):
            await backend.append_batch(storage, simple_turn(6, 2), True)  # dropped at client_timeout, in doubt
        proxy.blackhole_new = False  # the reconnect already under way stays hung: only its timeout ends it
        with anyio.fail_after(SAFETY_NET):
            while True:
                try:
                    await backend.append_batch(storage, simple_turn(6, 2), True)
                    break
                except SessionStorageError:
                    await anyio.sleep(0.2)  # no connection yet: the pool is still reconnecting
            await backend.append_batch(storage, simple_turn(9, 3), True)
    finally:
        proxy.blackhole_new = False
        proxy.close_all()
        await backend.aclose()
    assert await _stored(postgres_dsn, schema, "ct") == one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)
