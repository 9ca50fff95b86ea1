"""The commit workload and the many-sessions load of ``tools/bench`` (issue #16): sections 2 and 8.

A module of the ``tools/bench`` package (``python tools/bench`` runs ``__main__.py``).

* :func:`commit_workload`: per turn a user message (~200 B), an assistant message (~1 KB) with two tool calls and
  two tool results (~2 KB each), durable at three points (before the model request, before the tools, at the step
  end). No streamed chunks: it measures the cost of a durable commit, not of batching.
* :func:`many_sessions`: ``n`` live sessions in one process, each appending a chunk every ``append_ms`` and
  flushing every ``flush_ms``; reports the flush barrier's latency and the CPU spent per barrier.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec
from bench_common import ENTRY, Config, Report, WriteRun, _fmt, _jsonl, _ratio, _timed_reps, median
from bench_load import load_raw
from bench_peers import run_sqlitesession
from bench_writes import run_async_floor, run_dsh, run_raw
from dsh.session_persistence import Host, MemoryBackend, MemoryStore, PersistenceCoordinator, SessionStore

FLUSH = None


def filler_text(rng: random.Random, size: int) -> str:
    """``size`` characters of word salad (the same words for every workload of the bench)."""
    words = ("agent", "session", "durable", "tool", "result", "model", "stream", "commit", "batch", "event", "turn")
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(words)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


class _Seqs:
    def __init__(self) -> None:
        self.seq = 0
        self.time = 1_700_000_000_000

    def env(self, etype: str, data: dict[str, Any], **extra: Any) -> dict[str, Any]:
        self.time += 3
        out = {"type": etype, "seq": self.seq, "time": self.time, "data": data, **extra}
        self.seq += 1
        return out


def commit_workload(turns: int, seed: int = 11) -> list[dict[str, Any] | None]:
    """Wire-form events with ``FLUSH`` at the three durable points of each turn (``3 * turns`` commits)."""
    rng = random.Random(seed)
    s = _Seqs()
    ops: list[dict[str, Any] | None] = []
    for turn in range(1, turns + 1):
        base = {"turn": turn, "step": 1}
        ops.append(s.env("turn/start", {"turn": turn}))
        ops.append(s.env("step/start", dict(base)))
        user = {
            "id": f"user-{turn}",
            "role": "user",
            "content": [{"type": "text", "text": filler_text(rng, 200)}],
            "source": {"kind": "user"},
        }
        ops.append(s.env("user/message", user, surfaceOp="append"))
        ops.append(FLUSH)  # before the model request
        calls = [
            {
                "type": "tool-call",
                "id": f"call-{turn}-{i}",
                "name": name,
                "arguments": json.dumps({"path": f"src/m{rng.randint(0, 99)}.py"}),
            }
            for i, name in ((1, "read_file"), (2, "run_tests"))
        ]
        message = {
            "id": f"assistant-{turn}",
            "role": "assistant",
            "content": [{"type": "text", "text": filler_text(rng, 1000)}, *calls],
            "source": {"kind": "model", "provider": "openai", "model": "gpt-bench"},
        }
        ops.append(s.env("assistant/message", {**base, "message": message}, surfaceOp="append"))
        call_seqs = []
        for block in calls:
            call = s.env(
                "tool/call", {**base, "callId": block["id"], "name": block["name"], "arguments": block["arguments"]}
            )
            call_seqs.append(call["seq"])
            ops.append(call)
        ops.append(FLUSH)  # before the tool bodies
        for block, call_seq in zip(calls, call_seqs, strict=True):
            result = {
                "id": f"result-{block['id']}",
                "role": "user",
                "content": [
                    {
                        "type": "tool-result",
                        "toolCallId": block["id"],
                        "content": [{"type": "text", "text": filler_text(rng, 2000)}],
                    }
                ],
                "source": {"kind": "tool", "callId": block["id"]},
            }
            ops.append(
                s.env("tool/result", {**base, "message": result}, surfaceOp="append", sourceEventSeqs=[call_seq])
            )
        ops.append(s.env("step/end", dict(base)))
        ops.append(s.env("turn/end", {"turn": turn, "reason": {"kind": "completed"}}))
        ops.append(FLUSH)  # at the step end
    return ops


def commit_count(ops: list[dict[str, Any] | None]) -> int:
    """Durable points that have something to commit (what every system pays one durable write for)."""
    count = 0
    pending = False
    for op in ops:
        if op is FLUSH:
            count += pending
            pending = False
        else:
            pending = True
    return count


@dataclass
class ManyRun:
    sessions: int
    barriers: int
    appends: int
    p50_ms: float
    p99_ms: float
    cpu_us_per_barrier: float
    wall_s: float


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def many_sessions(
    backend: Any, n: int, seconds: float, *, append_ms: float = 10.0, flush_ms: float = 100.0
) -> ManyRun:
    """``n`` live sessions on one coordinator, each an agent task: a chunk every ``append_ms``, a flush every
    ``flush_ms``.

    The barrier latency is the wall time of each ``store.flush`` (what a checkpoint waits for); CPU per barrier is the
    process CPU (user + system, worker threads included) over the run divided by the number of barriers.
    """
    host = Host()
    store = SessionStore(host)
    latencies: list[float] = []
    appends = 0
    chunk = {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "token "}}
    per_flush = max(1, round(flush_ms / append_ms))
    async with PersistenceCoordinator(host, backend):
        sessions = []
        for i in range(n):
            session = store.create(f"many-{n}-{i}", meta={"cwd": "/home/bench/project"})
            session.append("turn/start", {"turn": 1})
            session.append("step/start", {"turn": 1, "step": 1})
            sessions.append(session)
        async with anyio.create_task_group() as tg:
            for session in sessions:  # materialize every session before the clock starts
                tg.start_soon(store.flush, session)
        deadline = time.perf_counter() + seconds
        cpu0 = _cpu_s()
        wall0 = time.perf_counter()

        async def agent(index: int, session: Any) -> None:
            nonlocal appends
            await anyio.sleep((index % per_flush) * append_ms / 1000)  # stagger the flushes
            tick = 0
            while time.perf_counter() < deadline:
                session.append("assistant/chunk", chunk)
                appends += 1
                tick += 1
                if tick % per_flush == 0:
                    start = time.perf_counter()
                    await store.flush(session)
                    latencies.append(time.perf_counter() - start)
                await anyio.sleep(append_ms / 1000)

        async with anyio.create_task_group() as tg:
            for index, session in enumerate(sessions):
                tg.start_soon(agent, index, session)
        wall = time.perf_counter() - wall0
        cpu = _cpu_s() - cpu0
        for session in sessions:
            store.dispose(session)
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] if ordered else float("nan")
    return ManyRun(
        sessions=n,
        barriers=len(latencies),
        appends=appends,
        p50_ms=statistics.median(ordered) * 1000 if ordered else float("nan"),
        p99_ms=p99 * 1000,
        cpu_us_per_barrier=cpu / len(latencies) * 1e6 if latencies else float("nan"),
        wall_s=wall,
    )


# The sections


async def append_cost(appends: int, reps: int) -> dict[str, float]:
    """``Session.append`` of a small event (a token chunk) with the coordinator attached (memory backend, so no
    write runs meanwhile), next to a msgspec encode of the same event: microseconds each.

    Both are timed in this thread's CPU time (``time.thread_time``: another process on a shared machine adds no time
    to it), in blocks of ``appends // 10`` that alternate append, encode, append, ... so a slow stretch hits both
    alike; ``ratio`` is the median of the paired blocks' ratios (at least 30 pairs), the microsecond figures the
    medians of their blocks.
    """
    host = Host()
    store = SessionStore(host)
    append_us: list[float] = []
    encode_us: list[float] = []
    paired: list[float] = []
    encoder = msgspec.json.Encoder()
    block = max(100, appends // 10)
    pairs = max(30, reps * 10)
    async with PersistenceCoordinator(host, MemoryBackend(MemoryStore()), write_batch_max_delay_ms=600_000):
        session = store.create("append-cost", meta={"cwd": "/bench"})
        session.append("turn/start", {"turn": 1})
        session.append("step/start", {"turn": 1, "step": 1})
        await store.flush(session)
        data = {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "token"}}
        session.append("assistant/chunk", data)
        event = session.events[-1]
        append = session.append
        encode = encoder.encode
        for _ in range(pairs):
            start = time.thread_time()
            for _ in range(block):
                append("assistant/chunk", data)
            a = (time.thread_time() - start) / block * 1e6
            start = time.thread_time()
            for _ in range(block):
                encode(event)
            e = (time.thread_time() - start) / block * 1e6
            await store.flush(session)  # the pending list drains between blocks, as a barrier would
            append_us.append(a)
            encode_us.append(e)
            if e > 0:
                paired.append(a / e)
        store.dispose(session)
    return {"append_us": median(append_us), "encode_us": median(encode_us), "ratio": median(paired)}


async def commit_section(args: argparse.Namespace, cfg: Config, report: Report, scratch: str) -> None:
    """2. The commit workload: three durable points per turn, no streamed chunks (time per durable commit)."""
    f = report.figures
    ops = commit_workload(cfg.turns)
    commits = commit_count(ops)
    print(f"\n2. commit workload: {cfg.turns} turns, {commits} durable commits; median of {cfg.reps}", flush=True)

    async def dsh_run(where: str) -> WriteRun:
        return await run_dsh(ops, where, resume=True)

    async def raw_run(where: str) -> WriteRun:
        run = run_raw(ops, where)
        run.reload_s = load_raw(os.path.join(where, "raw.jsonl.zstd"))[0]
        return run

    async def sqlitesession(where: str) -> WriteRun:
        return await run_sqlitesession(ops, where)

    runs: list[tuple[str, Callable[[str], Awaitable[WriteRun]]]] = [
        ("dsh", dsh_run),
        ("raw", raw_run),
        ("floor", lambda where: run_async_floor(ops, where)),
    ]
    if f["peers"]["sqlitesession"] == "ok":
        runs.append(("sqlitesession", sqlitesession))
    results = await _timed_reps("commit", cfg.reps, runs, scratch)
    systems = ("dsh", "floor", "raw", "sqlitesession")
    per_commit: dict[str, float | None] = {}
    cpu_us: dict[str, float | None] = {}
    reload: dict[str, float | None] = {}
    resumes = [r.resume_s for r in results["dsh"] if r.resume_s is not None]
    resume_ms = median(resumes) * 1000 if resumes else None
    for name in systems:
        rs = results.get(name)
        per_commit[name] = median([r.seconds / commits for r in rs]) * 1000 if rs else None
        cpus = [r.cpu_s / commits for r in rs or [] if r.cpu_s is not None]
        cpu_us[name] = median(cpus) * 1e6 if cpus else None
        reloads = [r.reload_s for r in rs or [] if r.reload_s is not None]
        reload[name] = median(reloads) * 1000 if reloads else None
    paired = [a.seconds / b.seconds for a, b in zip(results["dsh"], results["raw"], strict=True)]
    paired_cpu = [
        a.cpu_s / b.cpu_s for a, b in zip(results["dsh"], results["floor"], strict=True) if a.cpu_s and b.cpu_s
    ]
    paired_wall = [a.seconds / b.seconds for a, b in zip(results["dsh"], results["floor"], strict=True)]
    ratios = {
        "dsh_vs_raw": _ratio(per_commit["dsh"], per_commit["raw"]),
        "dsh_vs_raw_paired_median": median(paired),
        "cpu_dsh_vs_floor": _ratio(cpu_us["dsh"], cpu_us["floor"]),
        "cpu_dsh_vs_floor_paired_median": median(paired_cpu) if paired_cpu else None,
        "wall_dsh_vs_floor": _ratio(per_commit["dsh"], per_commit["floor"]),
        "wall_dsh_vs_floor_paired_median": median(paired_wall),
        "sqlitesession_vs_dsh": _ratio(per_commit["sqlitesession"], per_commit["dsh"]),
        "reload_dsh_vs_raw": _ratio(reload["dsh"], reload["raw"]),
        "resume_after_preview_vs_reload": _ratio(resume_ms, reload["dsh"]),
    }
    appended = await append_cost(cfg.turns * 20, cfg.reps)
    f["commit"] = {
        "append": appended,
        "commits": commits,
        "ms_per_commit": per_commit,
        "cpu_us_per_commit": cpu_us,
        "reload_ms": reload,
        "resume_after_preview_ms": resume_ms,
        "ratio": ratios,
    }
    for name in systems:
        note = "" if per_commit[name] is not None else f["peers"].get(name, "")
        report.row(f"ms per durable commit [{name}]", _fmt(per_commit[name], ".3f"), note)
        report.row(f"CPU us per durable commit [{name}]", _fmt(cpu_us[name], ".0f"), note)
    report.row("commit CPU dsh/async floor (target <= 1.3, goal 1.1)", _fmt(ratios["cpu_dsh_vs_floor"], ".2f"))
    report.row("commit CPU dsh/async floor, paired (median)", _fmt(ratios["cpu_dsh_vs_floor_paired_median"], ".2f"))
    report.row("commit wall dsh/async floor (target <= 1.2)", _fmt(ratios["wall_dsh_vs_floor"], ".2f"))
    report.row("commit wall dsh/async floor, paired (median)", _fmt(ratios["wall_dsh_vs_floor_paired_median"], ".2f"))
    report.row("commit dsh/raw inline", _fmt(ratios["dsh_vs_raw"], ".2f"))
    report.row("Session.append us [small chunk, coordinator attached]", _fmt(appended["append_us"], ".2f"))
    report.row("msgspec encode us [the same event]", _fmt(appended["encode_us"], ".2f"))
    report.row("append/encode, paired CPU (target <= 10)", _fmt(appended["ratio"], ".1f"))
    report.row("commit sqlitesession/dsh (target >= 1.25)", _fmt(ratios["sqlitesession_vs_dsh"], ".2f"))
    for name in ("dsh", "raw", "sqlitesession"):
        report.row(f"reload ms [{name}]", _fmt(reload[name], ".2f"))
    report.row("reload dsh/raw (target <= 1.2)", _fmt(ratios["reload_dsh_vs_raw"], ".2f"))
    report.row("resume after a preview ms [dsh]", _fmt(resume_ms, ".2f"))
    report.row(
        "resume after a preview / cold reload (target <= 0.2)", _fmt(ratios["resume_after_preview_vs_reload"], ".2f")
    )


def _many_child(loop: str, n: str, seconds: str, where: str) -> None:
    """One many-sessions run in a fresh process (``--_many-child``): prints its figures as JSON."""
    import dataclasses

    async def go() -> ManyRun:
        return await many_sessions(_jsonl(where), int(n), float(seconds))

    print(json.dumps(dataclasses.asdict(anyio.run(go, backend=loop))))


def many_sessions_section(cfg: Config, report: Report, scratch: str) -> None:
    """8. Many live sessions in one process: barrier p50/p99 and CPU per barrier, asyncio and trio, vs one session."""
    f = report.figures
    print(f"\n8. many sessions: a chunk every 10 ms, a flush every 100 ms, {cfg.many_seconds:g} s each", flush=True)
    out: dict[str, dict[str, Any]] = {}
    for loop in ("asyncio", "trio"):
        for n in (1, cfg.many_sessions):
            where = os.path.join(scratch, f"many-{loop}-{n}")
            cmd = [
                sys.executable,
                ENTRY,
                "--_many-child",
                loop,
                str(n),
                str(cfg.many_seconds),
                where,
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            shutil.rmtree(where, ignore_errors=True)
            if done.returncode != 0:
                out[f"{loop}-{n}"] = {"error": done.stderr.strip().splitlines()[-1:] or ["?"]}
                report.row(f"many sessions [{loop}, n={n}]", "failed", out[f"{loop}-{n}"]["error"][0][:60])
                continue
            run = json.loads(done.stdout.strip().splitlines()[-1])
            out[f"{loop}-{n}"] = run
            report.row(f"barrier p50/p99 ms [{loop}, n={n}]", f"{run['p50_ms']:.2f} / {run['p99_ms']:.2f}")
            report.row(
                f"CPU us per barrier [{loop}, n={n}]", f"{run['cpu_us_per_barrier']:.0f}", f"{run['barriers']} barriers"
            )
        single, many = out.get(f"{loop}-1", {}), out.get(f"{loop}-{cfg.many_sessions}", {})
        if "p99_ms" in single and "p99_ms" in many:
            ratio = many["p99_ms"] / single["p99_ms"]
            out[f"{loop}-p99_ratio"] = {"value": ratio}
            report.row(f"p99 barrier n={cfg.many_sessions} / n=1 [{loop}] (target <= 5)", f"{ratio:.2f}")
    f["many_sessions"] = out
