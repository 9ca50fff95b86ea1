"""Section 12b: the fleet (see :mod:`bench_fleet`) on PostgreSQL: dsh against a plain and a grouped floor (issue #38).

Systems, each cell in a fresh process against one throwaway server (``fsync`` and ``synchronous_commit`` on):

* ``pg_dsh``: ``SessionStore`` + ``PersistenceCoordinator`` + ``PostgresBackend`` (its defaults: a pool of 4); a
  barrier is ``store.flush``;
* ``pg_floor``: the plain floor: events encoded with msgspec as they come; at each barrier one ``INSERT`` of the
  pending events as one JSON-array parameter the server splits, and ``COMMIT``, on a pooled connection (psycopg's
  ``AsyncConnectionPool`` of the same size on asyncio; on trio, where psycopg's async API does not run, its sync
  ``ConnectionPool`` in a worker thread per barrier);
* ``pg_grouped``: the grouped floor: one committer sends every batch queued meanwhile, of every session, as one
  ``INSERT`` in one transaction (a task on an ``AsyncConnection`` on asyncio; a thread on trio).

Per cell, besides :mod:`bench_fleet`'s figures: the server's CPU per barrier (the postgres processes' user + system
time from ``/proc/<pid>/stat``, deltas over the window) and the transactions per barrier (``pg_stat_database``).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict
from typing import Any

import anyio
import anyio.to_thread
import bench_fleet
import msgspec
from bench_common import ENTRY, Report
from bench_fleet import Rate, run_cell
from bench_fleet_systems import CWD, DshSystem, System
from bench_pg_cluster import ThrowawayCluster, find_pg_bin, postgres_unavailable_reason
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore

SYSTEMS = ("pg_dsh", "pg_floor", "pg_grouped")
LOOPS = ("asyncio", "trio")
POOL_SIZE = 4  # PostgresBackend's default max_size: the floors get the same

_TABLE = (
    "CREATE TABLE fleet_events (sid text NOT NULL, seq bigint NOT NULL, body json NOT NULL, PRIMARY KEY (sid, seq))"
)
_INSERT = (
    "INSERT INTO fleet_events (sid, seq, body)"
    " SELECT %(sid)s, (e->>'seq')::bigint, e FROM json_array_elements(%(events)s::json) AS e"
)
_INSERT_GROUP = (
    "INSERT INTO fleet_events (sid, seq, body) SELECT b.sid, (e->>'seq')::bigint, e"
    " FROM unnest(%(sids)s::text[], %(events)s::json[]) AS b(sid, events), json_array_elements(b.events) AS e"
)


# --------------------------------------------------------------------------------------------------------------
# The server's side of a cell: CPU of the postgres processes, transactions


def server_cpu_s(pgdata: str) -> float:
    """User + system seconds of the postmaster and its children (alive now)."""
    with open(os.path.join(pgdata, "postmaster.pid")) as fh:
        postmaster = int(fh.readline())
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        if pid == postmaster or ppid == postmaster:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def _commits(dsn: str) -> int:
    """The next transaction id: every write transaction takes one (reads none), and reading it takes none (the
    statistics views lag by up to a second or more under load, so they cannot count a window)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()
    return int(row[0]) if row else 0


class _Window:
    """Server CPU and commits from the moment every session is open (the agents start) to the end of the cell."""

    def __init__(self, dsn: str, pgdata: str, n: int) -> None:
        self.dsn, self.pgdata, self.n = dsn, pgdata, n
        self.opened = 0
        self.start: tuple[float, int] | None = None
        self.end: tuple[float, int] | None = None

    def opened_one(self) -> None:
        self.opened += 1
        if self.opened == self.n:
            self.start = (server_cpu_s(self.pgdata), _commits(self.dsn))

    def close(self) -> None:
        if self.start is not None and self.end is None:
            self.end = (server_cpu_s(self.pgdata), _commits(self.dsn))


# --------------------------------------------------------------------------------------------------------------
# The systems


