"""The demo's child process: runs the agent on the JSONL backend until the parent SIGKILLs it.

``python -m dsh.session_persistence._cli._demo_child ROOT WORK [--backend asyncio|trio] [--model NAME
[--base-url URL]]`` (with ``--model``, a real model through the installed adapter, the key in ``$OPENAI_API_KEY``)

It composes what a user would (``Host`` + ``load_entrypoints``: the JSONL backend and the checkpoint policy;
``SessionStore``; ``PersistenceCoordinator``; ``AgentLoop``), runs turn 1 to completion, then turn 2, whose
``pay_deposit`` tool writes its ledger entry, writes ``KILL_MARKER`` into ``WORK/marker`` and waits to be killed.
If the parent disappears first, the child exits on its own instead of lingering. A real model that fails, or that
ends turn 2 without calling ``pay_deposit``, makes the child say so (its last line, which the parent quotes) and
exit with ``NO_KILL_POINT_EXIT``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, NoReturn

import anyio

from .._coordinator.service import PersistenceCoordinator
from .._host.host import Host
from .._host.session import SessionStore
from ..loop import AgentLoop
from ._demo_model import RealModel, close_adapter, open_adapter, real_model
from ._demo_script import (
    KILL_MARKER,
    MODEL,
    PROVIDER,
    SESSION_ID,
    SYSTEM,
    USER_TURNS,
    DemoModel,
    crash_script,
    demo_tools,
)
from ._errors import CliError

__all__ = ["main"]

ORPHAN_EXIT = 3
NO_KILL_POINT_EXIT = 4


def _give_up(why: str) -> NoReturn:
    print(why, flush=True)  # the last line of the child's log: the parent quotes it
    os._exit(NO_KILL_POINT_EXIT)


async def run(root: str, work: str, session_id: str = SESSION_ID, choice: RealModel | None = None) -> None:
    """Run turns 1 and 2; never returns normally (the parent kills the process inside turn 2)."""
    parent = os.getppid()
    marker = os.path.join(work, "marker")

    async def wait_for_the_kill() -> None:
        fd = os.open(marker, os.O_WRONLY | os.O_TRUNC | os.O_CREAT, 0o600)
        try:
            os.write(fd, KILL_MARKER.encode())  # one write: the parent never sees half a marker
            os.fsync(fd)
        finally:
            os.close(fd)
        # Poll: nothing signals "my parent died" portably; the parent normally SIGKILLs us long before.
        while os.getppid() == parent:  # noqa: ASYNC110
            await anyio.sleep(0.05)
        os._exit(ORPHAN_EXIT)

    host = Host()
    host.load_entrypoints()  # the JSONL backend and the checkpoint policy, found as installed plugins
    store = SessionStore(host)
    backend: Any = host.dsh_session_backends()["jsonl"](root)  # type: ignore[call-arg]
    async with PersistenceCoordinator(host, backend):
        meta = {"version": 0, "id": session_id, "createdAt": int(time.time() * 1000), "cwd": work, "isSeeded": False}
        session = store.create(session_id, meta=meta)
        tools = demo_tools(work, after_payment=wait_for_the_kill)
        if choice is None:
            model: Any = DemoModel(crash_script())
            loop = AgentLoop(host, store, model, tools, provider=PROVIDER, model=MODEL, session=session, system=SYSTEM)
        else:
            model = open_adapter(choice)  # provider and model names come from the adapter
            loop = AgentLoop(host, store, model, tools, session=session, system=SYSTEM)
        try:
            for number, text in enumerate(USER_TURNS, 1):
                result = await loop.run_turn(text)
                if result.reason.error is not None:
                    error = result.reason.error
                    _give_up(f"the model failed in turn {number}: {error.code}: {error.message}")
        finally:
            await close_adapter(model)
        _give_up(f"turn 2 ended ({result.reason.kind}) without the model calling pay_deposit: no kill point")


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run."""
    parser = argparse.ArgumentParser(prog="python -m dsh.session_persistence._cli._demo_child")
    parser.add_argument("root")
    parser.add_argument("work")
    parser.add_argument("--session-id", default=SESSION_ID)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--model", default=None)
    parser.add_argument("--base-url", default=None)
    args = parser.parse_args(argv)
    try:
        choice = real_model(args.model, args.base_url, None)
    except CliError as exc:
        _give_up(str(exc))
    anyio.run(run, args.root, args.work, args.session_id, choice, backend=args.backend)


if __name__ == "__main__":
    main(sys.argv[1:])
