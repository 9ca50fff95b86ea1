"""Behind pgbouncer in transaction mode: clients share two server connections, statement by transaction.

With ``connection_kwargs={"prepare_threshold": None}`` (no server-side prepared statements, which a server
connection handed to another client would not have) every primitive works: each is one transaction, its
timeouts are ``SET LOCAL`` (never session state that would leak to another client), and nothing relies on
session-level state.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from dsh.session_persistence.backend import ListQuery, StorageMetadata
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import PostgresBackend
from psycopg_pool import ConnectionPool

from ._pgbouncer import Bouncer, running_bouncer
from ._pgserver import PgCluster

pytestmark = pytest.mark.anyio

TRANSACTION_MODE = {"prepare_threshold": None}


@pytest.fixture(scope="module")
def bouncer(pg_cluster: PgCluster) -> Iterator[Bouncer]:
    with running_bouncer(pg_cluster, pool_size=2) as b:
        yield b


async def test_many_clients_share_two_server_connections(bouncer: Bouncer) -> None:
    schema = f"bouncer_{uuid.uuid4().hex[:10]}"
    backends = [
        PostgresBackend(bouncer.dsn, schema=schema, connection_kwargs=TRANSACTION_MODE, max_size=2) for _ in range(4)
    ]
    rounds = 12

    async def writer(index: int, backend: PostgresBackend) -> None:
        storage = StorageMetadata(meta(f"b{index}"))
        await backend.append_batch(storage, one_turn_log(), False)
        for n in range(rounds):
            await backend.append_batch(storage, simple_turn(6 + 3 * n, n + 2), True)
            stored = await backend.load_stored_from(f"b{index}", 6 + 3 * n)
            assert stored is not None and list(stored.events) == simple_turn(6 + 3 * n, n + 2)

    try:
        async with anyio.create_task_group() as tg:
            for index, backend in enumerate(backends):
                tg.start_soon(writer, index, backend)
        expected = one_turn_log() + [e for n in range(rounds) for e in simple_turn(6 + 3 * n, n + 2)]
        for index in range(len(backends)):
            stored = await backends[0].load_stored(f"b{index}")
            assert stored is not None and list(stored.events) == expected
        assert sorted(h.id for h in await backends[1].list()) == [f"b{i}" for i in range(len(backends))]
        await backends[2].rewrite(StorageMetadata(meta("b0")), one_turn_log())
        rewritten = await backends[3].load_stored("b0")
        assert rewritten is not None and list(rewritten.events) == one_turn_log()
    finally:
        for backend in backends:
            await backend.aclose()


async def test_groups_of_many_sessions_through_pgbouncer(bouncer: Bouncer) -> None:
    """Later batches of 24 sessions at once from one backend: the group committer's transactions (many sessions
    each) pass pgbouncer's transaction pooling like any other primitive, and every batch is stored once."""
    schema = f"bouncer_{uuid.uuid4().hex[:10]}"
    backend = PostgresBackend(bouncer.dsn, schema=schema, connection_kwargs=TRANSACTION_MODE, max_size=2)
    sessions, rounds = 24, 6
    try:
        for index in range(sessions):
            await backend.append_batch(StorageMetadata(meta(f"g{index}")), one_turn_log(), False)
        for n in range(rounds):
            async with anyio.create_task_group() as tg:
                for index in range(sessions):
                    tg.start_soon(
                        backend.append_batch, StorageMetadata(meta(f"g{index}")), simple_turn(6 + 3 * n, n + 2), True
                    )
        expected = one_turn_log() + [e for n in range(rounds) for e in simple_turn(6 + 3 * n, n + 2)]
        for index in range(sessions):
            stored = await backend.load_stored(f"g{index}")
            assert stored is not None and list(stored.events) == expected
    finally:
        await backend.aclose()


def _frontend_messages(traces: Path) -> list[str]:
    """The message types the client sent, from libpq's protocol traces (``time  F  length  Type  ...``)."""
    return [
        line.split("\t")[3]
        for path in sorted(traces.iterdir())
        for line in path.read_text().splitlines()
        if line.split("\t")[1:2] == ["F"]
    ]