class PgDshSystem(DshSystem):
    def __init__(self, dsn: str, window: _Window) -> None:
        from dsh.session_persistence_postgres import PostgresBackend

        self.host = Host()
        self.store = SessionStore(self.host)
        self.backend = PostgresBackend(dsn, schema=f"fleet_{uuid.uuid4().hex[:10]}", max_size=POOL_SIZE)
        self.coordinator = PersistenceCoordinator(self.host, self.backend)
        self.sessions: list[Any] = []
        self.window = window

    async def open(self, index: int) -> Any:
        session = await super().open(index)
        self.window.opened_one()
        return session

    async def aclose(self) -> None:
        self.window.close()
        await super().aclose()


class _Log:
    __slots__ = ("pending", "seq", "sid")

    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.pending: list[bytes] = []
        self.seq = 0


class _FloorBase(System):
    def __init__(self, dsn: str, window: _Window) -> None:
        self.dsn = dsn
        self.window = window
        self.encoder = msgspec.json.Encoder()
        self.asyncio = False  # known in start(), on the loop

    def append(self, handle: Any, etype: str, data: dict[str, Any], seqs: list[int] | None = None) -> int:
        seq = handle.seq
        event: dict[str, Any] = {"type": etype, "seq": seq, "time": int(time.time() * 1000), "data": data}
        if seqs is not None:
            event["sourceEventSeqs"] = seqs
        handle.pending.append(self.encoder.encode(event))
        handle.seq += 1
        return int(seq)

    @staticmethod
    def _take(handle: _Log) -> str:
        payload = b"[" + b",".join(handle.pending) + b"]"
        handle.pending.clear()
        return payload.decode()

    async def open(self, index: int) -> Any:
        log = _Log(f"fleet-{index}")
        self.append(log, "session/header", {"id": log.sid, "cwd": CWD})
        await self.barrier(log)
        self.window.opened_one()
        return log


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class PlainFloor(_FloorBase):
    """One INSERT of the pending events + COMMIT per barrier, on a pooled connection."""

    async def start(self) -> None:
        self.asyncio = _on_asyncio()
        if self.asyncio:
            from psycopg_pool import AsyncConnectionPool

            self.apool = AsyncConnectionPool(self.dsn, min_size=POOL_SIZE, max_size=POOL_SIZE, open=False)
            await self.apool.open(wait=True)
        else:
            from psycopg_pool import ConnectionPool

            self.pool = ConnectionPool(self.dsn, min_size=POOL_SIZE, max_size=POOL_SIZE, open=False)
            await anyio.to_thread.run_sync(lambda: self.pool.open(wait=True))

    def _insert_sync(self, sid: str, events: str) -> None:
        with self.pool.connection() as conn:  # commits at the end of the block
            conn.execute(_INSERT, {"sid": sid, "events": events})

    async def barrier(self, handle: Any) -> None:
        if not handle.pending:
            return
        events = self._take(handle)
        if self.asyncio:
            async with self.apool.connection() as conn:
                await conn.execute(_INSERT, {"sid": handle.sid, "events": events})
        else:
            await anyio.to_thread.run_sync(self._insert_sync, handle.sid, events)

    async def aclose(self) -> None:
        self.window.close()
        if self.asyncio:
            await self.apool.close()
        else:
            await anyio.to_thread.run_sync(self.pool.close)


