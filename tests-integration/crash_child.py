"""Crash child: run a scripted agent on the JSONL backend until the parent SIGKILLs it (spec/policy.md §3).

Usage: ``python crash_child.py <mode> <root> <marker> [--no-policy] [--window-ms N] [--seed S] [--backend B]
[--compression zstd|none] [--sealed]``

``--sealed``: the JSONL backend encrypts every batch, with the keys of the environment variable ``DSH_CRASH_KEYS``
(given to it through the backend class's ``key_options``, the path ``dsh-sessions --key-env`` takes).

Modes (the marker text the child writes once it reached the kill point, then it blocks):

* ``request``: killed inside the model adapter, after the request checkpoint (``request-dispatched``);
* ``tool``: killed inside a tool body after its visible side effect (``tool-side-effect``);
* ``between``: killed between steps: step 1 ran a tool, the step-2 pre-step (inside the policy) blocks
  (``between-steps``);
* ``random``: endless seeded turns (text, exclusive and parallel tool calls, small sleeps); writes ``running`` at
  the first model dispatch and never blocks on purpose; the parent kills it at a random moment.

Side files under ``<root>``: ``acks`` gets one line ``"<n> <type of event n-1>"`` after every ``SessionStore.flush``
returns (single ``write`` + ``fsync`` per line): the first ``n`` events were acknowledged durable; ``acked.jsonl``
gets, in the same step and before it, the wire JSON (``encode_event``) of every newly acknowledged event, one per
line, so the parent compares each acknowledged event byte for byte. ``effects/<id>``
is written by a tool body as its side effect, before anything else the body does.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Awaitable, Generator, Iterator
from pathlib import Path
from typing import Any

import anyio
from dsh.session_persistence import (
    Deferred,
    Host,
    ModelRequest,
    PersistenceCoordinator,
    PreStepDecision,
    PreStepInput,
    Session,
    SessionStore,
    hookimpl,
)
from dsh.session_persistence.backend import encode_event
from dsh.session_persistence.loop import AgentLoop
from dsh.session_persistence.testing import (
    ScriptedAdapter,
    ScriptedResponse,
    ScriptedTool,
    TextResponse,
    ToolCallResponse,
)

SESSION_ID = "semantic-checkpoint-crash"
KEYS_ENV = "DSH_CRASH_KEYS"
POLICY_PLUGIN = "session-checkpoint-policy"
MARKERS = {
    "request": "request-dispatched",
    "tool": "tool-side-effect",
    "between": "between-steps",
    "random": "running",
}


def write_once(path: Path, text: str, *, mode: int = os.O_WRONLY) -> None:
    """One ``write`` (+ fsync) so a reader never sees a torn marker."""
    fd = os.open(path, mode, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class AckingStore(SessionStore):
    """A store that appends ``"<n> <type>"`` to the ack file after each flush returns."""

    def __init__(self, host: Host, ack_path: Path) -> None:
        super().__init__(host)
        self._ack_fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._events_fd = os.open(ack_path.with_name("acked.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._acked = 0

    async def flush(self, session: Session) -> bool:
        events = session.events
        ran = await super().flush(session)
        if events:
            fresh = b"".join(encode_event(e) + b"\n" for e in events[self._acked :])
            if fresh:
                # One write + fsync: the parent reads complete lines only (a kill mid-write leaves a fragment).
                view = memoryview(fresh)
                while view:
                    view = view[os.write(self._events_fd, view) :]
                os.fsync(self._events_fd)
            self._acked = max(self._acked, len(events))
            os.write(self._ack_fd, f"{len(events)} {events[-1].type}\n".encode())
            os.fsync(self._ack_fd)
        return ran


class BlockBetweenSteps:
    """A pre-step wrapper registered ``trylast`` (inside the policy): blocks at step 2 after writing the marker."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    @hookimpl(wrapper=True, trylast=True)
    def agent_pre_step(
        self, pre_step: PreStepInput
    ) -> Generator[None, Awaitable[PreStepDecision], Awaitable[PreStepDecision]]:
        inner = yield
        return Deferred(self._run, inner, pre_step)

    async def _run(self, inner: Awaitable[PreStepDecision], pre_step: PreStepInput) -> PreStepDecision:
        if pre_step.step == 2:
            write_once(self.marker, MARKERS["between"])
            await anyio.sleep_forever()
        return await inner


