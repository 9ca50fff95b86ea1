"""The agent-loop figure of ``tools/bench`` (issue #16, section 10): persistence added per turn by the full agent loop.

A module of the ``tools/bench`` package (``python tools/bench`` runs ``__main__.py``).

The loop is the reference :class:`~dsh.session_persistence.loop.AgentLoop` with the checkpoint policy, driven by the
scripted adapter (no network, no model): per turn a user message (~200 B); step 1 streams ~1 KB of text as
token-sized chunks and two tool calls; the two tools return ~2 KB each; step 2 streams a short final answer (the loop
asks the model again after tool results, so a turn with tools has two steps). That is the commit workload of section
2 as a real loop produces it: the checkpoint policy flushes before each pre-step, each model request and each tool
body.

:func:`loop_turns` runs ``turns`` such turns in one process on one of three persistence setups:

* ``"none"``: no coordinator; the policy finds no ``session_flush`` implementation and passes through (the loop's own
  cost: adapter, assembler, events, hooks);
* ``"memory"``: a ``PersistenceCoordinator`` over the in-memory backend (the coordinator's machinery, no disk);
* ``"jsonl"``: a ``PersistenceCoordinator`` over ``JsonlBackend`` (zstd) in ``where`` (real ``fsync``).

Persistence per turn is ``jsonl - none`` (and ``memory - none`` for the part that is not the disk), from runs
interleaved in one process.
"""

from __future__ import annotations

import gc
import os
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench_commits import filler_text  # one word-salad generator for both workloads
from bench_common import Config, Report, _fmt, _ratio, median
from dsh.session_checkpoint_policy import NAME as POLICY_NAME
from dsh.session_checkpoint_policy import CheckpointPolicy
from dsh.session_persistence import Host, MemoryBackend, PersistenceCoordinator, SessionStore, hookimpl
from dsh.session_persistence.loop import AgentLoop
from dsh.session_persistence.testing import (
    ScriptedAdapter,
    ScriptedResponse,
    ScriptedTool,
    TextResponse,
    ToolCallResponse,
)
from dsh.session_persistence_jsonl import JsonlBackend

__all__ = ["LoopRun", "SETUPS", "loop_turns"]

SETUPS = ("none", "memory", "jsonl")


@dataclass
class LoopRun:
    setup: str
    turns: int
    seconds: float
    events: int
    #: Process CPU time over the same turns (every thread: the worker threads' encoding and writes included).
    cpu_seconds: float
    #: Durability barriers (``session_flush`` calls) over the same turns.
    barriers: int = 0


class _BarrierCounter:
    """A plugin that counts the host's ``session_flush`` calls (the policy's barriers)."""

    def __init__(self) -> None:
        self.count = 0

    @hookimpl
    def session_flush(self, host: Host, session: Any) -> None:
        self.count += 1


def _responses(turns: int, rng: random.Random) -> Iterator[ScriptedResponse]:
    for turn in range(1, turns + 1):
        calls = (
            (f"call-{turn}-1", "read_file", {"path": f"src/m{rng.randint(0, 99)}.py"}),
            (f"call-{turn}-2", "run_tests", {"path": f"tests/t{rng.randint(0, 99)}.py"}),
        )
        yield ToolCallResponse(calls, text=filler_text(rng, 1000))
        yield TextResponse(filler_text(rng, 60))


async def loop_turns(setup: str, turns: int, where: str, seed: int = 13) -> LoopRun:
    """``turns`` agent-loop turns on ``setup`` (see the module doc); the clock covers the turns only."""
    if setup not in SETUPS:
        raise ValueError(f"unknown setup {setup!r}")
    rng = random.Random(seed)
    host = Host()
    host.register(CheckpointPolicy(), name=POLICY_NAME)
    counter = _BarrierCounter()
    host.register(counter, name="bench-barrier-counter")
    store = SessionStore(host)
    tools = [
        ScriptedTool("read_file", output=filler_text(rng, 2000)),
        ScriptedTool("run_tests", output=filler_text(rng, 2000)),
    ]
    adapter = ScriptedAdapter(_responses(turns, rng), provider="openai", model="gpt-bench")
    users = [filler_text(rng, 200) for _ in range(turns)]

    async def drive() -> tuple[float, float, int]:
        loop = AgentLoop(host, store, adapter, tools, session_id="loop-bench", system="You are a coding agent.")
        try:
            start, cpu_start = time.perf_counter(), time.process_time()
            for text in users:
                await loop.run_turn(text)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            events = len(loop.session.events)
        finally:
            loop.close()
        store.dispose(loop.session)
        return seconds, cpu, events

    if setup == "none":
        seconds, cpu, events = await drive()
        return LoopRun(setup, turns, seconds, events, cpu, counter.count)
    backend: Any = MemoryBackend() if setup == "memory" else JsonlBackend(where)
    async with PersistenceCoordinator(host, backend):
        seconds, cpu, events = await drive()
    return LoopRun(setup, turns, seconds, events, cpu, counter.count)


