"""Section 12: a fleet of live sessions in one process, at a realistic and an aggressive rate (issue #24).

Each of ``n`` sessions is an agent task on one event loop:

* **realistic**: one agent step every 2 s: ``step/start``, [pre-step barrier], ``user/message`` (~200 B),
  [before-stream barrier], 50 ``assistant/chunk`` tokens over 500 ms, ``assistant/message`` (~1 KB, two tool
  calls), then per call ``tool/call``, [before-tool-body barrier], ``tool/result`` (~2 KB); ``step/end``. Four
  barriers per step, the checkpoint policy's points.
* **aggressive**: a chunk every 10 ms and a barrier every 100 ms.

Sessions start staggered over one period, steps follow a fixed schedule (a late agent starts its next step at
once, it never skips one), so the *demanded* barrier rate (barriers the schedule asks for before the deadline, per
second) is fixed by the workload, and the *served* rate (barriers completed before the deadline, per second) shows
whether a system keeps up. Systems, each in a fresh process per cell:

* ``dsh``: ``SessionStore`` + ``PersistenceCoordinator`` + ``JsonlBackend``; a barrier is ``store.flush``;
* ``floor``: the async floor (DESIGN §12), the least an async program pays: events encoded with msgspec as they
  come, at a barrier one hand-off to one long-lived writer thread (a ``queue.SimpleQueue``) that compresses one
  zstd frame, ``write`` + ``fsync`` of the session's own file, and completes the caller through the loop's
  thread-safe call; every ratio of the targets is to it;
* ``raw_thread``: the same step in a worker thread per barrier (``anyio.to_thread``);
* ``raw_inline``: the same ``write`` + ``fsync`` on the event loop (blocks every other session meanwhile);
* ``sqlite_file`` / ``sqlite_shared``: OpenAI Agents SDK ``SQLiteSession`` (its defaults), one database file
  per session, or one shared file; a barrier is one ``add_items`` of the events since the last one, each event's
  wire object one item (the same records as the other systems, as in section 1). It runs on asyncio only (it
  calls ``asyncio.to_thread``).

Per cell: barrier latency p50/p99 (wall time of each barrier), demanded and served barriers per second, and
process CPU (user + system, every thread) per completed barrier.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import anyio
from bench_commits import filler_text
from bench_common import ENTRY, Report
from bench_fleet_systems import DshSystem, make_system

SYSTEMS = ("dsh", "floor", "raw_thread", "raw_inline", "sqlite_file", "sqlite_shared")
RATES = ("realistic", "aggressive")
LOOPS = ("asyncio", "trio")


@dataclass(frozen=True)
class Rate:
    """One workload rate, with every time scaled by ``scale`` (1 in a real run; smaller for ``--quick``)."""

    name: str
    scale: float = 1.0

    @property
    def period_s(self) -> float:
        return (2.0 if self.name == "realistic" else 0.1) * self.scale

    @property
    def chunk_gap_s(self) -> float:
        return 0.01 * self.scale


@dataclass
class FleetCell:
    system: str
    loop: str
    rate: str
    sessions: int
    seconds: float
    barriers: int
    demanded_per_s: float
    served_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_barrier: float
    #: dsh only: durable batch writes per barrier over the cell (write-behind windows included; the floor: 1).
    writes_per_barrier: float | None = None


# --------------------------------------------------------------------------------------------------------------
# The events of one step (shared by every system; dsh gets them through ``Session.append``)


def step_events(rng: random.Random, session: int, step: int) -> dict[str, Any]:
    user = {
        "id": f"user-{session}-{step}",
        "role": "user",
        "content": [{"type": "text", "text": filler_text(rng, 200)}],
        "source": {"kind": "user"},
    }
    calls = [
        {"type": "tool-call", "id": f"call-{step}-{i}", "name": name, "arguments": json.dumps({"path": f"m{i}.py"})}
        for i, name in ((1, "read_file"), (2, "run_tests"))
    ]
    text = filler_text(rng, 1000)
    message = {
        "id": f"assistant-{session}-{step}",
        "role": "assistant",
        "content": [{"type": "text", "text": text}, *calls],
        "source": {"kind": "model", "provider": "openai", "model": "gpt-bench"},
    }
    results = [
        {
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
        for block in calls
    ]
    words = text.split(" ")
    per = max(1, len(words) // 50)
    tokens = [" ".join(words[i : i + per]) + " " for i in range(0, per * 50, per)][:50]
    return {"user": user, "message": message, "calls": calls, "results": results, "tokens": tokens}


# --------------------------------------------------------------------------------------------------------------
# One cell


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _pct(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000 if ordered else float("nan")


async def _sleep_until(when: float) -> None:
    delay = when - time.perf_counter()
    await anyio.sleep(delay if delay > 0 else 0)


async def run_cell(system_name: str, loop: str, rate: Rate, n: int, seconds: float, where: str) -> FleetCell:
    system = make_system(system_name, where)
    if isinstance(system, DshSystem):
        await system.start()
    latencies: list[float] = []
    due = 0  # barriers the schedule asks for before the deadline
    late = 0  # barriers that completed after it (not served within the window)
    try:
        handles = [await system.open(i) for i in range(n)]
        rng = random.Random(5)
        steps = [step_events(rng, i % 8, 0) for i in range(8)]  # payloads reused: encoding, not generation, is timed
        begin = time.perf_counter() + 0.05
        deadline = begin + seconds

        async def timed_barrier(handle: Any) -> None:
            nonlocal late
            start = time.perf_counter()
            await system.barrier(handle)
            end = time.perf_counter()
            latencies.append(end - start)
            late += end > deadline

        async def realistic(index: int, handle: Any, t0: float) -> None:
            nonlocal due
            # What the schedule asks for before the deadline, whatever this system manages: two barriers at each
            # step's start, two after its 50 chunks.
            step = 0
            while t0 + step * rate.period_s < deadline:
                due += 2 + 2 * (t0 + step * rate.period_s + 50 * rate.chunk_gap_s < deadline)
                step += 1
            step = 0
            while True:
                when = t0 + step * rate.period_s
                if when >= deadline or time.perf_counter() >= deadline:
                    return  # a system that fell behind stops at the deadline too: its backlog is not served
                await _sleep_until(when)
                ev = steps[(index + step) % len(steps)]
                system.append(handle, "step/start", {"turn": 1, "step": step + 1})
                await timed_barrier(handle)  # pre-step
                system.append(handle, "user/message", ev["user"])
                await timed_barrier(handle)  # before the model stream is pulled
                base = {"turn": 1, "step": step + 1}  # the steps of one long turn (the turn rules hold)
                chunk_seqs = []
                started = time.perf_counter()
                for k, token in enumerate(ev["tokens"]):
                    await _sleep_until(started + k * rate.chunk_gap_s)
                    chunk = {"type": "text-delta", "index": 0, "text": token}
                    chunk_seqs.append(system.append(handle, "assistant/chunk", {**base, "chunk": chunk}))
                system.append(handle, "assistant/message", {**base, "message": ev["message"]}, chunk_seqs)
                for block, result in zip(ev["calls"], ev["results"], strict=True):
                    call = {**base, "callId": block["id"], "name": block["name"], "arguments": block["arguments"]}
                    call_seq = system.append(handle, "tool/call", call)
                    await timed_barrier(handle)  # before the tool body
                    system.append(handle, "tool/result", {**base, "message": result}, [call_seq])
                system.append(handle, "step/end", base)
                step += 1

        async def aggressive(index: int, handle: Any, t0: float) -> None:
            nonlocal due
            tick = 0
            per_flush = max(1, round(rate.period_s / rate.chunk_gap_s))
            chunk = {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "token "}}
            ticks = 0
            while t0 + ticks * rate.chunk_gap_s < deadline:
                ticks += 1
            due += ticks // per_flush
            system.append(handle, "step/start", {"turn": 1, "step": 1})  # the chunks' step (the turn rules hold)
            while True:
                when = t0 + tick * rate.chunk_gap_s
                if when >= deadline or time.perf_counter() >= deadline:
                    return
                await _sleep_until(when)
                system.append(handle, "assistant/chunk", chunk)
                tick += 1
                if tick % per_flush == 0:
                    await timed_barrier(handle)

        agent = realistic if rate.name == "realistic" else aggressive
        writes0 = system.writes if isinstance(system, DshSystem) else None
        cpu0 = _cpu_s()
        async with anyio.create_task_group() as tg:
            for index, handle in enumerate(handles):
                tg.start_soon(agent, index, handle, begin + rate.period_s * index / n)
        elapsed = time.perf_counter() - begin
        cpu = _cpu_s() - cpu0
        writes_now = system.writes if isinstance(system, DshSystem) else None
        writes = None if writes0 is None or writes_now is None else writes_now - writes0
    finally:
        await system.aclose()
    ordered = sorted(latencies)
    return FleetCell(
        system=system_name,
        loop=loop,
        rate=rate.name,
        sessions=n,
        seconds=round(elapsed, 3),
        barriers=len(ordered),
        demanded_per_s=due / seconds,
        served_per_s=(len(ordered) - late) / seconds,
        p50_ms=_pct(ordered, 0.5),
        p99_ms=_pct(ordered, 0.99),
        cpu_us_per_barrier=cpu / len(ordered) * 1e6 if ordered else float("nan"),
        writes_per_barrier=writes / len(ordered) if writes is not None and ordered else None,
    )


def fleet_child(spec: str) -> None:
    """``--_fleet-child SPEC``: run the cells SPEC (JSON) lists in this fresh process; one JSON line per cell."""
    plan = json.loads(spec)
    for cell in plan["cells"]:
        where = os.path.join(plan["where"], f"{cell['system']}-{cell['rate']}-{cell['n']}")
        rate = Rate(cell["rate"], plan["scale"])

        async def go(cell: dict[str, Any] = cell, rate: Rate = rate, where: str = where) -> FleetCell:
            return await run_cell(cell["system"], plan["loop"], rate, cell["n"], plan["seconds"], where)

        try:
            out: dict[str, Any] = asdict(anyio.run(go, backend=plan["loop"]))
        except Exception as exc:  # reported per cell: one system failing must not hide the others
            out = {**cell, "loop": plan["loop"], "error": f"{type(exc).__name__}: {exc}"[:200]}
        finally:
            shutil.rmtree(where, ignore_errors=True)
        print(json.dumps(out), flush=True)


# --------------------------------------------------------------------------------------------------------------
# The section


def _cells_in_child(loop: str, cells: list[dict[str, Any]], seconds: float, scale: float, where: str) -> list[Any]:
    spec = json.dumps({"loop": loop, "cells": cells, "seconds": seconds, "scale": scale, "where": where})
    done = subprocess.run([sys.executable, ENTRY, "--_fleet-child", spec], capture_output=True, text=True, check=False)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 and len(rows) < len(cells):
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        rows += [{**c, "loop": loop, "error": tail[:200]} for c in cells[len(rows) :]]
    return rows


def fleet_section(
    report: Report,
    scratch: str,
    *,
    sessions: tuple[int, ...],
    seconds: float,
    scale: float = 1.0,
    one_process: bool = False,
    peers: bool = True,
    window_probe: bool = False,
) -> None:
    """12. The fleet: every system at every N and rate, asyncio and trio, each cell in a fresh process (in
    ``one_process`` mode, one process per loop: the quick smoke run)."""
    f = report.figures
    print(
        f"\n12. fleet: N = {', '.join(map(str, sessions))}; realistic (a step every {2 * scale:g} s) and aggressive "
        f"(a chunk every {10 * scale:g} ms, a barrier every {100 * scale:g} ms); {seconds:g} s per cell",
        flush=True,
    )
    systems = [s for s in SYSTEMS if peers or not s.startswith("sqlite")]
    if window_probe:
        systems.insert(1, "dsh_nowindow")  # what the write-behind window's writes cost (a probe, not a target)
    results: list[dict[str, Any]] = []
    for loop in LOOPS:
        plan = [
            {"system": system, "rate": rate, "n": n}
            for n in sessions
            for rate in RATES
            for system in systems
            if not (loop == "trio" and system.startswith("sqlite"))
        ]
        where = os.path.join(scratch, f"fleet-{loop}")
        if one_process:
            results += _cells_in_child(loop, plan, seconds, scale, where)
        else:
            for cell in plan:
                results += _cells_in_child(loop, [cell], seconds, scale, where)
        shutil.rmtree(where, ignore_errors=True)
        if not peers:
            continue
        for n in sessions:
            for rate in RATES:
                for system in ("sqlite_file", "sqlite_shared"):
                    if loop == "trio":
                        results.append(
                            {"system": system, "loop": loop, "rate": rate, "sessions": n, "skipped": "asyncio only"}
                        )
    table: dict[str, Any] = {}
    for row in results:
        key = f"{row['loop']}/{row['rate']}/n={row.get('sessions', row.get('n'))}/{row['system']}"
        table[key] = row
        if "error" in row or "skipped" in row:
            if "error" in row:
                report.row(f"fleet {key}", "failed", row["error"][:60])
            continue
        writes = row.get("writes_per_barrier")
        report.row(
            f"fleet {key}",
            f"{row['p50_ms']:.2f}/{row['p99_ms']:.1f} ms",
            f"served {row['served_per_s']:,.0f}/{row['demanded_per_s']:,.0f} /s, "
            f"{row['cpu_us_per_barrier']:,.0f} us CPU" + ("" if writes is None else f", {writes:.2f} writes/barrier"),
        )
    f["fleet"] = {"sessions": list(sessions), "seconds": seconds, "scale": scale, "cells": table}
    f["fleet"]["ratios"] = _fleet_ratios(table, sessions)
    for key, value in f["fleet"]["ratios"].items():
        report.row(f"fleet {key}", "n/a" if value is None else f"{value:.2f}")


def _fleet_ratios(table: dict[str, Any], sessions: tuple[int, ...]) -> dict[str, float | None]:
    """The targets' ratios at the largest N: dsh against the async floor in the same run."""
    n = max(sessions)
    out: dict[str, float | None] = {}
    for loop in LOOPS:
        for rate in RATES:
            dsh = table.get(f"{loop}/{rate}/n={n}/dsh", {})
            floor = table.get(f"{loop}/{rate}/n={n}/floor", {})
            for field, name in (("p99_ms", "p99"), ("cpu_us_per_barrier", "cpu"), ("served_per_s", "served")):
                a, b = dsh.get(field), floor.get(field)
                out[f"{loop}/{rate}/n={n} dsh/floor {name}"] = a / b if a and b else None
            probe = table.get(f"{loop}/{rate}/n={n}/dsh_nowindow")
            if probe is not None:
                a, b = probe.get("cpu_us_per_barrier"), floor.get("cpu_us_per_barrier")
                out[f"{loop}/{rate}/n={n} dsh without window writes/floor cpu (probe)"] = a / b if a and b else None
    return out
