"""The PostgreSQL live commit's cost, counted (issue #34): a steady-state barrier through the coordinator starts no
task, enters no cancel scope, makes no anyio event, creates at most one future (asyncio) and hands one batch to the
backend (its group committer, through ``submit_append_batch``). Exact counts, never times.

Remove the backend's ``submit_append_batch`` and every barrier costs a task (the coordinator's write-behind write)
and a cancel scope or more again: ``tasks == BARRIERS``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
from dsh.session_persistence.testing import CostLedger
from dsh.session_persistence_postgres import PostgresBackend

pytestmark = pytest.mark.anyio

BARRIERS = 10
WINDOW_MS = 600_000  # longer than the test: the coordinator's one timer task sleeps through it


async def test_a_steady_state_postgres_barrier_costs_no_task_scope_or_event(
    postgres_dsn: str, fresh_schema: Callable[[], str]
) -> None:
    ledger = CostLedger()
    host = Host()
    store = SessionStore(host)
    schema = fresh_schema()
    backend = ledger.watch(PostgresBackend(postgres_dsn, schema=schema))
    async with PersistenceCoordinator(host, backend, write_batch_max_delay_ms=WINDOW_MS):  # type: ignore[arg-type]
        session = store.create("ledger", meta={"cwd": "/w"})
        session.append("turn/start", {"turn": 1})
        await store.flush(session)  # the first write: the lease and the session row (the async path)
        session.append("step/start", {"turn": 1, "step": 1})
        await store.flush(session)  # the first later batch (the pool's connection is warm now)
        with ledger.counting():
            for barrier in range(BARRIERS):
                chunk = {"type": "text-delta", "index": 0, "text": f"token {barrier}"}
                session.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": chunk})
                await store.flush(session)
        counts = ledger.counts()
        store.dispose(session)
    futures = 0 if ledger.library == "trio" else BARRIERS
    assert counts == {"tasks": 0, "cancel_scopes": 0, "events": 0, "futures": futures, "handoffs": BARRIERS}
    # Every acknowledged event is stored: a fresh backend reads them back.
    reader = PostgresBackend(postgres_dsn, schema=schema)
    try:
        stored = await reader.load_stored("ledger")
    finally:
        await reader.aclose()
    assert stored is not None and len(stored.events) == 2 + BARRIERS
