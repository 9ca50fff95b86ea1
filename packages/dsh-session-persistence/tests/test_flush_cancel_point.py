"""``store.flush`` is a cancellation point even when it has nothing to drain (it no longer yields on that path).

A caller cancelled before the flush sees the cancellation, and nothing is lost: pending events stay pending and a
later flush writes them. On asyncio and trio.
"""

from __future__ import annotations

import anyio
import pytest
from dsh.session_persistence import Host, MemoryBackend, MemoryStore, PersistenceCoordinator, SessionStore

pytestmark = pytest.mark.anyio


async def test_a_flush_with_nothing_pending_in_a_cancelled_scope_is_cancelled() -> None:
    storage = MemoryStore()
    host = Host()
    store = SessionStore(host)
    async with PersistenceCoordinator(host, MemoryBackend(storage)):
        session = store.create("s", meta={"cwd": "/work"})
        session.append("turn/start", {"turn": 1})
        await store.flush(session)
        reached = False
        with anyio.CancelScope() as scope:
            scope.cancel()
            await store.flush(session)
            reached = True
        assert scope.cancelled_caught and not reached
        session.append("step/start", {"turn": 1, "step": 1})
        await store.flush(session)
        stored = await MemoryBackend(storage).load_stored("s")
        assert stored is not None and [e.seq for e in stored.events] == [0, 1]
        store.dispose(session)
