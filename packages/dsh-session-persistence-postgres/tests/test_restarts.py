"""Server restarts (``pg_ctl stop -m fast|immediate`` + start) while several worker processes append.

Each worker writes several sessions at once, so its appends go out in groups of many sessions (one committer
per backend). Every pooled connection is stale after a restart. The backend notices that before it sends anything (an idle
connection with something to read was closed by the server) and takes a fresh one; the append in flight at the
kill is settled by reading back once the server is up. So no append fails, and every acknowledged batch is
stored exactly once (``synchronous_commit=on``). The workers alternate between asyncio and trio.
``DSH_LONG=1`` runs 6 restarts with 8 workers; the default is one restart of each mode with 3 workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import psycopg
import pytest
from dsh.session_persistence.backend import StorageMetadata
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import PostgresBackend

from ._pgserver import PgCluster, running_cluster

LONG = os.environ.get("DSH_LONG") == "1"
WORKERS = 8 if LONG else 3
SESSIONS = 6  # per worker process: its appends go out in groups of many sessions
MODES = ["fast", "immediate"] * (3 if LONG else 1)

WORKER = textwrap.dedent(
    """
    import json, sys, threading
    import anyio
    from dsh.session_persistence.backend import SessionHeader, StorageMetadata
    from dsh.session_persistence.events import OpaqueEvent
    from dsh.session_persistence_postgres import PostgresBackend

    dsn, schema, name, loop, sessions = sys.argv[1:6]
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()

    def batch(start):
        return [OpaqueEvent(type="plugin/n", seq=start + i, time=1, data={"i": start + i}, ignorable=True)
                for i in range(3)]

    async def main():
        backend = PostgresBackend(dsn, schema=schema, retry_timeout=90, max_size=2)
        reports = {}

        async def session(sid):
            # Its later batches go to the backend's group committer with the other sessions' of this process.
            storage = StorageMetadata(SessionHeader(id=sid, created_at=1, cwd="/restart"))
            report = reports[sid]
            while not stop.is_set():
                try:
                    await backend.append_batch(storage, batch(report["seq"]), True)
                except Exception as exc:
                    report["failed"].append(f"{type(exc).__name__}: {exc}")
                    return  # the session's state is unknown to this worker now
                report["ok"] += 1
                report["seq"] += 3

        try:
            for k in range(int(sessions)):
                sid = f"{name}-{k}"
                storage = StorageMetadata(SessionHeader(id=sid, created_at=1, cwd="/restart"))
                await backend.append_batch(storage, batch(0), False)
                reports[sid] = {"ok": 1, "seq": 3, "failed": []}
            print("ready", flush=True)
            async with anyio.create_task_group() as tg:
                for sid in reports:
                    tg.start_soon(session, sid)
        finally:
            await backend.aclose()
        print(json.dumps(reports), flush=True)

    anyio.run(main, backend=loop)
    """
)


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    with running_cluster() as c:
        yield c


def _stored_total(dsn: str, schema: str) -> int:
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(f'SELECT coalesce(sum(next_seq), 0) FROM "{schema}".dsh_sessions'.encode()).fetchone()
    except psycopg.OperationalError:
        return -1  # still recovering
    return int(row[0]) if row is not None else 0


def _wait_for_progress(dsn: str, schema: str, beyond: int) -> int:
    """Poll until the workers have stored more than ``beyond`` events (a safety net bounds it)."""
    limit = time.monotonic() + 120
    while time.monotonic() < limit:
        total = _stored_total(dsn, schema)
        if total > beyond:
            return total
        time.sleep(0.05)
    raise AssertionError(f"the workers made no progress past {beyond} events within the safety net")


def test_restarts_fail_no_append(cluster: PgCluster) -> None:
    schema = f"restart_{uuid.uuid4().hex[:10]}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, cluster.dsn, schema, f"w{n}", "trio" if n % 2 else "asyncio", str(SESSIONS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(WORKERS)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
        total = _wait_for_progress(cluster.dsn, schema, 30 * WORKERS * SESSIONS)
        for mode in MODES:
            cluster.stop(mode)
            cluster.start()
            total = _wait_for_progress(cluster.dsn, schema, total + 30 * WORKERS * SESSIONS)
    finally:
        outputs = [proc.communicate(input="", timeout=180) for proc in procs]
    reports: dict[str, Any] = {}
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        reports.update(json.loads(out.strip().splitlines()[-1]))
    failed = [f for report in reports.values() for f in report["failed"]]
    print(
        f"{len(MODES)} restarts, {WORKERS} workers, {sum(r['ok'] for r in reports.values())} appends, {len(failed)} failed"
    )
    assert failed == []
    # Every acknowledged batch is stored exactly once, contiguous.
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT s.id, s.next_seq, count(e.seq), max(e.seq) FROM "{schema}".dsh_sessions s '
            f'JOIN "{schema}".dsh_events e ON e.session_id = s.id GROUP BY s.id, s.next_seq ORDER BY s.id'.encode()
        ).fetchall()
    stored = {sid: (next_seq, count, top) for sid, next_seq, count, top in rows}
    assert len(reports) == WORKERS * SESSIONS
    for sid, report in reports.items():
        seq = report["seq"]
        assert stored[sid] == (seq, seq, seq - 1), (sid, report)
    assert "automatic recovery in progress" in (cluster.root / "server.log").read_text(errors="replace")


@pytest.mark.anyio
async def test_stale_pooled_connections_are_replaced_before_anything_is_sent(cluster: PgCluster) -> None:
    """After a restart the pooled connection is dead; with no time to retry, reads and writes still succeed.

    ``retry_timeout=0`` leaves no room for a retry or a read-back: only the free check of an idle connection
    (its socket has the server's goodbye, or EOF, to read) can make these calls succeed.
    """
    schema = f"stale_{uuid.uuid4().hex[:10]}"
    storage = StorageMetadata(meta("stale"))
    backend = PostgresBackend(cluster.dsn, schema=schema, retry_timeout=0, min_size=1, max_size=1)
    try:
        await backend.append_batch(storage, one_turn_log(), False)
        # A read after a fast restart, a write after an immediate one (then each the other way round).
        for read_mode, write_mode, seq in (("fast", "immediate", 6), ("immediate", "fast", 9)):
            await anyio.to_thread.run_sync(cluster.stop, read_mode)
            await anyio.to_thread.run_sync(cluster.start)
            stored = await backend.load_stored("stale")
            assert stored is not None and len(stored.events) == seq
            await anyio.to_thread.run_sync(cluster.stop, write_mode)
            await anyio.to_thread.run_sync(cluster.start)
            await backend.append_batch(storage, simple_turn(seq, seq), True)
    finally:
        await backend.aclose()
