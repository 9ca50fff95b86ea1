"""Group commit: the later batches of many sessions in one transaction, each session's outcome its own.

A group is formed deterministically: the committer's transaction waits on a session row the test holds locked
(``SELECT ... FOR UPDATE`` on a connection of its own), every other session's batch queues behind it, and when the
lock is released the queued batches go out together as the next transaction. Through the loopback proxy the test
sees how many transactions that took and can lose their ``COMMIT`` replies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import psycopg
import pytest
from dsh.session_persistence.backend import SeqMismatchError, StorageMetadata
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import PostgresBackend
from psycopg import sql

from ._proxy import PgProxy
from ._sealed import sealed_factory

pytestmark = pytest.mark.anyio

#: Sessions in the group (besides the one whose transaction holds the committer).
GROUP = 24
STALE = 7  # the session another writer moves on before the group is sent


@pytest.fixture(autouse=True, params=["plain", "sealed"])
def sealing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "sealed":
        monkeypatch.setitem(globals(), "PostgresBackend", sealed_factory())
    return str(request.param)


@pytest.fixture
def schema(fresh_schema: Callable[[], str]) -> str:
    return fresh_schema()


def _storage(index: int) -> StorageMetadata:
    return StorageMetadata(meta(f"g{index}"))


@contextmanager
def _row_locked(dsn: str, schema: str, session_id: str) -> Iterator[psycopg.Connection]:
    """Hold ``session_id``'s row lock until the block's end (or an earlier ``conn.commit()``)."""
    with psycopg.connect(dsn) as conn:
        table = sql.Identifier(schema, "dsh_sessions")
        conn.execute(sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE").format(table), (session_id,))
        yield conn
        conn.commit()


async def _until_a_lock_wait(conn: psycopg.Connection) -> None:
    """Until some backend waits for a lock (the committer's group transaction, on the held row)."""
    with anyio.fail_after(30):  # a safety net for a hang, not a timing assertion
        while True:
            row = conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
            if row is not None and row[0] > 0:
                return
            await anyio.sleep(0.01)


async def _stale_writer(dsn: str, schema: str) -> None:
    """Another writer stores seq 6.. of g{STALE} first: this backend's batch at seq 6 is stale."""
    other = PostgresBackend(dsn, schema=schema)
    try:
        await other.append_batch(_storage(STALE), simple_turn(6, 9, "other"), True)
    finally:
        await other.aclose()


def _expected(index: int) -> list[object]:
    if index == STALE:
        return [*one_turn_log(), *simple_turn(6, 9, "other")]
    return [*one_turn_log(), *simple_turn(6, 2)]


async def _stored(dsn: str, schema: str) -> list[list[object]]:
    backend = PostgresBackend(dsn, schema=schema)
    try:
        out = []
        for index in range(GROUP + 1):
            stored = await backend.load_stored(f"g{index}")
            assert stored is not None
            out.append(list(stored.events))
        return out
    finally:
        await backend.aclose()


async def _created(backend: PostgresBackend) -> None:
    for index in range(GROUP + 1):
        await backend.append_batch(_storage(index), one_turn_log(), False)


async def _append(backend: PostgresBackend, index: int, errors: dict[int, BaseException]) -> None:
    try:
        await backend.append_batch(_storage(index), simple_turn(6, 2), True)
    except SeqMismatchError as exc:
        errors[index] = exc


async def _grouped(backend: PostgresBackend, proxy: PgProxy, dsn: str, schema: str, *, lose_replies: int = 0) -> int:
    """g0..g{GROUP-1} append seq 6..8 while g{GROUP}'s batch holds the committer, then go out as one group (their
    failures must be g{STALE}'s alone); returns the transactions the two groups took (server replies)."""
    errors: dict[int, BaseException] = {}
    with _row_locked(dsn, schema, f"g{GROUP}") as locker:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_append, backend, GROUP, errors)
            await _until_a_lock_wait(locker)
            for index in range(GROUP):
                tg.start_soon(_append, backend, index, errors)
            await anyio.wait_all_tasks_blocked()  # every batch is queued behind the held one
            proxy.drop_commit_reply(lose_replies)
            before = proxy.round_trips
            locker.commit()
    assert sorted(errors) == [STALE]
    assert "another writer stored seq 6 first" in str(errors[STALE]) or "expected 9" in str(errors[STALE])
    assert proxy.commit_replies_dropped == lose_replies
    assert await _stored(dsn, schema) == [_expected(index) for index in range(GROUP + 1)]
    return proxy.round_trips - before


