"""A failure never sticks: whatever a session went through, a failed write is kept and the next flush tries again.

A resumed session (``load`` then ``store.create(seed=...)``: its first append is ``session/end-seed``), a new
seeded session and a fork's child each write their first batch when they bind; that write failing once must
behave like any failed write of a fresh session: the next flush retries it, closing is clean. A write that keeps
failing makes every flush try again and the close raise ``SessionDisposeError``, never an ``ExceptionGroup``.
(The same at the edge, with the fault below Python on JSONL: tests-integration/test_failure_never_sticks.py.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from dsh.session_persistence import (
    Host,
    MemoryBackend,
    MemoryStore,
    PersistenceCoordinator,
    Session,
    SessionDisposeError,
    SessionPersistenceError,
    SessionStore,
)
from dsh.session_persistence.testing import FaultInjectingBackend, InjectedFault, meta, simple_turn

pytestmark = pytest.mark.anyio

Bind = Callable[[SessionStore, PersistenceCoordinator], Awaitable[Session]]


async def resumed(store: SessionStore, coordinator: PersistenceCoordinator) -> Session:
    view = await coordinator.load("stored")
    return store.create("stored", seed=view.events, meta=view.meta, inherited_event_count=view.inherited_event_count)


async def seeded(store: SessionStore, coordinator: PersistenceCoordinator) -> Session:
    return store.create("seeded", seed=simple_turn(0, 1, "seed"), meta=meta("seeded"))


async def forked(store: SessionStore, coordinator: PersistenceCoordinator) -> Session:
    source = store.create("source", meta=meta("source"))
    for e in simple_turn(0, 1, "source"):
        source.append_event(e)
    await store.flush(source)
    return store.fork(source, child_id="child")


BINDS = {"resumed": resumed, "seeded": seeded, "forked": forked}


async def stored_before(memory: MemoryStore) -> None:
    host = Host()
    store = SessionStore(host)
    async with PersistenceCoordinator(host, MemoryBackend(memory)):
        session = store.create("stored", meta=meta("stored"))
        for e in simple_turn(0, 1, "stored"):
            session.append_event(e)
        await store.flush(session)
        store.dispose(session)


@pytest.mark.parametrize("kind", sorted(BINDS))
async def test_a_failed_first_write_is_retried_by_the_next_flush(kind: str) -> None:
    memory = MemoryStore()
    await stored_before(memory)
    backend = FaultInjectingBackend(MemoryBackend(memory))
    host = Host()
    store = SessionStore(host)
    async with PersistenceCoordinator(host, backend) as coordinator:
        session = await BINDS[kind](store, coordinator)
        backend.fail_appends(1)
        failures_before = backend.append_failures
        await store.flush(session)  # the failed first write was kept: this flush wrote it
        assert backend.append_failures == failures_before + 1, "the fault was injected"
        for e in simple_turn(len(session.events), 2, "later"):
            session.append_event(e)
        await store.flush(session)
        events = session.events
        store.dispose(session)
    # The close was clean (no error above), and every event is stored.
    stored = await MemoryBackend(memory).load_stored(session.id)
    assert stored is not None and list(stored.events) == list(events)


@pytest.mark.parametrize("kind", sorted(BINDS))
async def test_a_write_that_keeps_failing_is_tried_again_by_each_flush_and_the_close_is_typed(kind: str) -> None:
    memory = MemoryStore()
    await stored_before(memory)
    backend = FaultInjectingBackend(MemoryBackend(memory))
    host = Host()
    store = SessionStore(host)
    flushes: list[BaseException | None] = []
    attempts: list[int] = []

    async def run() -> None:
        async with PersistenceCoordinator(host, backend) as coordinator:
            session = await BINDS[kind](store, coordinator)
            backend.fail_appends(None)
            for _ in range(3):
                before = backend.append_failures
                try:
                    await store.flush(session)
                except Exception as exc:
                    flushes.append(exc)
                else:
                    flushes.append(None)
                attempts.append(backend.append_failures - before)

    # Asserted after the close: a failed assertion inside the block would be replaced by the close's own error.
    with pytest.raises(SessionDisposeError) as caught:
        await run()
    assert all(isinstance(exc, SessionPersistenceError) for exc in flushes), flushes
    assert len({id(exc) for exc in flushes}) == 3, "a flush re-raised an earlier error object"
    # The first flush sees the write started when the session bound fail, then tries once itself; each later one
    # tries again, once.
    assert attempts == [2, 1, 1], attempts
    error = caught.value
    assert type(error) is SessionDisposeError  # one typed error, not a group of them
    assert len(error.errors) == 1 and isinstance(error.errors[0], SessionPersistenceError)
    assert isinstance(error.__cause__, SessionPersistenceError)
    assert isinstance(error.errors[0].__cause__, InjectedFault)
