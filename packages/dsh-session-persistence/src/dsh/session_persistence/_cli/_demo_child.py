"""The demo's child process: runs the scripted agent on the JSONL backend until the parent SIGKILLs it.

``python -m dsh.session_persistence._cli._demo_child ROOT WORK [--backend asyncio|trio]``

It composes what a user would (``Host`` + ``load_entrypoints``: the JSONL backend and the checkpoint policy;
``SessionStore``; ``PersistenceCoordinator``; ``AgentLoop``), runs turn 1 to completion, then turn 2, whose
``pay_deposit`` tool writes its ledger entry, writes ``KILL_MARKER`` into ``WORK/marker`` and waits to be killed.
If the parent disappears first, the child exits on its own instead of lingering.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import anyio

from .._coordinator import PersistenceCoordinator
from .._host import Host
from .._session import SessionStore
from ..loop import AgentLoop
from ._demo_script import KILL_MARKER, MODEL, PROVIDER, SESSION_ID, USER_TURNS, DemoModel, crash_script, demo_tools

__all__ = ["main"]

ORPHAN_EXIT = 3


async def run(root: str, work: str, session_id: str = SESSION_ID) -> None:
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
        loop = AgentLoop(host, store, DemoModel(crash_script()), tools, provider=PROVIDER, model=MODEL, session=session)
        for text in USER_TURNS:
            await loop.run_turn(text)
        raise RuntimeError("the demo child was not killed inside pay_deposit")


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run."""
    parser = argparse.ArgumentParser(prog="python -m dsh.session_persistence._cli._demo_child")
    parser.add_argument("root")
    parser.add_argument("work")
    parser.add_argument("--session-id", default=SESSION_ID)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args(argv)
    anyio.run(run, args.root, args.work, args.session_id, backend=args.backend)


if __name__ == "__main__":
    main(sys.argv[1:])