async def test_a_group_of_many_sessions_is_one_transaction_and_a_refused_one_fails_alone(
    proxy: PgProxy, proxy_dsn: str, postgres_dsn: str, schema: str
) -> None:
    backend = PostgresBackend(proxy_dsn, schema=schema, min_size=1, max_size=1)
    try:
        await _created(backend)
        await _stale_writer(postgres_dsn, schema)
        # The held batch's transaction, then one for all the others (the stale one among them).
        assert await _grouped(backend, proxy, postgres_dsn, schema) == 2
        # Not wedged: each session's next batch goes on at its next seq.
        await backend.append_batch(_storage(0), simple_turn(9, 3), True)
    finally:
        await backend.aclose()


async def test_a_lost_reply_of_a_group_is_settled_by_reading_back_every_session(
    proxy: PgProxy, proxy_dsn: str, postgres_dsn: str, schema: str
) -> None:
    backend = PostgresBackend(proxy_dsn, schema=schema, min_size=1, max_size=1)
    try:
        await _created(backend)
        await _stale_writer(postgres_dsn, schema)
        # Both transactions commit on the server and lose their reply: every session's call still returns normally
        # (its batch found stored), exactly once; the stale one is still refused, typed.
        await _grouped(backend, proxy, postgres_dsn, schema, lose_replies=2)
        for index in range(GROUP + 1):
            if index != STALE:
                await backend.append_batch(_storage(index), simple_turn(9, 3), True)
    finally:
        await backend.aclose()


async def test_a_caller_that_leaves_a_queued_batch_is_released_and_the_write_is_settled_first(
    postgres_dsn: str, schema: str
) -> None:
    backend = PostgresBackend(postgres_dsn, schema=schema, min_size=1, max_size=1)
    left = anyio.Event()
    scope = anyio.CancelScope()

    async def abandoned() -> None:
        with scope:
            await backend.append_batch(_storage(0), simple_turn(6, 2), True)
        left.set()

    try:
        await _created(backend)
        with _row_locked(postgres_dsn, schema, f"g{GROUP}") as locker:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_append, backend, GROUP, {})
                await _until_a_lock_wait(locker)
                tg.start_soon(abandoned)
                await anyio.wait_all_tasks_blocked()  # its batch is queued behind the held one
                scope.cancel()
                await left.wait()  # the caller is released while its write still waits for the committer
                locker.commit()
        # The coordinator retries the batch its caller left: the write went on and committed, so the retry reads
        # it back and returns normally instead of being refused as a stale seq.
        await backend.append_batch(_storage(0), simple_turn(6, 2), True)
        await backend.append_batch(_storage(0), simple_turn(9, 3), True)
        stored = await backend.load_stored("g0")
        assert stored is not None and list(stored.events) == [*one_turn_log(), *simple_turn(6, 2), *simple_turn(9, 3)]
    finally:
        await backend.aclose()


async def test_many_sessions_through_a_black_holed_connection_are_settled(
    proxy: PgProxy, proxy_dsn: str, postgres_dsn: str, schema: str
) -> None:
    backend = PostgresBackend(proxy_dsn, schema=schema, client_timeout=1.0, min_size=1, max_size=1)
    try:
        await _created(backend)
        await _stale_writer(postgres_dsn, schema)
        assert proxy.blackhole() >= 1  # the pooled connection now leads nowhere
        errors: dict[int, BaseException] = {}
        with anyio.fail_after(60):  # a safety net for a hang, not a timing assertion
            async with anyio.create_task_group() as tg:
                for index in range(GROUP + 1):
                    tg.start_soon(_append, backend, index, errors)
    finally:
        await backend.aclose()
    assert sorted(errors) == [STALE]
    assert await _stored(postgres_dsn, schema) == [_expected(index) for index in range(GROUP + 1)]