async def loop_section(cfg: Config, report: Report, scratch: str) -> None:
    """10. The full agent loop (AgentLoop + checkpoint policy, token-sized chunks): persistence added per turn."""
    f = report.figures
    turns = cfg.turns
    print(f"\n10. agent loop: {turns} turns of the commit workload through AgentLoop; median of {cfg.reps}", flush=True)
    runs: dict[str, list[LoopRun]] = {setup: [] for setup in SETUPS}
    for rep in range(cfg.reps):
        for setup in SETUPS:  # interleaved, so drift hits every setup alike
            where = os.path.join(scratch, f"loop-{setup}-{rep}")
            gc.collect()
            runs[setup].append(await loop_turns(setup, turns, where))
            shutil.rmtree(where, ignore_errors=True)
    per_turn = {setup: median([r.seconds / turns * 1000 for r in rs]) for setup, rs in runs.items()}
    # Persistence per turn: the same rep's run without persistence subtracted (paired), median over reps.
    added = {
        setup: median([(a.seconds - b.seconds) / turns * 1000 for a, b in zip(runs[setup], runs["none"], strict=True)])
        for setup in ("memory", "jsonl")
    }
    # The same in process CPU time (all threads): on a shared machine wall time is the scheduler's as much as ours.
    added_cpu = {
        setup: median(
            [(a.cpu_seconds - b.cpu_seconds) / turns * 1000 for a, b in zip(runs[setup], runs["none"], strict=True)]
        )
        for setup in ("memory", "jsonl")
    }
    events = runs["jsonl"][0].events
    # The target's baseline (issue #34): the loop's barriers per turn times the async floor's CPU per commit, both
    # measured in this run (section 2 runs first).
    barriers_per_turn = runs["jsonl"][0].barriers / turns
    floor_cpu_us = (f.get("commit") or {}).get("cpu_us_per_commit", {}).get("floor")
    floor_turn_ms = None if floor_cpu_us is None else barriers_per_turn * floor_cpu_us / 1000
    f["agent_loop"] = {
        "barriers_per_turn": barriers_per_turn,
        "floor_cpu_ms_per_turn": floor_turn_ms,
        "persistence_cpu_vs_floor": _ratio(added_cpu["jsonl"], floor_turn_ms),
        "turns": turns,
        "events_per_turn": events / turns,
        "ms_per_turn": per_turn,
        "persistence_ms_per_turn": added,
        "persistence_cpu_ms_per_turn": added_cpu,
    }
    report.row("agent loop events per turn", _fmt(events / turns, ".1f"))
    for setup in SETUPS:
        report.row(f"agent loop ms per turn [{setup}]", _fmt(per_turn[setup], ".3f"))
    report.row("persistence ms/turn [memory: no disk]", _fmt(added["memory"], ".3f"))
    report.row("persistence ms/turn [jsonl] (target <= 2)", _fmt(added["jsonl"], ".3f"))
    report.row("persistence CPU ms/turn [memory: no disk]", _fmt(added_cpu["memory"], ".3f"))
    report.row("persistence CPU ms/turn [jsonl]", _fmt(added_cpu["jsonl"], ".3f"))
    report.row(f"async floor CPU ms/turn [{barriers_per_turn:g} barriers]", _fmt(floor_turn_ms, ".3f"))
    report.row(
        "persistence CPU per turn / floor (target <= 1.3)", _fmt(f["agent_loop"]["persistence_cpu_vs_floor"], ".2f")
    )
