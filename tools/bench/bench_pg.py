"""Section 7: the PostgreSQL backend: the write workload, loads, appends on asyncio and trio, writer processes, list."""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
from bench_common import ENTRY, QUICK, Config, Report, WriteRun, _fmt, _ratio, median
from bench_pg_cluster import (
    ThrowawayCluster,
    _postgres,
    load_full_stack,
    open_server,
    pg_drop_schemas,
    pg_server_version,
    run_postgres,
    write_pg_session,
)
from bench_workload import CWD, Op
from dsh.session_persistence.backend import SessionHeader, StorageMetadata

# PostgreSQL fleet figures: appends/s on asyncio vs trio, N writer processes, list at many sessions.

PG_APPEND_EVENTS = 3  # one small turn per append


def _pg_turn(seq: int) -> list[Any]:
    from dsh.session_persistence.events import OpaqueEvent

    return [
        OpaqueEvent(type="bench/e", seq=seq + i, time=1, data={"i": seq + i, "text": "x" * 200}, ignorable=True)
        for i in range(PG_APPEND_EVENTS)
    ]


async def pg_append_run(dsn: str, schema: str, session_id: str, appends: int) -> float:
    """``appends`` sequential ``append_batch`` calls (3 events each) on one session: seconds for them."""
    backend = _postgres(dsn, schema)
    storage = StorageMetadata(SessionHeader(id=session_id, created_at=1_700_000_000_000, cwd=CWD), 0)
    try:
        await backend.append_batch(storage, _pg_turn(0), False)
        start = time.perf_counter()
        for n in range(1, appends + 1):
            await backend.append_batch(storage, _pg_turn(n * PG_APPEND_EVENTS), True)
        return time.perf_counter() - start
    finally:
        await backend.aclose()


def _pg_writer_child(dsn: str, schema: str, session_id: str, appends: str) -> None:
    """One writer process (``--_pg-writer-child``): waits for a line on stdin, appends, prints its seconds."""
    sys.stdin.readline()
    seconds = anyio.run(pg_append_run, dsn, schema, session_id, int(appends))
    print(json.dumps({"seconds": seconds}), flush=True)