def random_script(rng: random.Random) -> Iterator[ScriptedResponse]:
    """Endless responses: per turn either text, or 1-4 tool calls (mixed parallel/exclusive) then text."""
    call = 0
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    while True:
        if rng.random() < 0.3:
            yield TextResponse(" ".join(rng.choices(words, k=rng.randint(1, 12))))
            continue
        calls = []
        for _ in range(rng.randint(1, 4)):
            call += 1
            calls.append((f"call-{call}", rng.choice(["effect_p", "effect_x"]), {"n": call}))
        yield ToolCallResponse(tuple(calls))
        yield TextResponse(" ".join(rng.choices(words, k=rng.randint(1, 6))))


async def run(args: argparse.Namespace) -> None:
    root = Path(args.root)
    marker = Path(args.marker)
    effects = root / "effects"
    effects.mkdir(exist_ok=True)
    host = Host()
    host.load_entrypoints()
    if args.no_policy:
        host.unregister(name=POLICY_PLUGIN)
    store = AckingStore(host, root / "acks")
    backend_cls: Any = host.dsh_session_backends()["jsonl"]
    keys = backend_cls.key_options("env", KEYS_ENV) if args.sealed else {}
    backend = backend_cls(root / "sessions", compression=args.compression, **keys)
    rng = random.Random(args.seed)

    async def block_after_marker(text: str) -> None:
        write_once(marker, text)
        await anyio.sleep_forever()

    async def request_hook(request: ModelRequest) -> None:
        await block_after_marker(MARKERS["request"])

    marked = False

    async def running_hook(request: ModelRequest) -> None:
        nonlocal marked
        if not marked:
            marked = True
            write_once(marker, MARKERS["random"])

    async def effect(arguments: Any, call_id: str) -> None:
        write_once(effects / call_id, call_id, mode=os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        if args.mode == "tool":
            await block_after_marker(MARKERS["tool"])
        elif args.mode == "random":
            await anyio.sleep(rng.random() * 0.004)

    tools = [
        ScriptedTool("crash_tool", output="null", side_effect=effect),
        ScriptedTool("effect_p", parallel=True, side_effect=effect),
        ScriptedTool("effect_x", side_effect=effect),
    ]
    script: Iterator[ScriptedResponse]
    chunk_delay = 0.0
    if args.mode == "request":
        script = iter([TextResponse("never streamed", hook=request_hook)])
    elif args.mode == "tool":
        script = iter([ToolCallResponse((("crash-call", "crash_tool", {}),))])
    elif args.mode == "between":
        host.register(BlockBetweenSteps(marker), name="block-between-steps")
        script = iter([ToolCallResponse((("crash-call", "crash_tool", {}),)), TextResponse("never")])
    else:
        script = (
            TextResponse(r.text, hook=running_hook) if isinstance(r, TextResponse) else r for r in random_script(rng)
        )
        chunk_delay = 0.0005
    adapter = ScriptedAdapter(script, chunk_delay=chunk_delay)
    async with anyio.create_task_group() as tg:
        tg.start_soon(exit_with_parent)
        await drive(args, host, store, backend, adapter, tools)


async def exit_with_parent() -> None:
    """Never outlive the parent: a torture run interrupted between spawn and kill must not leak a busy child."""
    parent = os.getppid()
    while os.getppid() == parent:  # noqa: ASYNC110 - no event exists for "my parent died"
        await anyio.sleep(0.5)
    os._exit(3)


async def drive(
    args: argparse.Namespace, host: Host, store: SessionStore, backend: Any, adapter: ScriptedAdapter, tools: list[Any]
) -> None:
    async with PersistenceCoordinator(host, backend, write_batch_max_delay_ms=args.window_ms):
        # --no-policy is the negative control: an explicit opt-out (the loop refuses to run without one otherwise).
        loop = AgentLoop(
            host,
            store,
            adapter,
            tools,
            provider="crash",
            model="crash",
            session_id=SESSION_ID,
            require_checkpoint_policy=not args.no_policy,
        )
        turn = 0
        while True:
            turn += 1
            await loop.run_turn(f"turn {turn}")
            if args.mode != "random":
                await anyio.sleep_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=sorted(MARKERS))
    parser.add_argument("root")
    parser.add_argument("marker")
    parser.add_argument("--no-policy", action="store_true")
    parser.add_argument("--window-ms", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--compression", choices=["zstd", "none"], default="none")
    parser.add_argument("--sealed", action="store_true")
    args = parser.parse_args(argv)
    anyio.run(run, args, backend=args.backend)


if __name__ == "__main__":
    main(sys.argv[1:])
