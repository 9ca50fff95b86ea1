"""The JSONL live commit's cost, counted (DESIGN §12.1): a steady-state barrier on real files starts no task, enters
no cancel scope, makes no anyio event, creates at most one future (asyncio) and hands one batch to the writer.

Remove the backend's ``submit_append_batch`` (or the coordinator's use of it) and every barrier costs a task again:
``tasks == BARRIERS``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
from dsh.session_persistence.testing import CostLedger
from dsh.session_persistence_jsonl import JsonlBackend

pytestmark = pytest.mark.anyio

BARRIERS = 20
WINDOW_MS = 600_000  # longer than the test: the coordinator's one timer task sleeps through it


def _chunk(session: object, text: str) -> None:
    chunk = {"type": "text-delta", "index": 0, "text": text}
    session.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": chunk})  # type: ignore[attr-defined]


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_a_steady_state_jsonl_barrier_costs_no_task_scope_or_event(tmp_path: Path, compression: str) -> None:
    ledger = CostLedger()
    host = Host()
    store = SessionStore(host)
    backend = ledger.watch(JsonlBackend(str(tmp_path), compression=compression))  # type: ignore[arg-type]
    async with PersistenceCoordinator(host, backend, write_batch_max_delay_ms=WINDOW_MS):
        session = store.create("ledger", meta={"cwd": str(tmp_path)})
        session.append("turn/start", {"turn": 1})
        session.append("step/start", {"turn": 1, "step": 1})
        await store.flush(session)  # the first write: the lease and the new file (the async path)
        with ledger.counting():
            for barrier in range(BARRIERS):
                _chunk(session, f"{barrier}a")
                _chunk(session, f"{barrier}b")
                await store.flush(session)
        counts = ledger.counts()
        store.dispose(session)
    futures = 0 if ledger.library == "trio" else BARRIERS
    assert counts == {"tasks": 0, "cancel_scopes": 0, "events": 0, "futures": futures, "handoffs": BARRIERS}
    # What was acknowledged is on disk: a fresh coordinator reads every event back.
    host2 = Host()
    SessionStore(host2)
    async with PersistenceCoordinator(host2, JsonlBackend(str(tmp_path), compression=compression)) as again:  # type: ignore[arg-type]
        view = await again.load("ledger")
    texts = [event.data.chunk.text for event in view.events if event.type == "assistant/chunk"]  # type: ignore[attr-defined]
    assert texts == [f"{barrier}{part}" for barrier in range(BARRIERS) for part in "ab"]
