"""The server dies (``pg_ctl stop -m immediate``: no shutdown checkpoint, WAL recovery at restart) mid-append.

After the restart every acknowledged batch is there, and the batch in flight is wholly there or wholly absent;
the in-flight append settles by reading back (or, if the server stays down, is reported in doubt).
Each test runs its own cluster, so killing it disturbs no other test.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import anyio
import psycopg
import pytest
from dsh.session_persistence.backend import SessionWriteInDoubtError, StorageMetadata
from dsh.session_persistence.events import OpaqueEvent, SessionEvent
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import PostgresBackend

from ._pgserver import PgCluster, running_cluster
from ._sealed import sealed_factory

SCHEMA = "crash"

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True, params=["plain", "sealed"])
def sealing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: on a plaintext backend and on a sealed one (this module's ``PostgresBackend`` name bound
    to the real class with ``encryption=`` given)."""
    if request.param == "sealed":
        monkeypatch.setitem(globals(), "PostgresBackend", sealed_factory())
    return str(request.param)


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    with running_cluster() as c:
        yield c


def _blobs(start: int, count: int, size: int) -> list[SessionEvent]:
    # Distinct payloads per event, so the batch is big on the wire and in the WAL.
    return [
        OpaqueEvent(
            type="plugin/blob", seq=start + i, time=7, data={"i": i, "v": f"{i:08d}" * (size // 8)}, ignorable=True
        )
        for i in range(count)
    ]


async def _wait_for(dsn: str, query: str) -> None:
    """Poll ``pg_stat_activity`` until ``query`` returns true (a safety net bounds it, never a timing assertion)."""
    probe = await anyio.to_thread.run_sync(functools.partial(psycopg.connect, dsn, autocommit=True))
    try:
        with anyio.fail_after(60):
            while True:
                row = await anyio.to_thread.run_sync(lambda: probe.execute(query.encode()).fetchone())
                if row is not None and row[0]:
                    return
                await anyio.sleep(0.01)
    finally:
        probe.close()


async def _write_acknowledged(dsn: str) -> tuple[StorageMetadata, list[SessionEvent]]:
    storage = StorageMetadata(meta("crash"))
    backend = PostgresBackend(dsn, schema=SCHEMA)
    try:
        await backend.append_batch(storage, one_turn_log(), False)
        await backend.append_batch(storage, simple_turn(6, 2), True)
    finally:
        await backend.aclose()
    return storage, one_turn_log() + simple_turn(6, 2)


async def _append_in_flight(
    cluster: PgCluster,
    storage: StorageMetadata,
    batch: list[SessionEvent],
    in_flight_query: str,
    *,
    restart: bool,
    retry_timeout: float,
) -> BaseException | None:
    """Start appending ``batch``, kill the server once ``in_flight_query`` holds (and restart it if asked).

    Returns the append's error, or ``None`` if it returned normally (settled by reading back after the restart).
    """
    backend = PostgresBackend(cluster.dsn, schema=SCHEMA, retry_timeout=retry_timeout, pool_timeout=5)
    outcome: dict[str, BaseException | None] = {}

    async def append() -> None:
        try:
            await backend.append_batch(storage, batch, True)
        except Exception as exc:
            outcome["error"] = exc
        else:
            outcome["error"] = None

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            await _wait_for(cluster.dsn, in_flight_query)
            await anyio.to_thread.run_sync(cluster.stop, "immediate")
            if restart:
                await anyio.to_thread.run_sync(cluster.start)
    finally:
        await backend.aclose()
    return outcome["error"]


async def _stored_after_restart(cluster: PgCluster) -> list[SessionEvent]:
    if not cluster.is_running():
        await anyio.to_thread.run_sync(cluster.start)
    # The kill was real: the restarted server had to replay its WAL.
    assert "automatic recovery in progress" in (cluster.root / "server.log").read_text(errors="replace")
    backend = PostgresBackend(cluster.dsn, schema=SCHEMA)
    try:
        stored = await backend.load_stored("crash")
        assert stored is not None
        events = list(stored.events)
        # The session row and its events agree: the next append continues right after what is stored.
        await backend.append_batch(StorageMetadata(meta("crash")), simple_turn(len(events), 99, "after"), True)
    finally:
        await backend.aclose()
    return events


async def test_kill_while_a_batch_waits_inside_its_transaction(cluster: PgCluster) -> None:
    """Gate: another transaction holds the events table, so the batch stops mid-statement; then the kill.

    The server stays down longer than ``retry_timeout``: the write cannot be settled, so it is reported in
    doubt (typed, the connection error chained), and after the restart it is absent.
    """
    storage, acked = await _write_acknowledged(cluster.dsn)
    batch = _blobs(len(acked), 200, 64)
    gate = await anyio.to_thread.run_sync(psycopg.connect, cluster.dsn)
    try:
        await anyio.to_thread.run_sync(gate.execute, f'LOCK TABLE "{SCHEMA}".dsh_events IN EXCLUSIVE MODE'.encode())
        # The append has bumped next_seq under its row lock and now waits for the table: in flight for sure.
        error = await _append_in_flight(
            cluster,
            storage,
            batch,
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%UPDATE%SET next_seq = %next_seq + %' AND pid <> pg_backend_pid()",
            restart=False,
            retry_timeout=0.5,
        )
    finally:
        await anyio.to_thread.run_sync(gate.close)
    assert isinstance(error, SessionWriteInDoubtError), error  # never acknowledged, and typed
    assert isinstance(error.__cause__, psycopg.OperationalError)
    stored = await _stored_after_restart(cluster)
    assert stored == acked  # every acknowledged batch survived; the unacknowledged one left nothing behind


async def test_kill_during_a_large_batch_settles_by_reading_back(cluster: PgCluster) -> None:
    """No gate: a large batch is being stored when the server dies and comes back at once.

    The backend reads back what the restarted server holds and either finds the batch (committed before the
    kill) or sends it again: the append returns normally and the batch is stored exactly once.
    """
    storage, acked = await _write_acknowledged(cluster.dsn)
    batch = _blobs(len(acked), 1500, 2048)
    error = await _append_in_flight(
        cluster,
        storage,
        batch,
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%UPDATE%SET next_seq = %next_seq + %' AND pid <> pg_backend_pid()",
        restart=True,
        retry_timeout=60,
    )
    assert error is None, error
    stored = await _stored_after_restart(cluster)
    assert stored == acked + batch