class GroupedFloor(_FloorBase):
    """One committer: every batch queued meanwhile, of every session, as one INSERT in one transaction."""

    async def start(self) -> None:
        import psycopg

        self.jobs: list[tuple[str, str, Any]] = []
        self.asyncio = _on_asyncio()
        if self.asyncio:
            self.aconn = await psycopg.AsyncConnection.connect(self.dsn)
            self.ready = asyncio.Event()
            self.task = asyncio.get_running_loop().create_task(self._committer())
        else:
            import trio

            self.conn = psycopg.connect(self.dsn)
            self.token = trio.lowlevel.current_trio_token()
            self.queue: queue.SimpleQueue[tuple[str, str, Any] | None] = queue.SimpleQueue()
            self.thread = threading.Thread(target=self._committer_thread, daemon=True)
            self.thread.start()

    async def _committer(self) -> None:
        while True:
            await self.ready.wait()
            self.ready.clear()
            jobs, self.jobs = self.jobs, []
            await self.aconn.execute(_INSERT_GROUP, {"sids": [j[0] for j in jobs], "events": [j[1] for j in jobs]})
            await self.aconn.commit()
            for _sid, _events, fut in jobs:
                if not fut.done():
                    fut.set_result(None)

    def _committer_thread(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            jobs = [first]
            while True:
                try:
                    job = self.queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self.queue.put(None)
                    break
                jobs.append(job)
            self.conn.execute(_INSERT_GROUP, {"sids": [j[0] for j in jobs], "events": [j[1] for j in jobs]})
            self.conn.commit()

            def wake(jobs: list[tuple[str, str, Any]] = jobs) -> None:
                for _sid, _events, event in jobs:
                    event.set()

            self.token.run_sync_soon(wake)

    async def barrier(self, handle: Any) -> None:
        if not handle.pending:
            return
        events = self._take(handle)
        if self.asyncio:
            fut = asyncio.get_running_loop().create_future()
            self.jobs.append((handle.sid, events, fut))
            self.ready.set()
            await fut
        else:
            import trio

            event = trio.Event()
            self.queue.put((handle.sid, events, event))
            await event.wait()

    async def aclose(self) -> None:
        self.window.close()
        if self.asyncio:
            self.task.cancel()
            await self.aconn.close()
        else:
            self.queue.put(None)
            await anyio.to_thread.run_sync(self.thread.join)
            self.conn.close()


def _make(name: str, dsn: str, window: _Window) -> System:
    if name == "pg_dsh":
        return PgDshSystem(dsn, window)
    if name == "pg_floor":
        return PlainFloor(dsn, window)
    if name == "pg_grouped":
        return GroupedFloor(dsn, window)
    raise SystemExit(f"unknown PostgreSQL fleet system {name!r}")


# --------------------------------------------------------------------------------------------------------------
# One cell in a fresh process


def fleet_pg_child(spec: str) -> None:
    """``--_fleet-pg-child SPEC``: one cell (JSON spec) in this process; prints one JSON line."""
    plan = json.loads(spec)
    dsn, pgdata, n = plan["dsn"], plan["pgdata"], plan["n"]
    window = _Window(dsn, pgdata, n)
    system = _make(plan["system"], dsn, window)
    if plan["system"] != "pg_dsh":
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS fleet_events")
            conn.execute(_TABLE)

    def make_system(_name: str, _where: str) -> System:
        return system

    bench_fleet.make_system = make_system  # run_cell builds its system through this name: hand it ours

    async def go() -> dict[str, Any]:
        if not isinstance(system, DshSystem):
            await system.start()  # type: ignore[attr-defined]
        cell = asdict(
            await run_cell(plan["system"], plan["loop"], Rate("realistic", plan["scale"]), n, plan["seconds"], "")
        )
        if window.start is not None and window.end is not None and cell["barriers"]:
            cell["server_cpu_us_per_barrier"] = (window.end[0] - window.start[0]) / cell["barriers"] * 1e6
            cell["transactions_per_barrier"] = (window.end[1] - window.start[1]) / cell["barriers"]
        return cell

    try:
        out: dict[str, Any] = anyio.run(go, backend=plan["loop"])
    except Exception as exc:
        out = {
            "system": plan["system"],
            "loop": plan["loop"],
            "sessions": n,
            "error": f"{type(exc).__name__}: {exc}"[:200],
        }
    print(json.dumps(out), flush=True)


def _cell(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, ENTRY, "--_fleet-pg-child", json.dumps(spec)], capture_output=True, text=True, check=False
    )
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if rows:
        return rows[-1]
    tail = (done.stderr.strip().splitlines() or ["?"])[-1]
    return {"system": spec["system"], "loop": spec["loop"], "sessions": spec["n"], "error": tail[:200]}


# --------------------------------------------------------------------------------------------------------------
# The section


