"""Sections 4 and 5: the flush barrier on a live session, and ``list()`` over many stored sessions."""

from __future__ import annotations

import os
import shutil
import time

from bench_common import Config, Report, _jsonl, median, p99
from bench_workload import CWD
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
from dsh.session_persistence.backend import SessionHeader, StorageMetadata
from dsh.session_persistence_jsonl.format import encode_header_batch, transcript_path

# --------------------------------------------------------------------------------------------------------------
# Flush barrier and list


async def flush_barrier(idle_n: int, pending_n: int, where: str) -> tuple[list[float], list[float]]:
    """``store.flush`` on a live, materialized session: with nothing pending, and with one pending event."""
    host = Host()
    store = SessionStore(host)
    idle: list[float] = []
    one: list[float] = []
    async with PersistenceCoordinator(host, _jsonl(where)):
        session = store.create("flush-session", meta={"cwd": CWD})
        session.append("turn/start", {"turn": 1})
        session.append("step/start", {"turn": 1, "step": 1})
        await store.flush(session)
        chunk = {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "token "}}
        for i in range(max(idle_n, pending_n)):
            if i < idle_n:
                start = time.perf_counter()
                await store.flush(session)
                idle.append(time.perf_counter() - start)
            if i < pending_n:
                session.append("assistant/chunk", chunk)
                start = time.perf_counter()
                await store.flush(session)
                one.append(time.perf_counter() - start)
        store.dispose(session)
    return idle, one


def write_listing_root(root: str, count: int) -> None:
    """``count`` header-only transcripts (the bytes ``materialize_header`` writes, written without fsync)."""
    os.makedirs(os.path.dirname(os.path.dirname(transcript_path(root, CWD, "x", "zstd"))), mode=0o700, exist_ok=True)
    for i in range(count):
        session_id = f"listed-{i:05d}"
        header = SessionHeader(id=session_id, created_at=1_700_000_000_000 + i, cwd=CWD)
        path = transcript_path(root, CWD, session_id, "zstd")
        os.mkdir(os.path.dirname(path), 0o700)
        with open(path, "wb") as fh:
            fh.write(encode_header_batch(StorageMetadata(header, 0), "zstd"))


async def list_sessions(root: str) -> tuple[float, int]:
    host = Host()
    SessionStore(host)
    async with PersistenceCoordinator(host, _jsonl(root)) as coordinator:
        start = time.perf_counter()
        headers = await coordinator.list()
        seconds = time.perf_counter() - start
    return seconds, len(headers)


async def flush_section(cfg: Config, report: Report, scratch: str) -> None:
    """4. ``store.flush`` with nothing pending and with one pending event: median and p99."""
    f = report.figures
    # 4. flush barrier
    print("\n4. flush barrier (store.flush on a live, materialized session)", flush=True)
    idle, one = await flush_barrier(cfg.flush_idle_n, cfg.flush_pending_n, os.path.join(scratch, "flush"))
    f["flush_idle_us"] = {"median": median(idle) * 1e6, "p99": p99(idle) * 1e6, "n": len(idle)}
    f["flush_one_pending_us"] = {"median": median(one) * 1e6, "p99": p99(one) * 1e6, "n": len(one)}
    report.row("flush, nothing pending: median us", f"{f['flush_idle_us']['median']:.1f}")
    report.row("flush, nothing pending: p99 us", f"{f['flush_idle_us']['p99']:.1f}")
    report.row("flush, one pending event: median us", f"{f['flush_one_pending_us']['median']:.1f}")
    report.row("flush, one pending event: p99 us", f"{f['flush_one_pending_us']['p99']:.1f}")


async def list_section(cfg: Config, report: Report, scratch: str) -> None:
    """5. ``coordinator.list()`` over ``cfg.list_count`` header-only transcripts."""
    f = report.figures
    # 5. list
    print(f"\n5. list() over {cfg.list_count:,} stored sessions; median of {cfg.list_reps}", flush=True)
    root = os.path.join(scratch, "list")
    write_listing_root(root, cfg.list_count)
    times = []
    for _ in range(cfg.list_reps):
        seconds, n = await list_sessions(root)
        if n != cfg.list_count:
            raise AssertionError(f"list returned {n} sessions, expected {cfg.list_count}")
        times.append(seconds)
    f["list_sessions"] = cfg.list_count
    f["list_10k_s"] = median(times) * 10_000 / cfg.list_count
    report.row(f"list {cfg.list_count:,} sessions: s (target < 1)", f"{median(times):.3f}")
    shutil.rmtree(root, ignore_errors=True)