async def test_every_primitive_is_one_simple_query_message(pg_cluster: PgCluster) -> None:
    """Each primitive sends one ``Query`` message: one round trip, one ``ReadyForQuery``, nothing after it.

    This is what keeps a transaction-mode pooler sound: psycopg's pipeline mode ends with ``Sync`` then ``Flush``,
    and a ``Flush`` reaching pgbouncer 1.18 after the ``Sync``'s reply leaks a server connection (the test above
    hung that way, 2 runs in 15 on a loaded machine). Proven on the wire: libpq's protocol trace of every pooled
    connection the backend uses, for every primitive.
    """
    traces = Path(tempfile.mkdtemp(prefix="dsh-pgtrace-"))
    files: list[Any] = []

    def trace(conn: psycopg.Connection[Any]) -> None:
        f = open(traces / f"{len(files)}.trace", "w")  # noqa: SIM115 - closed after the pool
        files.append(f)
        conn.pgconn.trace(f.fileno())

    pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
        pg_cluster.dsn, kwargs=TRANSACTION_MODE, configure=trace, min_size=1, max_size=1, open=True
    )
    schema = f"trace_{uuid.uuid4().hex[:10]}"
    try:
        backend = PostgresBackend(schema=schema, pool=pool)
        storage = StorageMetadata(meta("t"))
        await backend.append_batch(storage, one_turn_log(), False)
        await backend.append_batch(storage, simple_turn(6, 2), True)
        assert await backend.load_stored("t") is not None
        assert await backend.load_stored_from("t", 6) is not None
        await backend.list()
        await backend.rewrite(storage, one_turn_log())
        await backend.delete("t")
        await backend.aclose()
    finally:
        pool.close()
        for f in files:
            f.close()
    sent = _frontend_messages(traces)
    shutil.rmtree(traces, ignore_errors=True)
    # 7 primitives, plus the durability check of the one pooled connection on its first use.
    assert sent.count("Query") == 7 + 1, sent
    assert set(sent) <= {"Query", "Terminate"}, sent


# -- no server-side prepared statement, whatever the caller's connection settings ----------------------------


async def _read_everything(backend: PostgresBackend, session_id: str, times: int) -> None:
    for _ in range(times):
        assert await backend.read_stored_revision(session_id) is not None
        assert [h.id for h in await backend.list()] == [session_id]
        assert len(await backend.list_snapshots()) == 1
        assert len(await backend.list_page(ListQuery(limit=5))) == 1
        assert len(await backend.list_page(ListQuery(order="created", since=0))) == 1
        assert await backend.load_stored(session_id) is not None


async def test_no_primitive_is_prepared_after_repeated_use(pg_cluster: PgCluster) -> None:
    """psycopg prepares a plain ``execute`` after five uses on one connection (``Parse`` with a statement name);
    every read is sent as one simple ``Query`` message instead, even with psycopg's default settings."""
    traces = Path(tempfile.mkdtemp(prefix="dsh-pgtrace-"))
    files: list[Any] = []

    def trace(conn: psycopg.Connection[Any]) -> None:
        f = open(traces / f"{len(files)}.trace", "w")  # noqa: SIM115 - closed after the pool
        files.append(f)
        conn.pgconn.trace(f.fileno())

    # No prepare_threshold=None: the caller's connections keep psycopg's default (prepare after 5 uses).
    pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
        pg_cluster.dsn, configure=trace, min_size=1, max_size=1, open=True
    )
    schema = f"prep_{uuid.uuid4().hex[:10]}"
    try:
        backend = PostgresBackend(schema=schema, pool=pool)
        await backend.append_batch(StorageMetadata(meta("p")), one_turn_log(), False)
        await _read_everything(backend, "p", 8)
        await backend.aclose()
    finally:
        pool.close()
        for f in files:
            f.close()
    sent = _frontend_messages(traces)
    shutil.rmtree(traces, ignore_errors=True)
    assert "Parse" not in sent, sorted(set(sent))
    assert sent.count("Query") >= 1 + 6 * 8, sent


async def test_reads_through_pgbouncer_without_caller_settings(bouncer: Bouncer) -> None:
    """320 calls of each read through a transaction-mode pooler, no ``prepare_threshold`` from the caller:
    none fails (a prepared statement would land on a server connection another client then gets)."""
    schema = f"bouncer_{uuid.uuid4().hex[:10]}"
    backends = [PostgresBackend(bouncer.dsn, schema=schema, max_size=2) for _ in range(4)]
    failures: list[BaseException] = []

    async def reader(backend: PostgresBackend) -> None:
        for _ in range(80):
            for call in (
                lambda: backend.read_stored_revision("r"),
                backend.list,
                lambda: backend.list_page(ListQuery(limit=10)),
            ):
                try:
                    await call()
                except Exception as exc:
                    failures.append(exc)

    try:
        await backends[0].append_batch(StorageMetadata(meta("r")), one_turn_log(), False)
        async with anyio.create_task_group() as tg:
            for backend in backends:
                tg.start_soon(reader, backend)
    finally:
        for backend in backends:
            await backend.aclose()
    assert failures == []