def fleet_pg_section(
    report: Report, *, sessions: tuple[int, ...], seconds: float, scale: float = 1.0, rounds: int = 1
) -> None:
    """12b. dsh on PostgreSQL against the plain and the grouped floor, realistic rate, asyncio and trio."""
    f = report.figures
    print(
        f"\n12b. fleet on PostgreSQL: N = {', '.join(map(str, sessions))}; realistic rate; {seconds:g} s per cell, "
        f"{rounds} round(s)",
        flush=True,
    )
    why = postgres_unavailable_reason()
    bin_dir = find_pg_bin()
    if why is not None or bin_dir is None:
        reason = why or "unavailable: no PostgreSQL server binaries (tools/postgres-setup)"
        report.row("fleet pg", reason, "")
        f["fleet_pg"] = {"skipped": reason}
        return
    cluster = ThrowawayCluster(bin_dir)
    table: dict[str, Any] = {}
    try:
        cluster.start()
        for round_no in range(rounds):
            for loop in LOOPS:
                for n in sessions:
                    for system in SYSTEMS:  # interleaved: a drift of the shared machine hits every system alike
                        spec = {"dsn": cluster.dsn, "pgdata": cluster.data, "loop": loop, "system": system, "n": n}
                        row = _cell({**spec, "seconds": seconds, "scale": scale})
                        key = f"{loop}/n={n}/{system}"
                        table.setdefault(key, []).append(row)
                        _report_row(report, f"fleet pg r{round_no + 1} {key}", row)
    finally:
        cluster.close()
    cells = {key: _median_row(rows) for key, rows in table.items()}
    f["fleet_pg"] = {"sessions": list(sessions), "seconds": seconds, "scale": scale, "rounds": rounds, "cells": cells}
    f["fleet_pg"]["ratios"] = ratios = _ratios(cells, sessions)
    for key, value in ratios.items():
        report.row(f"fleet pg {key}", "n/a" if value is None else f"{value:.2f}")


def _report_row(report: Report, key: str, row: dict[str, Any]) -> None:
    if "error" in row:
        report.row(key, "failed", row["error"][:60])
        return
    report.row(
        key,
        f"{row['p50_ms']:.2f}/{row['p99_ms']:.1f} ms",
        f"served {row['served_per_s']:,.0f}/{row['demanded_per_s']:,.0f} /s, {row['cpu_us_per_barrier']:,.0f} us CPU,"
        f" server {row.get('server_cpu_us_per_barrier', float('nan')):,.0f} us,"
        f" {row.get('transactions_per_barrier', float('nan')):.2f} tx/barrier",
    )


_FIELDS = (
    "served_per_s",
    "demanded_per_s",
    "p50_ms",
    "p99_ms",
    "cpu_us_per_barrier",
    "server_cpu_us_per_barrier",
    "transactions_per_barrier",
)


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in rows if "error" not in r]
    if not good:
        return rows[-1]
    out = dict(good[0])
    for name in _FIELDS:
        values = [r[name] for r in good if name in r]
        if values:
            out[name] = statistics.median(values)
    return out


def _ratios(cells: dict[str, Any], sessions: tuple[int, ...]) -> dict[str, float | None]:
    """dsh and the grouped floor against the plain floor, per loop and N, in the same run; dsh's transactions."""
    out: dict[str, float | None] = {}
    for loop in LOOPS:
        for n in sessions:
            floor = cells.get(f"{loop}/n={n}/pg_floor", {})
            for system in ("pg_dsh", "pg_grouped"):
                row = cells.get(f"{loop}/n={n}/{system}", {})
                for field, name in (
                    ("served_per_s", "served"),
                    ("p99_ms", "p99"),
                    ("cpu_us_per_barrier", "cpu"),
                    ("server_cpu_us_per_barrier", "server cpu"),
                ):
                    a, b = row.get(field), floor.get(field)
                    out[f"{loop}/n={n} {system}/floor {name}"] = a / b if a and b else None
            out[f"{loop}/n={n} pg_dsh transactions per barrier"] = cells.get(f"{loop}/n={n}/pg_dsh", {}).get(
                "transactions_per_barrier"
            )
    return out
