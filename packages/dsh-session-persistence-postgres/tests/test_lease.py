"""The writer lease: off by default (a no-op: the compare-and-set refuses stale writers), or an advisory lock."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.to_thread
import psycopg
import pytest
from dsh.session_persistence.backend import SessionLockedError, SupportsWriterLease
from dsh.session_persistence.testing import ConformanceRig, meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import PostgresBackend

from ._proxy import PgProxy

pytestmark = pytest.mark.anyio


@pytest.fixture
def schema(fresh_schema: Callable[[], str]) -> str:
    return fresh_schema()


async def test_the_default_lease_holds_nothing(postgres_dsn: str, schema: str) -> None:
    a, b = PostgresBackend(postgres_dsn, schema=schema), PostgresBackend(postgres_dsn, schema=schema)
    try:
        assert isinstance(a, SupportsWriterLease)
        first = await a.acquire_writer_lease(meta("free"))
        second = await b.acquire_writer_lease(meta("free"))
        assert first.holder is None and second.holder is None
        await first.release()
        await second.release()
    finally:
        await a.aclose()
        await b.aclose()


async def test_an_advisory_lease_refuses_a_second_writer_naming_the_holder(postgres_dsn: str, schema: str) -> None:
    a = PostgresBackend(postgres_dsn, schema=schema, writer_lease=True)
    b = PostgresBackend(postgres_dsn, schema=schema, writer_lease=True)
    try:
        lease = await a.acquire_writer_lease(meta("held"))
        assert lease.holder is not None and lease.holder.startswith("pid ")
        with pytest.raises(SessionLockedError, match="is locked by pid ") as info:
            await b.acquire_writer_lease(meta("held"))
        assert info.value.holder == lease.holder
        other = await b.acquire_writer_lease(meta("another"))  # per session, not per store
        await other.release()
        await lease.release()
        await lease.release()  # idempotent
        again = await b.acquire_writer_lease(meta("held"))
        await again.release()
    finally:
        await a.aclose()
        await b.aclose()


async def test_the_lease_ends_with_its_holders_connection(postgres_dsn: str, schema: str) -> None:
    a = PostgresBackend(postgres_dsn, schema=schema, writer_lease=True)
    b = PostgresBackend(postgres_dsn, schema=schema, writer_lease=True)
    try:
        await a.acquire_writer_lease(meta("dies"))
        with pytest.raises(SessionLockedError):
            await b.acquire_writer_lease(meta("dies"))
        # The holder "dies": its lease connection is terminated by the server, as when its process is killed.
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'dsh lease %'"
            )
        with anyio.fail_after(60):  # a safety net: the server releases it once the backend has exited
            while True:
                try:
                    lease = await b.acquire_writer_lease(meta("dies"))
                    break
                except SessionLockedError:
                    await anyio.sleep(0.02)
        await lease.release()
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_released_lease_is_free_when_release_returns(
    proxy: PgProxy, proxy_dsn: str, postgres_dsn: str, schema: str
) -> None:
    """The next writer may take the session the moment ``release()`` returned (the conformance kit's delete right
    after a write was refused ``SessionLockedError`` by the writer's own lease now and then).

    The holder reaches the server through a proxy that delays every message by seconds: a release that only closed
    its connection returned while the server still held the lock (its disconnect still in flight); one that
    unlocks returns after the server answered that the lock is free.
    """
    a = PostgresBackend(proxy_dsn, schema=schema, writer_lease=True)
    b = PostgresBackend(postgres_dsn, schema=schema, writer_lease=True)
    try:
        lease = await a.acquire_writer_lease(meta("handover"))
        proxy.latency = 3.0  # a slow network, not a timing check: the lock must be free either way
        await lease.release()
        again = await b.acquire_writer_lease(meta("handover"))
        await again.release()
    finally:
        proxy.latency = 0.0
        await a.aclose()
        await b.aclose()


async def _no_plant(*args: object, **kwargs: object) -> None:
    raise AssertionError("not used")


async def test_the_coordinator_takes_the_lease_for_its_writes(postgres_dsn: str, schema: str) -> None:
    rig = ConformanceRig(lambda: PostgresBackend(postgres_dsn, schema=schema, writer_lease=True), _no_plant)
    async with rig.open() as p:
        await p.persistence.create(meta("coord"))
        await p.persistence.append("coord", one_turn_log())
        async with rig.open() as q:
            with pytest.raises(SessionLockedError):
                await q.persistence.append("coord", simple_turn(6, 2))
    async with rig.open() as p:
        await p.persistence.append("coord", simple_turn(6, 2))
    stored = await rig.stored_events("coord")
    assert stored == one_turn_log() + simple_turn(6, 2)
