"""The pool's ``max_size`` caps the server connections a backend opens, also when callers outwait the pool; the
later batches of many sessions share the group committer's one connection."""

from __future__ import annotations

import uuid

import anyio
import anyio.to_thread
import psycopg
import pytest
from dsh.session_persistence.backend import SessionStorageError, StorageMetadata
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import PostgresBackend

pytestmark = pytest.mark.anyio

SESSIONS = 30


def _count(dsn: str, app: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(b"SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)).fetchone()
    return 0 if row is None else int(row[0])


async def test_max_size_caps_server_connections_while_rewrites_wait_on_a_row_lock(postgres_dsn: str) -> None:
    """30 rewrites blocked on row locks, ``max_size=2`` and a short ``pool_timeout``: the server never sees more
    than 2 connections of the backend; the callers that outwait the pool fail typed, nothing is written twice.
    (Rewrites: each takes a pooled connection of its own, where appends queue for the group committer.)"""
    schema = f"cap_{uuid.uuid4().hex[:10]}"
    app = f"dsh-cap-{uuid.uuid4().hex[:8]}"
    backend = PostgresBackend(
        postgres_dsn,
        schema=schema,
        connection_kwargs={"application_name": app},
        min_size=1,
        max_size=2,
        pool_timeout=0.2,
        retry_timeout=2.0,
        lock_timeout=None,
    )
    holder = await anyio.to_thread.run_sync(psycopg.connect, postgres_dsn)
    seen: list[int] = []
    outcomes: dict[str, BaseException | None] = {}
    try:
        for n in range(SESSIONS):
            await backend.append_batch(StorageMetadata(meta(f"s{n}")), one_turn_log(), False)
        await anyio.to_thread.run_sync(holder.execute, f'SELECT 1 FROM "{schema}".dsh_sessions FOR UPDATE'.encode())

        async def append(n: int) -> None:
            try:
                await backend.rewrite(StorageMetadata(meta(f"s{n}")), one_turn_log() + simple_turn(6, 2))
            except SessionStorageError as exc:
                outcomes[f"s{n}"] = exc
            else:
                outcomes[f"s{n}"] = None

        async with anyio.create_task_group() as tg:
            for n in range(SESSIONS):
                tg.start_soon(append, n)
            # Sample the server's view until every caller that cannot get a connection has given up (or the cap
            # is seen broken: connections opened beside the pool would wait on the lock, never giving up).
            with anyio.fail_after(120):  # a safety net for a hang, not a timing assertion
                while (
                    sum(1 for exc in outcomes.values() if exc is not None) < SESSIONS - 2 and max(seen, default=0) <= 2
                ):
                    seen.append(await anyio.to_thread.run_sync(_count, postgres_dsn, app))
                    await anyio.sleep(0.05)
            await anyio.to_thread.run_sync(holder.rollback)
    finally:
        await anyio.to_thread.run_sync(holder.close)
        await backend.aclose()
    assert seen and max(seen) <= 2, seen
    failed = {sid: exc for sid, exc in outcomes.items() if exc is not None}
    assert len(failed) == SESSIONS - 2
    assert all("cannot get a connection" in str(exc) for exc in failed.values()), failed
    # The two that held the pooled connections committed once the lock was released; the others wrote nothing.
    check = PostgresBackend(postgres_dsn, schema=schema)
    try:
        for n in range(SESSIONS):
            stored = await check.load_stored(f"s{n}")
            assert stored is not None
            ok = outcomes[f"s{n}"] is None
            assert list(stored.events) == (one_turn_log() + simple_turn(6, 2) if ok else one_turn_log())
    finally:
        await check.aclose()


async def test_appends_of_many_sessions_waiting_on_row_locks_hold_one_connection(postgres_dsn: str) -> None:
    """30 later batches blocked on row locks go to the group committer: one connection of the backend (the
    committer's) waits on the lock for all of them, none is refused, and every batch commits once it is released."""
    schema = f"cap_{uuid.uuid4().hex[:10]}"
    app = f"dsh-cap-{uuid.uuid4().hex[:8]}"
    backend = PostgresBackend(
        postgres_dsn, schema=schema, connection_kwargs={"application_name": app}, min_size=1, max_size=2
    )
    holder = await anyio.to_thread.run_sync(psycopg.connect, postgres_dsn)
    seen: list[int] = []
    try:
        for n in range(SESSIONS):
            await backend.append_batch(StorageMetadata(meta(f"s{n}")), one_turn_log(), False)
        await anyio.to_thread.run_sync(holder.execute, f'SELECT 1 FROM "{schema}".dsh_sessions FOR UPDATE'.encode())
        async with anyio.create_task_group() as tg:
            for n in range(SESSIONS):
                tg.start_soon(backend.append_batch, StorageMetadata(meta(f"s{n}")), simple_turn(6, 2), True)
            with anyio.fail_after(60):  # a safety net for a hang, not a timing assertion
                while not seen or seen[-1] == 0:
                    await anyio.sleep(0.02)
                    seen.append(await anyio.to_thread.run_sync(_lock_waits, postgres_dsn, app))
            await anyio.wait_all_tasks_blocked()  # every batch is queued
            for _ in range(5):
                seen.append(await anyio.to_thread.run_sync(_lock_waits, postgres_dsn, app))
            await anyio.to_thread.run_sync(holder.rollback)
    finally:
        await anyio.to_thread.run_sync(holder.close)
        await backend.aclose()
    assert seen and max(seen) == 1, seen
    check = PostgresBackend(postgres_dsn, schema=schema)
    try:
        for n in range(SESSIONS):
            stored = await check.load_stored(f"s{n}")
            assert stored is not None and list(stored.events) == one_turn_log() + simple_turn(6, 2)
    finally:
        await check.aclose()


def _lock_waits(dsn: str, app: str) -> int:
    """The backend's connections waiting on a lock now."""
    query = b"SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, (app,)).fetchone()
    return 0 if row is None else int(row[0])
