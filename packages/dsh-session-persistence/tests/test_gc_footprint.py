"""What one in-flight live commit costs the garbage collector (issue #34: GC at 1,000 sessions).

At a thousand sessions a durable write waits behind others for far longer than the interval between two
young-generation collections, so every tracked object it holds survives them, is traversed by each and ends in an
older generation. The count below is exact (an object graph, not a time) and the same on asyncio and trio: the
objects created for the barrier that the backend's ``done`` callback keeps alive while the write is in flight.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import pytest
from dsh.session_persistence import (
    Host,
    MemoryBackend,
    MemoryStore,
    PersistenceCoordinator,
    SessionPersistenceError,
    SessionStore,
)
from dsh.session_persistence._coordinator.state import Outcome
from dsh.session_persistence.backend import StorageMetadata
from dsh.session_persistence.events import SessionEvent
from dsh.session_persistence.testing import tracked_reachable

pytestmark = pytest.mark.anyio

WINDOW_MS = 600_000  # no window expiry during the test: every write is a barrier's

#: The fast path's write (one object, the backend's callback), its pending record, the batch's tuple, the id's FIFO
#: ticket and the controller's write (the controller's callback). A chain of partials and closures per write would
#: be 14.
TRACKED_PER_WRITE = 5


class _HeldBackend(MemoryBackend):
    """A MemoryBackend whose live appends complete only when the test says so (the write stays in flight)."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.held: list[tuple[StorageMetadata, Sequence[SessionEvent], bool, Callable[[BaseException | None], None]]]
        self.held = []
        self.hold = False

    def submit_append_batch(
        self,
        storage: StorageMetadata,
        events: Sequence[SessionEvent],
        is_materialized: bool,
        done: Callable[[BaseException | None], None],
    ) -> None:
        if self.hold:
            self.held.append((storage, events, is_materialized, done))
            return
        super().submit_append_batch(storage, events, is_materialized, done)

    def release(self) -> None:
        held, self.held = self.held, []
        for storage, events, is_materialized, done in held:
            super().submit_append_batch(storage, events, is_materialized, done)


def _chunk(session: Any, text: str) -> None:
    session.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": text}})


async def test_an_in_flight_live_commit_holds_five_tracked_objects() -> None:
    host = Host()
    store = SessionStore(host)
    backend = _HeldBackend(MemoryStore())
    async with PersistenceCoordinator(host, backend, write_batch_max_delay_ms=WINDOW_MS):
        session: Any = store.create("footprint", meta={"cwd": "/w"})
        session.append("turn/start", {"turn": 1})
        session.append("step/start", {"turn": 1, "step": 1})
        await store.flush(session)
        _chunk(session, "warm")
        await store.flush(session)  # steady state: bound, stored, the lease held
        _chunk(session, "held")
        backend.hold = True
        enabled = gc.isenabled()
        gc.disable()  # a collection would untrack the batch's tuple (its events are untracked): the count is exact
        try:
            snapshot = gc.get_objects()  # kept alive to the end: no id of it is reused meanwhile
            old = {id(o) for o in snapshot} | {id(snapshot)}
            async with anyio.create_task_group() as tg:
                tg.start_soon(store.flush, session)
                while not backend.held:
                    await anyio.lowlevel.checkpoint()
                (_, events, _, done) = backend.held[0]
                assert [e.type for e in events] == ["assistant/chunk"]
                held = tracked_reachable(done, old)
                backend.release()
            del snapshot
        finally:
            if enabled:
                gc.enable()
        store.dispose(session)
    names = sorted(type(o).__name__ for o in held)
    assert len(held) == TRACKED_PER_WRITE, names


def _kept(outcome: Outcome) -> list[object]:
    """The tracked objects ``outcome`` refers to (its class aside)."""
    return [o for o in gc.get_referents(outcome) if gc.is_tracked(o) and o is not Outcome]


async def test_a_settled_outcome_keeps_no_event_whether_or_not_it_was_waited_on() -> None:
    """A live session keeps its initialization's outcome for its whole life: once settled it holds no tracked
    object (no event), and it still wakes a waiter that came first and raises its error to one that comes after."""
    quiet = Outcome()
    quiet.settle()
    assert _kept(quiet) == []
    await quiet.wait()

    failed = Outcome()
    woken: list[str] = []

    async def waiter() -> None:
        await failed.wait_settled()
        woken.append("woken")

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        assert not failed.is_set()
        error = SessionPersistenceError("refused")
        failed.settle(error)
    assert woken == ["woken"]
    assert failed.is_set()
    assert _kept(failed) == [error]
    with pytest.raises(SessionPersistenceError, match="refused"):
        await failed.wait()
