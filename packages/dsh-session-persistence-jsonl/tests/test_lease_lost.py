"""A lock file deleted or replaced under a live writer admits no second writer (issue 25, item 4).

Real processes on real files: process A holds a session through a coordinator, with a tool call recorded and
still running; then ``session.lock`` is deleted (or replaced by a fresh file) behind its back, and process B
tries to write the same session: the cold ``load`` that would commit crash repair (``TOOL_OUTCOME_UNKNOWN`` for
A's running call), a live seeded write, and the bare lease. Each must be refused with ``SessionLockedError``,
the lease probe (the CLI's live listing) must still find A, and A must keep writing and close cleanly: the
stored log is exactly what A wrote, nothing from B, and no ``SeqMismatchError``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh.session_persistence.backend import encode_event
from dsh.session_persistence.testing import meta
from dsh.session_persistence_jsonl import JsonlBackend

LONG = os.environ.get("DSH_LONG") == "1"
SESSION_ID = "lease-lost"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the anchor and the probe need Linux")

WRITER = textwrap.dedent(
    """
    import json, sys, anyio
    from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
    from dsh.session_persistence.backend import encode_event
    from dsh.session_persistence.testing import (
        assistant_message, meta, simple_turn, step_end, step_start, tool_call, turn_end, turn_start, user_message,
    )
    from dsh.session_persistence_jsonl import JsonlBackend

    async def main(root, session_id, compression):
        host = Host()
        store = SessionStore(host)
        written = []
        async with PersistenceCoordinator(host, JsonlBackend(root, compression=compression)) as persistence:
            session = store.create(session_id, meta=meta(session_id, "/w"))

            async def write(events):
                for e in events:
                    session.append_event(e)
                await store.flush(session)
                written.extend(encode_event(e).decode() for e in events)

            # A tool call recorded and still running: what a second writer's crash repair would close.
            await write([turn_start(0, 1), user_message(1, "charge it"), step_start(2, 1, 1),
                         assistant_message(3, "", tool_calls=["call-1"]), tool_call(4, "call-1")])
            print("holding", flush=True)
            while (await anyio.to_thread.run_sync(sys.stdin.readline)).strip() == "write":
                n = len(session.events)
                await write([step_end(n, 1, 1), turn_end(n + 1, 1)] if n == 5 else simple_turn(n, n // 3, "more"))
                print("written", flush=True)
            store.dispose(session)
        print(json.dumps(written), flush=True)

    anyio.run(main, *sys.argv[1:4], backend=sys.argv[4])
    """
)

INTRUDER = textwrap.dedent(
    """
    import json, sys, anyio
    from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
    from dsh.session_persistence.testing import meta, simple_turn, step_end, turn_end
    from dsh.session_persistence_jsonl import JsonlBackend

    def outcome(exc):
        return None if exc is None else [c.__name__ for c in type(exc).__mro__]

    async def main(root, session_id, compression):
        host = Host()
        backend = JsonlBackend(root, compression=compression)
        header = meta(session_id, "/w")
        report = {"holder": await backend.writer_lease_holder(header)}
        try:
            lease = await backend.acquire_writer_lease(header)
        except Exception as exc:
            report["lease"] = outcome(exc)
        else:
            report["lease"] = None
            await lease.release()
        try:
            await attempts(host, root, session_id, compression, backend, report)
        except Exception as exc:  # the refused write, re-raised as the coordinator closes
            report["close"] = outcome(exc)
        print(json.dumps(report), flush=True)

    async def attempts(host, root, session_id, compression, backend, report):
        async with PersistenceCoordinator(host, JsonlBackend(root, compression=compression)) as persistence:
            try:
                await persistence.load(session_id)  # A's turn is open: this load must commit crash repair
            except Exception as exc:
                report["load"] = outcome(exc)
            else:
                report["load"] = None
            store = SessionStore(host)
            stored = await backend.load_stored(session_id)
            session = store.create(session_id, seed=stored.events, meta=stored.meta)
            n = len(session.events)
            # A well-formed continuation (a session a coordinator holds refuses a broken one before the lease is
            # even asked): close A's open turn, then a turn of its own.
            for e in [step_end(n, 1, 1), turn_end(n + 1, 1), *simple_turn(n + 2, 2, "intruder")]:
                session.append_event(e)
            try:
                await store.flush(session)
            except Exception as exc:
                report["write"] = outcome(exc)
            else:
                report["write"] = None
            store.dispose(session)

    anyio.run(main, *sys.argv[1:4], backend=sys.argv[4])
    """
)


def lock_path(root: Path, compression: str) -> Path:
    backend = JsonlBackend(root, compression=compression)  # type: ignore[arg-type]
    return Path(backend.locate(meta(SESSION_ID, "/w")).path).parent / "session.lock"


def take_away(lock: Path, how: str) -> None:
    """What an operator's clean-up (or a restore) does to the lock file of a live session."""
    assert lock.exists()
    if how == "deleted":
        lock.unlink()
    else:
        fresh = lock.with_name("session.lock.new")
        fresh.write_text("{}")
        os.replace(fresh, lock)


def intrude(root: Path, compression: str, backend: str) -> dict[str, Any]:
    argv = [sys.executable, "-c", INTRUDER, str(root), SESSION_ID, compression, backend]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def stored_wire(root: Path, compression: str) -> list[str]:
    async def load() -> list[str]:
        stored = await JsonlBackend(root, compression=compression).load_stored(SESSION_ID)  # type: ignore[arg-type]
        assert stored is not None
        return [encode_event(e).decode() for e in stored.events]

    return anyio.run(load)


CASES = [("deleted", "asyncio", "zstd"), ("replaced", "trio", "none")]
if LONG:
    CASES += [("deleted", "trio", "none"), ("replaced", "asyncio", "zstd"), ("deleted", "asyncio", "none")]


@pytest.mark.parametrize(("how", "backend", "compression"), CASES)
def test_a_taken_away_lock_file_admits_no_second_writer(
    tmp_path: Path, how: str, backend: str, compression: str
) -> None:
    root = tmp_path / "root"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), SESSION_ID, compression, backend],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert writer.stdin is not None and writer.stdout is not None
    try:
        assert writer.stdout.readline().strip() == "holding"
        take_away(lock_path(root, compression), how)
        # B, on the other backend, in every way it could start writing the session.
        report = intrude(root, compression, {"asyncio": "trio", "trio": "asyncio"}[backend])
        for attempt in ("lease", "load", "write"):
            assert report[attempt] is not None, (attempt, report)
            assert "SessionLockedError" in report[attempt], (attempt, report)
        # The probe still finds the writer (nameless once its lock file is gone or replaced).
        assert report["holder"] is not None, report
        # A keeps writing: its turn completes and another follows.
        for _ in range(2):
            writer.stdin.write("write\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "written"
        out, err = writer.communicate("done\n", timeout=60)
        assert writer.returncode == 0, err  # a SeqMismatchError (or any failure) at A's exit would land here
        written = json.loads(out.strip().splitlines()[-1])
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.communicate()
    assert len(written) == 10
    # Exactly what A wrote: no repair, no intruder turn, nothing lost.
    assert stored_wire(root, compression) == written
