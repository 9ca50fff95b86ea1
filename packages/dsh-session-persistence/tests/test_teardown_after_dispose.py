"""A Session disposed just before its coordinator closes: the teardown drain and the Session's retirement race.

Whichever runs first, the close must succeed and every event must be durable: a retirement that finished first
has already flushed (it drops a Session only after its final flush), so the teardown has nothing left to do for
it. Each case runs on asyncio and trio, with a retirement that has something to write and one that has not.
"""

from __future__ import annotations

import pytest
from dsh.session_persistence import Host, MemoryBackend, MemoryStore, PersistenceCoordinator, SessionStore

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("pending", [0, 1, 3])
async def test_close_right_after_dispose_succeeds_and_keeps_every_event(pending: int) -> None:
    storage = MemoryStore()
    host = Host()
    store = SessionStore(host)
    async with PersistenceCoordinator(host, MemoryBackend(storage)):
        session = store.create("s", meta={"cwd": "/work"})
        session.append("turn/start", {"turn": 1})
        session.append("step/start", {"turn": 1, "step": 1})
        await store.flush(session)
        for _ in range(pending):
            session.append(
                "assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "a"}}
            )
        store.dispose(session)
    stored = await MemoryBackend(storage).load_stored("s")
    assert stored is not None
    assert [e.seq for e in stored.events] == list(range(2 + pending))


async def test_close_right_after_disposing_several_sessions_succeeds() -> None:
    storage = MemoryStore()
    host = Host()
    store = SessionStore(host)
    async with PersistenceCoordinator(host, MemoryBackend(storage)):
        sessions = [store.create(f"s{i}", meta={"cwd": "/work"}) for i in range(4)]
        for i, session in enumerate(sessions):
            session.append("turn/start", {"turn": 1})
            if i % 2:
                await store.flush(session)
        for session in sessions:
            store.dispose(session)
    for i in range(4):
        stored = await MemoryBackend(storage).load_stored(f"s{i}")
        assert stored is not None and len(stored.events) == 1
