"""Settings and refusals against a real server: first start, schema names, connection settings and pools,
real connection errors, durability settings, deadlines."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.to_thread
import psycopg
import pytest
from dsh.session_persistence.backend import SessionPersistenceError, SessionStorageError, StorageMetadata
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import (
    MAX_IDENTIFIER_BYTES,
    PostgresBackend,
    PostgresConfigurationError,
    WeakDurabilityError,
)
from psycopg_pool import ConnectionPool

from ._pgserver import PASSWORD_USER, PgCluster, running_cluster

pytestmark = pytest.mark.anyio


@pytest.fixture
def schema(fresh_schema: Callable[[], str]) -> str:
    return fresh_schema()


def _sql(dsn: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query.encode(), params)
        return cur.fetchall() if cur.description is not None else []


async def _round_trip(backend: PostgresBackend, session_id: str) -> None:
    storage = StorageMetadata(meta(session_id))
    await backend.append_batch(storage, one_turn_log(), False)
    await backend.append_batch(storage, simple_turn(6, 2), True)
    stored = await backend.load_stored(session_id)
    assert stored is not None and list(stored.events) == one_turn_log() + simple_turn(6, 2)


# -- a failed first start is not final -----------------------------------------------------------------------


@pytest.fixture
def down_cluster() -> Iterator[PgCluster]:
    """A cluster that is initialized but stopped (the test starts it)."""
    with running_cluster() as cluster:
        cluster.stop("fast")
        yield cluster


async def test_a_start_against_a_down_server_succeeds_once_it_is_up(down_cluster: PgCluster) -> None:
    backend = PostgresBackend(down_cluster.dsn, schema="late", retry_timeout=0.2)
    try:
        with pytest.raises(SessionStorageError, match="Connection refused") as info:
            await backend.list()
        assert isinstance(info.value.__cause__, psycopg.OperationalError)
        with pytest.raises(SessionStorageError, match="Connection refused"):
            await backend.append_batch(StorageMetadata(meta("late")), one_turn_log(), False)
        await anyio.to_thread.run_sync(down_cluster.start)
        # The same instance, not closed by its failed start.
        assert await backend.list() == []
        await _round_trip(backend, "late")
    finally:
        await backend.aclose()


# -- schema names ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["MixedCase", "with space", 'quo"te', "ünïcode-Ü"])
async def test_any_name_postgres_keeps_is_a_schema_reopened_as_is(postgres_dsn: str, name: str) -> None:
    name = f"{name}_{uuid.uuid4().hex[:6]}"  # one store per run (the cluster outlives the test)
    for round_no in range(2):  # created, then found again (and again) by another instance
        backend = PostgresBackend(postgres_dsn, schema=name)
        try:
            if round_no == 0:
                await _round_trip(backend, "named")
            else:
                assert [h.id for h in await backend.list()] == ["named"]
        finally:
            await backend.aclose()
    assert _sql(postgres_dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (name,)) == [(1,)]
    # Case is kept: the folded name is another, empty store.
    other = PostgresBackend(postgres_dsn, schema=name.lower() + "_folded")
    try:
        assert await other.list() == []
    finally:
        await other.aclose()


async def test_names_postgres_would_truncate_are_refused(postgres_dsn: str) -> None:
    longest = "s" * (MAX_IDENTIFIER_BYTES - 1) + "a"
    backend = PostgresBackend(postgres_dsn, schema=longest)
    try:
        assert await backend.list() == []
    finally:
        await backend.aclose()
    for refused in ["s" * (MAX_IDENTIFIER_BYTES - 1) + "ab", "é" * 32, "", "nul\0"]:
        with pytest.raises(PostgresConfigurationError) as info:
            PostgresBackend(postgres_dsn, schema=refused)
        assert isinstance(info.value, SessionPersistenceError)
    with pytest.raises(PostgresConfigurationError, match="only the first 63"):
        PostgresBackend(postgres_dsn, schema="s" * (MAX_IDENTIFIER_BYTES - 1) + "ab")


# -- connection settings and the caller's pool ---------------------------------------------------------------


async def test_connection_keyword_arguments_reach_every_connection(postgres_dsn: str, schema: str) -> None:
    backend = PostgresBackend(
        postgres_dsn, schema=schema, connection_kwargs={"application_name": "dsh-kw", "prepare_threshold": None}
    )
    try:
        await _round_trip(backend, "kw")
        names = _sql(
            postgres_dsn, "SELECT DISTINCT application_name FROM pg_stat_activity WHERE application_name = 'dsh-kw'"
        )
        assert names == [("dsh-kw",)]
    finally:
        await backend.aclose()


@pytest.mark.parametrize("autocommit", [True, False])
async def test_a_callers_pool_is_used_and_left_open(postgres_dsn: str, schema: str, autocommit: bool) -> None:
    pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
        postgres_dsn, kwargs={"autocommit": autocommit}, min_size=1, max_size=2, open=True
    )
    try:
        backend = PostgresBackend(schema=schema, pool=pool)
        await _round_trip(backend, "pooled")
        await backend.aclose()
        with pool.connection() as conn:  # still open, and its connections are as the caller made them
            assert conn.autocommit is autocommit
            row = conn.execute(f'SELECT count(*) FROM "{schema}".dsh_events'.encode()).fetchone()
            assert row == (9,)
    finally:
        pool.close()
    with pytest.raises(PostgresConfigurationError, match="either a pool or conninfo"):
        PostgresBackend(postgres_dsn, pool=pool)


# -- the real connection error --------------------------------------------------------------------------------


async def test_connection_errors_name_their_cause(pg_cluster: PgCluster, schema: str) -> None:
    _sql(pg_cluster.dsn, f"DROP ROLE IF EXISTS {PASSWORD_USER}")
    _sql(pg_cluster.dsn, f"CREATE ROLE {PASSWORD_USER} LOGIN PASSWORD 'right'")
    base = f"host=127.0.0.1 port={pg_cluster.port} dbname={pg_cluster.dbname}"
    cases = {
        f"{base} user={PASSWORD_USER} password=wrong": "password authentication failed",
        f"host=127.0.0.1 port={pg_cluster.port} dbname=nowhere user={pg_cluster.user}": 'database "nowhere" does not exist',
        f"{base} user=nobody_here": 'role "nobody_here" does not exist',
    }
    for dsn, cause in cases.items():
        # Refusals are final: reported at once, even with a long retry_timeout.
        backend = PostgresBackend(dsn, schema=schema, retry_timeout=600)
        try:
            with pytest.raises(SessionStorageError, match=cause) as info:
                await backend.list()
            assert isinstance(info.value.__cause__, psycopg.OperationalError)
            assert "PoolTimeout" not in str(info.value) and "couldn't get a connection" not in str(info.value)
        finally:
            await backend.aclose()
    right = PostgresBackend(f"{base} user={PASSWORD_USER} password=right", schema=schema)
    try:
        with pytest.raises(SessionStorageError, match="permission denied"):
            await right.list()  # authenticated, but may not create the schema
    finally:
        await right.aclose()


# -- durability settings --------------------------------------------------------------------------------------


async def test_synchronous_commit_off_is_refused_unless_accepted(postgres_dsn: str, schema: str) -> None:
    weak = {"options": "-c synchronous_commit=off"}
    backend = PostgresBackend(postgres_dsn, schema=schema, connection_kwargs=weak)
    try:
        with pytest.raises(WeakDurabilityError, match="synchronous_commit=off") as info:
            await backend.list()
        assert info.value.settings == {"synchronous_commit": "off"}
        assert "allow_weak_durability=True" in str(info.value)
    finally:
        await backend.aclose()
    accepted = PostgresBackend(postgres_dsn, schema=schema, connection_kwargs=weak, allow_weak_durability=True)
    try:
        await _round_trip(accepted, "weak")
    finally:
        await accepted.aclose()
    for strong in ("local", "remote_write", "remote_apply"):
        ok = PostgresBackend(
            postgres_dsn, schema=schema, connection_kwargs={"options": f"-c synchronous_commit={strong}"}
        )
        try:
            assert len(await ok.list()) == 1
        finally:
            await ok.aclose()


@contextlib.contextmanager
def _server_setting(dsn: str, name: str, value: str) -> Iterator[None]:
    """``ALTER SYSTEM SET`` + reload for the block (the reload is asynchronous: wait until sessions see it)."""
    _sql(dsn, f"ALTER SYSTEM SET {name} = {value}")
    _sql(dsn, "SELECT pg_reload_conf()")
    try:
        for _ in range(3000):
            if _sql(dsn, f"SELECT current_setting('{name}')") == [(value,)]:
                break
            time.sleep(0.01)
        yield
    finally:
        _sql(dsn, f"ALTER SYSTEM RESET {name}")
        _sql(dsn, "SELECT pg_reload_conf()")
        for _ in range(3000):
            if _sql(dsn, f"SELECT current_setting('{name}')") != [(value,)]:
                break
            time.sleep(0.01)


async def test_fsync_off_is_refused(postgres_dsn: str, schema: str) -> None:
    with _server_setting(postgres_dsn, "fsync", "off"):
        backend = PostgresBackend(postgres_dsn, schema=schema)
        try:
            with pytest.raises(WeakDurabilityError, match="fsync=off"):
                await backend.list()
        finally:
            await backend.aclose()


@pytest.fixture
def own_database(pg_cluster: PgCluster) -> Iterator[str]:
    """A database of its own (its settings can be altered without touching the other tests'); its DSN."""
    name = f"db_{uuid.uuid4().hex[:12]}"
    admin = f"host=127.0.0.1 port={pg_cluster.port} dbname=postgres user={pg_cluster.user}"
    _sql(admin, f'CREATE DATABASE "{name}"')
    try:
        yield f"host=127.0.0.1 port={pg_cluster.port} dbname={name} user={pg_cluster.user} connect_timeout=10"
    finally:
        _sql(admin, f'DROP DATABASE "{name}" WITH (FORCE)')


async def test_durability_is_checked_on_every_new_connection(own_database: str, schema: str) -> None:
    """``ALTER DATABASE ... SET synchronous_commit = off`` after start is noticed on the next new connection."""
    dbname = psycopg.conninfo.conninfo_to_dict(own_database)["dbname"]
    app = f"dsh-dur-{uuid.uuid4().hex[:8]}"
    backend = PostgresBackend(
        own_database, schema=schema, connection_kwargs={"application_name": app}, min_size=1, max_size=1
    )
    storage = StorageMetadata(meta("dur"))
    try:
        await backend.append_batch(storage, one_turn_log(), False)
        _sql(own_database, f'ALTER DATABASE "{dbname}" SET synchronous_commit = off')
        # The pooled connection still runs with the old setting; end it so the next call needs a new one.
        ended = _sql(
            own_database, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (app,)
        )
        assert ended and all(ok for (ok,) in ended)
        with pytest.raises(WeakDurabilityError, match="synchronous_commit=off") as info:
            await backend.append_batch(storage, simple_turn(6, 2), True)
        assert info.value.settings == {"synchronous_commit": "off"}
        with pytest.raises(WeakDurabilityError):
            await backend.load_stored("dur")  # reads too: every new connection is refused, not only the first
        _sql(own_database, f'ALTER DATABASE "{dbname}" RESET synchronous_commit')
        # The pool may hold a replacement made while the setting was off: it is refused too; end it.
        _sql(own_database, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (app,))
        await backend.append_batch(storage, simple_turn(6, 2), True)  # nothing was written by the refused one
        stored = await backend.load_stored("dur")
        assert stored is not None and list(stored.events) == one_turn_log() + simple_turn(6, 2)
    finally:
        await backend.aclose()


# -- deadlines ------------------------------------------------------------------------------------------------


async def test_an_append_waiting_on_a_row_lock_fails_typed_at_lock_timeout(postgres_dsn: str, schema: str) -> None:
    storage = StorageMetadata(meta("locked"))
    backend = PostgresBackend(postgres_dsn, schema=schema, lock_timeout=0.2)
    holder = await anyio.to_thread.run_sync(psycopg.connect, postgres_dsn)
    try:
        await backend.append_batch(storage, one_turn_log(), False)
        await anyio.to_thread.run_sync(
            holder.execute, f"SELECT 1 FROM \"{schema}\".dsh_sessions WHERE id = 'locked' FOR UPDATE".encode()
        )
        with anyio.fail_after(120):  # a safety net for a hang, not a timing assertion
            with pytest.raises(SessionStorageError, match="lock_timeout") as info:
                await backend.append_batch(storage, simple_turn(6, 2), True)
        assert isinstance(info.value.__cause__, psycopg.errors.LockNotAvailable)
        await anyio.to_thread.run_sync(holder.rollback)
        await backend.append_batch(storage, simple_turn(6, 2), True)  # nothing was written by the failed one
        stored = await backend.load_stored("locked")
        assert stored is not None and list(stored.events) == one_turn_log() + simple_turn(6, 2)
    finally:
        await anyio.to_thread.run_sync(holder.close)
        await backend.aclose()


async def test_a_statement_is_cancelled_at_statement_timeout(postgres_dsn: str, schema: str) -> None:
    storage = StorageMetadata(meta("slow"))
    backend = PostgresBackend(postgres_dsn, schema=schema, lock_timeout=None, statement_timeout=0.2)
    holder = await anyio.to_thread.run_sync(psycopg.connect, postgres_dsn)
    try:
        await backend.append_batch(storage, one_turn_log(), False)
        await anyio.to_thread.run_sync(
            holder.execute, f'LOCK TABLE "{schema}".dsh_events IN ACCESS EXCLUSIVE MODE'.encode()
        )
        with anyio.fail_after(120):
            with pytest.raises(SessionStorageError, match="statement_timeout") as info:
                await backend.load_stored("slow")
        assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled)
    finally:
        await anyio.to_thread.run_sync(holder.close)
        await backend.aclose()


def test_bad_bounds_are_refused() -> None:
    for kwargs in ({"lock_timeout": -1}, {"statement_timeout": float("nan")}, {"retry_timeout": None}, {"max_size": 0}):
        with pytest.raises(PostgresConfigurationError):
            PostgresBackend("host=127.0.0.1 port=1", **kwargs)  # type: ignore[arg-type]