def pg_processes(dsn: str, schema: str, processes: int, appends: int) -> dict[str, Any]:
    """``processes`` writer processes, one session each, started together: appends/s and events/s overall."""
    cmd = [sys.executable, ENTRY, "--_pg-writer-child", dsn, schema]
    procs = [
        subprocess.Popen([*cmd, f"p{n}", str(appends)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for n in range(processes)
    ]
    time.sleep(0.5)  # let every interpreter import before the go signal
    start = time.perf_counter()
    outs = [proc.communicate(input="go\n", timeout=600)[0] for proc in procs]
    wall = time.perf_counter() - start
    for proc in procs:
        if proc.returncode != 0:
            raise RuntimeError(f"a postgres writer process failed ({proc.returncode})")
    # The slowest writer's own time: every process appended concurrently for (at most) that long.
    slowest = max(json.loads(out.strip().splitlines()[-1])["seconds"] for out in outs)
    total = processes * appends
    return {
        "processes": processes,
        "appends_each": appends,
        "wall_s": wall,
        "appends_per_s": total / slowest,
        "events_per_s": total * PG_APPEND_EVENTS / slowest,
    }


def pg_fill_sessions(dsn: str, schema: str, count: int) -> None:
    """``count`` header-only sessions inserted by SQL (the backend's table layout), for the list figure."""
    import psycopg
    from dsh.session_persistence.backend import header_to_builtins

    template = json.dumps(header_to_builtins(SessionHeader(id="__ID__", created_at=1_700_000_000_000, cwd=CWD)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".dsh_sessions (id, header, inherited_event_count, next_seq, revision, '
            f"created_revision) SELECT 'l' || g, replace(%s, '\"__ID__\"', '\"l' || g || '\"')::json, 0, 0, "
            f"nextval('\"{schema}\".dsh_revisions'), g FROM generate_series(1, %s) AS g",
            (template, count),
        )
        conn.execute(f'ANALYZE "{schema}".dsh_sessions')


async def postgres_fleet(
    dsn: str, cfg: Config, tag: str, schemas: list[str], pg: dict[str, Any], report: Report
) -> None:
    """Appends/s on asyncio and trio (worker threads), N writer processes, and list() at many sessions."""
    appends = 200 if cfg is QUICK else 2000
    loops: dict[str, float] = {}
    for loop in ("asyncio", "trio"):
        times = []
        for rep in range(cfg.reps):
            schema = f"{tag}_{loop}{rep}"
            schemas.append(schema)
            runner = functools.partial(anyio.run, pg_append_run, dsn, schema, "s", appends, backend=loop)
            times.append(await anyio.to_thread.run_sync(runner))
        loops[loop] = appends / median(times)
    pg["appends_per_s"] = loops
    pg["appends_per_s_trio_vs_asyncio"] = loops["trio"] / loops["asyncio"]
    report.row("appends/s [postgres, asyncio] (3 events, one session)", _fmt(loops["asyncio"]))
    report.row(
        "appends/s [postgres, trio]", _fmt(loops["trio"]), f"trio/asyncio {loops['trio'] / loops['asyncio']:.2f}"
    )
    schema = f"{tag}_procs"
    schemas.append(schema)
    warm = _postgres(dsn, schema)
    await warm.list()  # the schema exists before the writers start
    await warm.aclose()
    procs = await anyio.to_thread.run_sync(pg_processes, dsn, schema, 8, appends // 2)
    pg["processes"] = procs
    report.row(
        "appends/s [postgres, 8 processes]", _fmt(procs["appends_per_s"]), f"{_fmt(procs['events_per_s'])} events/s"
    )
    count = cfg.list_count * 10  # full: 100k sessions
    schema = f"{tag}_list"
    schemas.append(schema)
    backend = _postgres(dsn, schema)
    try:
        await backend.list()
        await anyio.to_thread.run_sync(pg_fill_sessions, dsn, schema, count)
        times = []
        for _ in range(max(1, cfg.list_reps)):
            start = time.perf_counter()
            listed = await backend.list()
            times.append(time.perf_counter() - start)
            if len(listed) != count:
                raise AssertionError(f"postgres list returned {len(listed)} sessions, expected {count}")
        from dsh.session_persistence.backend import ListQuery

        page_times = []
        for _ in range(max(5, cfg.list_reps)):
            gc.collect()  # not the collection of the 100k-header list above
            start = time.perf_counter()
            page = await backend.list_page(ListQuery(limit=21))  # the coordinator asks one row more than 20
            page_times.append(time.perf_counter() - start)
            if len(page) != 21:
                raise AssertionError(f"postgres list_page returned {len(page)} rows, expected 21")
    finally:
        await backend.aclose()
    pg["list"] = {"sessions": count, "seconds": median(times), "page_20_seconds": median(page_times)}
    report.row(f"list s [postgres] ({count} sessions, all headers)", _fmt(median(times), ".3f"))
    report.row(f"list_page(20) s [postgres] ({count} sessions, recent first)", _fmt(median(page_times), ".4f"))


def _sealed_figures(plain: list[WriteRun], sealed: list[WriteRun], load_sealed: float, load_plain: float) -> Any:
    """Sealed next to plaintext PostgreSQL (issue #28): each figure's two medians and their ratio sealed/plaintext."""
    out: dict[str, Any] = {}
    for key, value in (("write_events_per_s", lambda r: r.events / r.seconds), ("reload_s", lambda r: r.reload_s)):
        a = median([value(r) for r in plain if value(r) is not None])
        b = median([value(r) for r in sealed if value(r) is not None])
        out[key] = {"plaintext": a, "sealed": b, "ratio": _ratio(b, a)}
    out["load"] = {"plaintext": load_plain, "sealed": load_sealed, "ratio": _ratio(load_sealed, load_plain)}
    return out


async def postgres_section(args: argparse.Namespace, cfg: Config, ops: list[Op], report: Report, scratch: str) -> None:
    """Section 7: the write workload and loads through ``PostgresBackend``, next to the JSONL figures of this run.

    Then the fleet figures (appends/s on asyncio and trio, 8 writer processes, list at many sessions). The
    server is ``--postgres-dsn`` or a throwaway cluster started
    here when the server binaries are found; otherwise every postgres figure is ``None`` ("unavailable").
    """
    f = report.figures
    pg: dict[str, Any] = {"status": "skipped" if args.no_postgres else "ok"}
    f["postgres"] = pg
    first_load = cfg.load_sizes[0]  # the 10 MB session (--quick: 1 MB)
    cluster: ThrowawayCluster | None = None
    dsn: str | None = args.postgres_dsn
    if pg["status"] == "ok":
        dsn, cluster, reason = open_server(dsn)
        if reason is None and dsn is not None:
            try:
                pg["server_version"] = pg_server_version(dsn)
            except Exception as exc:
                reason = f"unavailable: cannot connect: {type(exc).__name__}: {exc}"
        if reason is not None:
            pg["status"] = " ".join(reason.split())  # one line: libpq errors span several
            if cluster is not None:
                cluster.close()
                cluster = None
    label, target = first_load
    print(f"\n7. PostgreSQL backend (full stack): {pg['status']}", flush=True)
    eps_pg = reload_pg = load_pg = None
    schemas: list[str] = []
    try:
        if dsn is not None and pg["status"] == "ok":
            pg["server"] = "--postgres-dsn" if args.postgres_dsn else "throwaway cluster (initdb + pg_ctl, defaults)"
            tag = f"bench_{os.getpid()}"
            runs: list[WriteRun] = []
            sealed_runs: list[WriteRun] = []  # issue #28: the same workload with sealed bodies, interleaved
            for rep in range(cfg.reps):
                for sealed, out in ((False, runs), (True, sealed_runs)):
                    schema = f"{tag}_{'s' if sealed else 'w'}{rep}"
                    schemas.append(schema)
                    gc.collect()
                    out.append(await run_postgres(ops, dsn, schema, sealed=sealed))
            eps_pg = median([r.events / r.seconds for r in runs])
            reload_pg = median([r.reload_s for r in runs if r.reload_s is not None])
            pg["bytes_on_disk"] = runs[0].bytes
            pg["write_seconds"] = median([r.seconds for r in runs])
            # Load: the write-workload session, and a session of the first JSONL load size written through the
            # backend (one transaction per 50 turns, so it is cheap); MB/s counts raw JSON bytes, as for JSONL.
            raw_bytes = f["workload"]["raw_json_bytes"]
            loads: dict[str, Any] = {
                "write_workload": {
                    "raw_json_bytes": raw_bytes,
                    "events": runs[0].events,
                    "mb_per_s": {
                        "postgres": raw_bytes / 1e6 / reload_pg,
                        "jsonl": _ratio(raw_bytes / 1e6, f["reload_s"]["dsh"]),
                    },
                }
            }
            schema = f"{tag}_load"
            schemas.append(schema)
            session_id = f"load-{label}"
            n_events, raw = await write_pg_session(dsn, schema, session_id, target)
            times: list[float] = []
            for _ in range(cfg.reps):
                gc.collect()
                seconds, loaded = await load_full_stack(_postgres(dsn, schema), session_id, warm=True)
                if loaded != n_events:
                    raise AssertionError(f"postgres load returned {loaded} events, expected {n_events}")
                times.append(seconds)
            load_pg = raw / 1e6 / median(times)
            loads[label] = {
                "raw_json_bytes": raw,
                "events": n_events,
                "mb_per_s": {"postgres": load_pg, "jsonl": f["load"][label]["mb_per_s"]["dsh"]},
            }
            for entry in loads.values():
                entry["ratio"] = _ratio(entry["mb_per_s"]["postgres"], entry["mb_per_s"]["jsonl"])
            pg["load"] = loads
            schema = f"{tag}_load_sealed"
            schemas.append(schema)
            await write_pg_session(dsn, schema, session_id, target, sealed=True)
            sealed_times: list[float] = []
            for _ in range(cfg.reps):
                gc.collect()
                seconds, loaded = await load_full_stack(_postgres(dsn, schema, sealed=True), session_id, warm=True)
                if loaded != n_events:
                    raise AssertionError(f"sealed postgres load returned {loaded} events, expected {n_events}")
                sealed_times.append(seconds)
            pg["sealed"] = _sealed_figures(runs, sealed_runs, raw / 1e6 / median(sealed_times), load_pg)
            await postgres_fleet(dsn, cfg, tag, schemas, pg, report)
    finally:
        if schemas and dsn is not None and cluster is None:
            pg_drop_schemas(dsn, schemas)  # a server we did not start keeps no bench data
        if cluster is not None:
            cluster.close()
    pg["load_mb_per_s_session"] = (
        f"{label}: the JSONL {label} load session's events, written through the backend (one transaction per 50 "
        "turns); the write-workload session's load is under postgres.load.write_workload"
    )
    f["write_events_per_s"]["postgres"] = eps_pg
    f["reload_s"]["postgres"] = reload_pg
    f["load_mb_per_s"]["postgres"] = load_pg
    ratios = {
        "write_vs_jsonl": _ratio(eps_pg, f["write_events_per_s"]["dsh"]),
        "reload_vs_jsonl": _ratio(reload_pg, f["reload_s"]["dsh"]),
        "load_vs_jsonl": _ratio(load_pg, f["load"][label]["mb_per_s"]["dsh"]),
    }
    f["postgres_ratio"] = ratios
    note = "" if pg["status"] == "ok" else pg["status"]
    report.row("write events/s [postgres]", _fmt(eps_pg), note or f"server {pg.get('server_version')}")
    report.row("ratio postgres/jsonl write events/s", _fmt(ratios["write_vs_jsonl"], ".2f"), note)
    report.row("reload s [postgres] (write workload)", _fmt(reload_pg, ".3f"), note)
    report.row("ratio postgres/jsonl reload s", _fmt(ratios["reload_vs_jsonl"], ".2f"), note)
    if pg.get("load"):
        ww = pg["load"]["write_workload"]
        report.row("load MB/s [postgres] (write workload)", _fmt(ww["mb_per_s"]["postgres"], ".1f"))
        report.row("load MB/s [jsonl] (write workload)", _fmt(ww["mb_per_s"]["jsonl"], ".1f"))
    mb = f"{pg['load'][label]['raw_json_bytes'] / 1e6:.1f} MB JSON" if pg.get("load") else "unavailable"
    report.row(f"load MB/s [postgres] ({label}: {mb})", _fmt(load_pg, ".1f"), note)
    report.row(f"ratio postgres/jsonl load MB/s ({label})", _fmt(ratios["load_vs_jsonl"], ".2f"), note)
    if pg.get("bytes_on_disk") is not None:
        report.row("bytes on disk [postgres] (tables+indexes)", _fmt(pg["bytes_on_disk"]), "WAL not counted")
    sealed = pg.get("sealed")
    if sealed:
        for what, key in (("write events/s", "write_events_per_s"), ("reload s", "reload_s"), ("load MB/s", "load")):
            report.row(f"{what} [postgres sealed]", _fmt(sealed[key]["sealed"], ".3f" if key == "reload_s" else ",.1f"))
            report.row(f"{what} postgres sealed/plaintext", _fmt(sealed[key]["ratio"], ".2f"))
