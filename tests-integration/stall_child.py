"""Child process for test_stalled_fsync: ``python stall_child.py LOOP ROOT RELEASE``.

One coordinator over a JSONL root holds 21 live sessions, each written once. Then the LD_PRELOAD shim pauses the
next fsync of session ``slow``'s transcript (the paused call creates ``RELEASE.paused`` and waits for ``RELEASE``),
and ``slow`` flushes in a task of its own: its barrier is stuck below Python. Meanwhile every peer appends and
flushes; the child prints ``peers durable while slow is stalled`` when all 20 barriers returned and ``slow``'s had
not, then creates ``RELEASE`` and prints ``slow durable`` once its barrier returns.
"""

from __future__ import annotations

import os
import sys

import anyio
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
from dsh.session_persistence.testing import FaultRule, fault_spec
from dsh.session_persistence_jsonl import JsonlBackend

PEERS = 20
#: A guard against a hang in the code under test, never a timing assertion.
STUCK = 60.0


async def main(root: str, release: str) -> None:
    host = Host()
    store = SessionStore(host)
    async with PersistenceCoordinator(host, JsonlBackend(root)):  # type: ignore[arg-type]
        sessions = {
            name: store.create(name, meta={"cwd": root}) for name in ["slow", *(f"peer-{i}" for i in range(PEERS))]
        }
        for session in sessions.values():
            session.append("turn/start", {"turn": 1})
            await store.flush(session)
        os.environ["DSH_SHIM_FAULT"] = fault_spec(
            [FaultRule(ops=("fsync", "fdatasync"), path="/slow/session.jsonl", pause=release)]
        )
        slow_done = anyio.Event()

        async def flush_slow() -> None:
            sessions["slow"].append("step/start", {"turn": 1, "step": 1})
            await store.flush(sessions["slow"])
            slow_done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(flush_slow)
            paused = anyio.Path(f"{release}.paused")
            with anyio.fail_after(STUCK):
                # The shim's marker file, polled: no event crosses from the paused C call.
                while not await paused.exists():  # noqa: ASYNC110
                    await anyio.sleep(0.01)
                for name, session in sessions.items():
                    if name != "slow":
                        session.append("step/start", {"turn": 1, "step": 1})
                        await store.flush(session)
            print(
                "peers durable while slow is stalled" if not slow_done.is_set() else "slow was not stalled", flush=True
            )
            await anyio.Path(release).touch()
            with anyio.fail_after(STUCK):
                await slow_done.wait()
        print("slow durable", flush=True)
        for session in sessions.values():
            store.dispose(session)


if __name__ == "__main__":
    anyio.run(main, sys.argv[2], sys.argv[3], backend=sys.argv[1])
