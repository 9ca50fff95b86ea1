"""Sections 1 and 6: durable write throughput of dsh (full stack) next to the raw floor and the peers; bytes on disk."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import queue
import shutil
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import msgspec
import zstandard
from bench_common import (
    Config,
    Report,
    WriteRun,
    _fmt,
    _jsonl,
    _ratio,
    _timed_reps,
    _tree_size,
    median,
    process_cpu_s,
)
from bench_peers import peer_status, run_langgraph, run_sqlitesession
from bench_workload import CWD, FLUSH, SESSION_ID, Op, batches, raw_json_bytes, workload
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore


async def run_dsh(ops: list[Op], where: str, *, pack_chunks: bool = True, resume: bool = False) -> WriteRun:
    """Full stack: Host + SessionStore appends + PersistenceCoordinator (write-behind) + JsonlBackend(zstd).

    At each durable point the bench does what the checkpoint policy does: ``store.flush(session)`` shielded.
    ``resume``: also time a load right after a preview (section 2 reports it; section 1 does not).
    """
    cpu: list[float] = []
    seconds, events = await full_stack_write(ops, _jsonl(where, pack_chunks=pack_chunks), cpu=cpu)
    # Reload: a fresh host and coordinator (a cold process), end to end.
    reload_s = await _dsh_reload(where, pack_chunks, events)
    resume_s = await _dsh_resume_after_preview(where, pack_chunks, events) if resume else None
    return WriteRun(seconds, events, _tree_size(where), reload_s, resume_s=resume_s, cpu_s=cpu[0])


async def full_stack_write(
    ops: list[Op], backend: Any, *, warm: bool = False, cpu: list[float] | None = None
) -> tuple[float, int]:
    """The write workload through Host + SessionStore + PersistenceCoordinator over ``backend``: (seconds, events).

    ``warm``: one ``backend.list()`` before the clock starts (opens a database backend's connection pool, which a
    long-running process does once, not per session). ``cpu``: the write phase's process CPU is appended to it.
    """
    host = Host()
    store = SessionStore(host)
    events = 0
    async with PersistenceCoordinator(host, backend):
        if warm:
            await backend.list()
        cpu_start = process_cpu_s()
        start = time.perf_counter()
        session = store.create(SESSION_ID, meta={"cwd": CWD})
        append = session.append
        for op in ops:
            if op is FLUSH:
                with anyio.CancelScope(shield=True):
                    await store.flush(session)
                await anyio.lowlevel.checkpoint_if_cancelled()
            else:
                append(op["type"], op["data"], source_event_seqs=op.get("sourceEventSeqs"))
                events += 1
        seconds = time.perf_counter() - start
        if cpu is not None:
            cpu.append(process_cpu_s() - cpu_start)
        store.dispose(session)
    return seconds, events


async def _dsh_reload(where: str, pack_chunks: bool, expected: int) -> float:
    host = Host()
    SessionStore(host)
    async with PersistenceCoordinator(host, _jsonl(where, pack_chunks=pack_chunks)) as c:
        start = time.perf_counter()
        view = await c.load(SESSION_ID)
        seconds = time.perf_counter() - start
    if len(view.events) != expected:
        raise AssertionError(f"dsh reload returned {len(view.events)} events, expected {expected}")
    return seconds


async def _dsh_resume_after_preview(where: str, pack_chunks: bool, expected: int) -> float:
    """A resume that follows a preview: on a fresh host, ``inspect`` (a picker's preview, not timed), then the
    timed ``load`` of the same unchanged session, which the preparation cache serves after one revision check."""
    host = Host()
    SessionStore(host)
    async with PersistenceCoordinator(host, _jsonl(where, pack_chunks=pack_chunks)) as c:
        preview = await c.inspect(SESSION_ID)
        start = time.perf_counter()
        view = await c.load(SESSION_ID)
        seconds = time.perf_counter() - start
    if len(view.events) != expected or len(preview.events) != expected:
        raise AssertionError(f"dsh resume returned {len(view.events)} events, expected {expected}")
    return seconds


def run_raw(ops: list[Op], where: str) -> WriteRun:
    """The floor: msgspec-encode each event, one zstd frame per durable point, os.write + os.fsync."""
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, "raw.jsonl.zstd")
    encoder = msgspec.json.Encoder()
    compressor = zstandard.ZstdCompressor(level=3, write_checksum=True)
    cpu_start = process_cpu_s()
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    try:
        header = {"type": "session", "version": 0, "id": SESSION_ID, "createdAt": 0, "cwd": CWD}
        pending: list[bytes] = [encoder.encode(header)]
        events = 0
        for op in ops:
            if op is FLUSH:
                if pending:
                    os.write(fd, compressor.compress(b"\n".join(pending) + b"\n"))
                    os.fsync(fd)
                    pending = []
            else:
                pending.append(encoder.encode(op))
                events += 1
    finally:
        os.close(fd)
    seconds = time.perf_counter() - start
    return WriteRun(seconds, events, _tree_size(where), cpu_s=process_cpu_s() - cpu_start)


async def run_async_floor(ops: list[Op], where: str) -> WriteRun:
    """The async floor (DESIGN §12): the least an async program pays for the same durable steps.

    Each event is msgspec-encoded on the event loop as it comes; at a durable point the step's lines go to one
    long-lived writer thread in one hand-off (a ``queue.SimpleQueue``); the thread compresses one zstd frame
    (level 3), ``os.write`` + ``os.fsync``, and resolves the caller's completion through the loop's thread-safe
    call; the caller waits on it, shielded. asyncio and trio (each library's own completion primitive).
    """
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, "floor.jsonl.zstd")
    encoder = msgspec.json.Encoder()
    jobs: queue.SimpleQueue[tuple[bytes, Callable[[], None]] | None] = queue.SimpleQueue()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)

    def writer() -> None:
        compressor = zstandard.ZstdCompressor(level=3, write_checksum=True)
        while (job := jobs.get()) is not None:
            data, complete = job
            os.write(fd, compressor.compress(data))
            os.fsync(fd)
            complete()

    thread = threading.Thread(target=writer, name="async-floor-writer", daemon=True)
    thread.start()
    wait = completion_waiter()
    try:
        cpu_start = process_cpu_s()
        start = time.perf_counter()
        header = {"type": "session", "version": 0, "id": SESSION_ID, "createdAt": 0, "cwd": CWD}
        pending: list[bytes] = [encoder.encode(header)]
        events = 0
        for op in ops:
            if op is FLUSH:
                if pending:
                    data = b"\n".join(pending) + b"\n"
                    pending = []
                    await wait(lambda complete, data=data: jobs.put((data, complete)))
            else:
                pending.append(encoder.encode(op))
                events += 1
        seconds = time.perf_counter() - start
        cpu_s = process_cpu_s() - cpu_start
    finally:
        jobs.put(None)
        thread.join()
        os.close(fd)
    return WriteRun(seconds, events, _tree_size(where), cpu_s=cpu_s)


def completion_waiter() -> Callable[[Callable[[Callable[[], None]], None]], Awaitable[None]]:
    """``wait(submit)``: call ``submit(complete)`` and wait, shielded, until some thread calls ``complete()``."""
    if running_library() == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()

        async def wait_trio(submit: Callable[[Callable[[], None]], None]) -> None:
            task = trio.lowlevel.current_task()
            submit(lambda: token.run_sync_soon(trio.lowlevel.reschedule, task))
            await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

        return wait_trio
    loop = asyncio.get_running_loop()

    async def wait_asyncio(submit: Callable[[Callable[[], None]], None]) -> None:
        future = loop.create_future()
        submit(lambda: loop.call_soon_threadsafe(future.set_result, None))
        await asyncio.shield(future)

    return wait_asyncio


def running_library() -> str:
    """``"trio"`` when a trio run is active in this thread, else ``"asyncio"``."""
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:
            return "asyncio"
        return "trio"
    return "asyncio"


@dataclass
class Written:
    """What section 1 leaves for the size (6) and PostgreSQL (7) sections."""

    ops: list[Op]
    events: list[dict[str, Any]]
    raw_bytes: int
    bytes_on_disk: dict[str, int | None]
    lg_partial: str | None
    lg_events: int | None


async def write_section(args: argparse.Namespace, cfg: Config, report: Report, scratch: str) -> Written:
    """1. Durable writes: the workload through every system, interleaved repetitions; events/s, ratios, reloads."""
    f = report.figures
    ops = workload(cfg.turns)
    events = [op for op in ops if op is not FLUSH]
    points = sum(1 for _ in batches(ops))
    raw_bytes = raw_json_bytes(events)
    f["workload"] = {
        "turns": cfg.turns,
        "events": len(events),
        "durable_points": points,
        "raw_json_bytes": raw_bytes,
        "repetitions": cfg.reps,
    }
    print(
        f"\n1. durable writes: {cfg.turns} turns, {len(events)} events, {points} durable points, "
        f"{raw_bytes / 1e6:.2f} MB raw JSON; median of {cfg.reps}",
        flush=True,
    )

    async def dsh_run(where: str) -> WriteRun:
        return await run_dsh(ops, where)

    async def dsh_nopack(where: str) -> WriteRun:
        return await run_dsh(ops, where, pack_chunks=False)

    async def raw_run(where: str) -> WriteRun:
        return run_raw(ops, where)

    async def sqlitesession(where: str) -> WriteRun:
        return await run_sqlitesession(ops, where)

    status = peer_status() if not args.no_peers else dict.fromkeys(("sqlitesession", "langgraph"), "skipped")
    f["peers"] = status
    runs: list[tuple[str, Callable[[str], Awaitable[WriteRun]]]] = [
        ("dsh", dsh_run),
        ("raw", raw_run),
        ("dsh_nopack", dsh_nopack),
    ]
    if status["sqlitesession"] == "ok":
        runs.append(("sqlitesession", sqlitesession))
    results = await _timed_reps("write", cfg.reps, runs, scratch)
    if status["langgraph"] == "ok":
        lg: list[WriteRun] = []
        for rep in range(cfg.peer_reps):
            where = os.path.join(scratch, f"write-langgraph-{rep}")
            gc.collect()
            lg.append(run_langgraph(ops, where, cfg.langgraph_budget_s))
            shutil.rmtree(where, ignore_errors=True)
        results["langgraph"] = lg

    eps: dict[str, float | None] = {}
    bytes_on_disk: dict[str, int | None] = {}
    reload_s: dict[str, float | None] = {}
    for name in ("dsh", "dsh_nopack", "raw", "sqlitesession", "langgraph"):
        rs = results.get(name)
        if not rs:
            eps[name] = bytes_on_disk[name] = reload_s[name] = None
            continue
        eps[name] = median([r.events / r.seconds for r in rs])
        bytes_on_disk[name] = rs[0].bytes
        reloads = [r.reload_s for r in rs if r.reload_s is not None]
        reload_s[name] = median(reloads) if reloads else None
    f["write_events_per_s"] = eps
    f["write_seconds"] = {name: median([r.seconds for r in rs]) for name, rs in results.items()}
    f["reload_s"] = reload_s
    f["bytes_on_disk"] = bytes_on_disk
    lg_partial = results["langgraph"][0].partial if results.get("langgraph") else None
    lg_events = results["langgraph"][0].events if results.get("langgraph") else None
    f["langgraph_partial"] = lg_partial
    ratios = {
        "dsh_vs_raw": _ratio(eps["dsh"], eps["raw"]),
        "dsh_vs_sqlitesession": _ratio(eps["dsh"], eps["sqlitesession"]),
        "dsh_vs_langgraph": _ratio(eps["dsh"], eps["langgraph"]),
    }
    # Paired per-repetition ratios (same rep, back to back) are less sensitive to drift on a noisy machine.
    paired = [
        a.events / a.seconds / (b.events / b.seconds) for a, b in zip(results["dsh"], results["raw"], strict=True)
    ]
    ratios["dsh_vs_raw_paired_median"] = median(paired)
    f["write_ratio"] = ratios
    for name in ("dsh", "dsh_nopack", "raw", "sqlitesession", "langgraph"):
        note = status.get(name, "") if eps[name] is None else ""
        if name == "langgraph" and lg_partial:
            note = f"prefix: {lg_partial}"
        report.row(f"write events/s [{name}]", _fmt(eps[name]), note)
    report.row("ratio dsh/raw (target >= 0.6, goal 0.8)", _fmt(ratios["dsh_vs_raw"], ".2f"))
    report.row("ratio dsh/raw, paired per rep (median)", _fmt(ratios["dsh_vs_raw_paired_median"], ".2f"))
    report.row("ratio dsh/sqlitesession (target >= 2)", _fmt(ratios["dsh_vs_sqlitesession"], ".2f"))
    report.row("ratio dsh/langgraph (target >= 50)", _fmt(ratios["dsh_vs_langgraph"], ".1f"))
    for name in ("dsh", "sqlitesession", "langgraph"):
        report.row(f"reload s [{name}]", _fmt(reload_s[name], ".3f"))
    return Written(ops, events, raw_bytes, bytes_on_disk, lg_partial, lg_events)


def size_section(report: Report, written: Written) -> None:
    """6. Bytes on disk of what section 1 wrote, per event and against the raw JSON."""
    f = report.figures
    events, raw_bytes, bytes_on_disk = written.events, written.raw_bytes, written.bytes_on_disk
    lg_partial, lg_events = written.lg_partial, written.lg_events
    # 6. size
    print("\n6. size on disk", flush=True)
    per_event = {}
    for name in ("dsh", "dsh_nopack", "raw", "sqlitesession", "langgraph"):
        size = bytes_on_disk[name]
        n = lg_events if name == "langgraph" else len(events)
        per_event[name] = None if size is None or not n else size / n
        note = f"prefix of {lg_events} events" if name == "langgraph" and lg_partial else ""
        report.row(f"bytes on disk [{name}]", _fmt(size), note)
        report.row(f"bytes/event [{name}]", _fmt(per_event[name], ".1f"), note)
    f["bytes_per_event"] = per_event
    f["raw_json_bytes_per_event"] = raw_bytes / len(events)
    vs_json = {
        name: (None if bytes_on_disk[name] is None or name == "langgraph" else bytes_on_disk[name] / raw_bytes)  # type: ignore[operator]
        for name in ("dsh", "dsh_nopack", "raw", "sqlitesession")
    }
    f["bytes_vs_raw_json"] = vs_json
    f["bytes_ratio_dsh_vs_sqlitesession"] = _ratio(bytes_on_disk["dsh"], bytes_on_disk["sqlitesession"])
    report.row("raw JSON bytes/event", f"{raw_bytes / len(events):.1f}")
    for name, value in vs_json.items():
        report.row(f"bytes vs raw JSON [{name}]", _fmt(value, ".3f"))
    report.row("bytes dsh/sqlitesession (target <= 0.33)", _fmt(f["bytes_ratio_dsh_vs_sqlitesession"], ".3f"))
