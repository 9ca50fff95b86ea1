"""The commit path's cost, counted (DESIGN §12.1): a steady-state barrier starts no task, enters no cancel scope, makes
no anyio event, creates at most one future and hands one batch to the backend; an event costs none of these.

Exact counts on asyncio and trio, never times. Each assertion fails when a spawn, a scope or an event per barrier
comes back (e.g. a drain task per flush: ``tasks == BARRIERS``).
"""

from __future__ import annotations

import anyio
import pytest
from dsh.session_persistence import Host, MemoryBackend, MemoryStore, PersistenceCoordinator, SessionStore, hookimpl
from dsh.session_persistence.testing import CostLedger

BARRIERS = 25
EVENTS_PER_BARRIER = 3
#: A window far longer than the test: the coordinator's one timer task sleeps through it (arming never spawns).
WINDOW_MS = 600_000


def _chunk(session: object, text: str) -> None:
    chunk = {"type": "text-delta", "index": 0, "text": text}
    session.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": chunk})  # type: ignore[attr-defined]


async def _open_turn(store: SessionStore, session: object) -> None:
    session.append("turn/start", {"turn": 1})  # type: ignore[attr-defined]
    session.append("step/start", {"turn": 1, "step": 1})  # type: ignore[attr-defined]
    await store.flush(session)  # type: ignore[arg-type]
    # A second barrier: the first write took the lease and created the log; from here on the session is steady.
    _chunk(session, "warm")
    await store.flush(session)  # type: ignore[arg-type]


async def test_a_steady_state_barrier_costs_no_task_scope_or_event_and_one_handoff() -> None:
    ledger = CostLedger()
    host = Host()
    store = SessionStore(host)
    backend = ledger.watch(MemoryBackend(MemoryStore()))
    async with PersistenceCoordinator(host, backend, write_batch_max_delay_ms=WINDOW_MS):
        session = store.create("ledger", meta={"cwd": "/w"})
        await _open_turn(store, session)
        with ledger.counting():
            for barrier in range(BARRIERS):
                for index in range(EVENTS_PER_BARRIER):
                    _chunk(session, f"{barrier}.{index}")
                await store.flush(session)
        counts = ledger.counts()
        store.dispose(session)
    futures = 0 if ledger.library == "trio" else BARRIERS
    assert counts == {"tasks": 0, "cancel_scopes": 0, "events": 0, "futures": futures, "handoffs": BARRIERS}


class _FlushListener:
    """A second ``session_flush`` plugin that only takes note (returns ``None``): settled before the barrier runs."""

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def session_flush(self, session: object) -> None:
        self.calls += 1


async def test_a_barrier_beside_a_listener_that_settled_at_once_starts_no_task() -> None:
    """With a plugin whose ``session_flush`` returns ``None`` beside the coordinator, only one implementation runs:
    the store awaits it directly (a task group for two would start two tasks per barrier)."""
    ledger = CostLedger()
    host = Host()
    listener = _FlushListener()
    host.register(listener)
    store = SessionStore(host)
    backend = ledger.watch(MemoryBackend(MemoryStore()))
    async with PersistenceCoordinator(host, backend, write_batch_max_delay_ms=WINDOW_MS):
        session = store.create("ledger-listener", meta={"cwd": "/w"})
        await _open_turn(store, session)
        with ledger.counting():
            for barrier in range(BARRIERS):
                _chunk(session, str(barrier))
                await store.flush(session)
        counts = ledger.counts()
        store.dispose(session)
    futures = 0 if ledger.library == "trio" else BARRIERS
    assert counts == {"tasks": 0, "cancel_scopes": 0, "events": 0, "futures": futures, "handoffs": BARRIERS}
    assert listener.calls == BARRIERS + 2


async def test_an_appended_event_costs_nothing_but_its_own_work() -> None:
    ledger = CostLedger()
    host = Host()
    store = SessionStore(host)
    backend = ledger.watch(MemoryBackend(MemoryStore()))
    async with PersistenceCoordinator(host, backend, write_batch_max_delay_ms=WINDOW_MS):
        session = store.create("ledger-events", meta={"cwd": "/w"})
        await _open_turn(store, session)
        with ledger.counting():
            for index in range(100):
                _chunk(session, str(index))
        assert ledger.counts() == {"tasks": 0, "cancel_scopes": 0, "events": 0, "futures": 0, "handoffs": 0}
        await store.flush(session)
        store.dispose(session)


async def test_the_ledger_counts_what_it_claims() -> None:
    """The instrument itself: a task, a scope, an event and a future made in the block are each counted once."""
    ledger = CostLedger()
    with ledger.counting():
        anyio.Event()
        with anyio.CancelScope():  # noqa: ASYNC100 - entered only to be counted
            pass
        if ledger.library == "asyncio":
            import asyncio

            asyncio.get_running_loop().create_future()
    assert ledger.counts() == {
        "tasks": 0,
        "cancel_scopes": 1,
        "events": 1,
        "futures": 0 if ledger.library == "trio" else 1,
        "handoffs": 0,
    }
    ledger.reset()
    async with anyio.create_task_group() as tg:
        with ledger.counting():
            tg.start_soon(anyio.sleep, 0)
    assert ledger.tasks == 1
    ledger.reset()
    with ledger.counting():
        pass
    anyio.Event()
    assert ledger.counts() == dict.fromkeys(ledger.counts(), 0), "nothing is counted outside the block"


pytestmark = pytest.mark.anyio
