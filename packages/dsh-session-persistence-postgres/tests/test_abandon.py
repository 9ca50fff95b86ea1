"""Abandoned calls: a write whose caller left never blocks the session's next one, and never outlives ``aclose``.

A caller cancelled while its write is still queued for a worker thread leaves a write that may never run at all
(anyio's asyncio backend drops a queued job whose caller left): the session's next write must not wait for it.
A caller cancelled while its write waits on the server (a row lock held elsewhere with no ``lock_timeout``, a
silent network with no ``client_timeout``) leaves a thread that would wait as long as the server does: ``aclose``
cancels that statement on the server and, if need be, shuts the socket down, so the process can exit. Each hang
is caught by a bound (``SAFETY_NET``, the child's time limit) that a passing run never comes near: not a timing
assertion.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable

import anyio
import anyio.lowlevel
import anyio.to_thread
import psycopg
import pytest
from dsh.session_persistence.backend import SeqMismatchError, StorageMetadata
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import PostgresBackend

from ._proxy import PgProxy

SAFETY_NET = 60  # seconds: a hang fails the test instead of blocking the run; never reached when it passes
CHILD_LIMIT = 120  # seconds a child may take to abandon a call, close its backend and exit
ROUNDS = 24
LONG = os.environ.get("DSH_LONG") == "1"
# Each child costs seconds: by default each test runs one loop, where its guard matters most (asyncio's worker
# threads are not daemon threads, so a thread left waiting keeps the process alive); DSH_LONG=1 runs both.
ROW_LOCK_LOOPS = ["asyncio", "trio"] if LONG else ["trio"]
SILENT_LOOPS = ["asyncio", "trio"] if LONG else ["asyncio"]


@pytest.fixture
def schema(fresh_schema: Callable[[], str]) -> str:
    return fresh_schema()


async def _stored(dsn: str, schema: str, session_id: str) -> list[object] | None:
    backend = PostgresBackend(dsn, schema=schema)
    try:
        stored = await backend.load_stored(session_id)
    finally:
        await backend.aclose()
    return None if stored is None else list(stored.events)


@pytest.mark.anyio
async def test_a_write_abandoned_at_any_checkpoint_never_blocks_the_next(postgres_dsn: str, schema: str) -> None:
    """Each round cancels an append after 0..7 checkpoints (often while it is still queued for a thread), then
    sends the same batch again: the retry is acknowledged (never left waiting for a write that never ran), and the
    log holds each batch once."""
    storage = StorageMetadata(meta("ab"))
    backend = PostgresBackend(postgres_dsn, schema=schema)
    expected = one_turn_log()
    try:
        await backend.append_batch(storage, expected, False)
        for round_no in range(ROUNDS):
            batch = simple_turn(len(expected), round_no + 2)
            with anyio.CancelScope() as scope:

                async def cancel_after(scope: anyio.CancelScope = scope, k: int = round_no % 8) -> None:
                    for _ in range(k):
                        await anyio.lowlevel.checkpoint()
                    scope.cancel()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(cancel_after)
                    await backend.append_batch(storage, batch, True)
            with anyio.fail_after(SAFETY_NET):  # the guard: the retry is answered, never left waiting
                try:
                    await backend.append_batch(storage, batch, True)
                except SeqMismatchError:
                    # The cancelled attempt had already been sent and committed (the caller left after the send):
                    # the store refuses the same batch twice, and holds it once.
                    stored = await _stored(postgres_dsn, schema, "ab")
                    assert stored is not None and stored[len(expected) :] == batch, round_no
            expected = expected + batch
    finally:
        await backend.aclose()
    assert await _stored(postgres_dsn, schema, "ab") == expected


CHILD = textwrap.dedent(
    """
    import sys
    import anyio
    from dsh.session_persistence.backend import SeqMismatchError, StorageMetadata
    from dsh.session_persistence.testing import meta, simple_turn
    from dsh.session_persistence_postgres import PostgresBackend

    dsn, schema, app, loop = sys.argv[1:5]

    async def main():
        # No lock_timeout, statement_timeout or client_timeout: nothing of the backend's own ends the abandoned wait.
        backend = PostgresBackend(
            dsn,
            schema=schema,
            lock_timeout=None,
            statement_timeout=None,
            connection_kwargs={"application_name": app},
        )
        await backend.list()  # started: pool open, schema checked
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        with anyio.move_on_after(0.5) as scope:
            await backend.append_batch(StorageMetadata(meta("held")), simple_turn(6, 2), True)
        print("abandoned" if scope.cancelled_caught else "returned", flush=True)
        await backend.aclose()
        print("closed", flush=True)

    anyio.run(main, backend=loop)
    """
)


def _run_child(dsn: str, schema: str, app: str, loop: str, before_go: Callable[[], None]) -> list[str]:
    """Start the child, ``before_go`` once it is ready, then let it abandon its append; its output lines."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, dsn, schema, app, loop],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ready = proc.stdout.readline()
        assert ready.strip() == "ready", proc.stderr.read() if proc.stderr else ""
        before_go()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=CHILD_LIMIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the child did not exit within {CHILD_LIMIT} s after abandoning a call and closing")
    assert proc.returncode == 0, err
    return ["ready", *out.split()]


def _create_held(dsn: str, schema: str) -> None:
    async def create() -> None:
        backend = PostgresBackend(dsn, schema=schema)
        try:
            await backend.append_batch(StorageMetadata(meta("held")), one_turn_log(), False)
        finally:
            await backend.aclose()

    anyio.run(create)


def _server_sessions(dsn: str, app: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)).fetchone()
    return 0 if row is None else int(row[0])


def _gone_while_held(dsn: str, app: str) -> bool:
    """Whether the child's server sessions all end (polled up to CHILD_LIMIT: the server ends them on its own)."""
    limit = time.monotonic() + CHILD_LIMIT
    while _server_sessions(dsn, app) and time.monotonic() < limit:
        time.sleep(0.1)
    return _server_sessions(dsn, app) == 0


@pytest.mark.parametrize("loop", ROW_LOCK_LOOPS)
def test_a_process_exits_after_aclose_with_a_call_abandoned_on_a_row_lock(
    postgres_dsn: str, schema: str, loop: str
) -> None:
    """The child's append waits on a row lock this test holds (no lock_timeout); its caller leaves; ``aclose``
    returns and the process exits while the lock is still held, and its server session is gone too (the wait
    was cancelled on the server, not left to commit whenever the lock is released)."""
    _create_held(postgres_dsn, schema)
    app = f"dsh-abandon-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn) as holder:
        holder.execute(f'SELECT 1 FROM "{schema}".dsh_sessions WHERE id = %s FOR UPDATE'.encode(), ("held",))
        lines = _run_child(postgres_dsn, schema, app, loop, lambda: None)
        assert lines == ["ready", "abandoned", "closed"]
        assert _gone_while_held(postgres_dsn, app), "the abandoned statement still runs on the server"
        holder.rollback()
    # The abandoned append ended on the server before the lock was released: it never committed.
    assert anyio.run(_stored, postgres_dsn, schema, "held") == one_turn_log()


@pytest.mark.parametrize("loop", SILENT_LOOPS)
def test_a_process_exits_after_aclose_with_a_call_abandoned_on_a_silent_network(
    proxy: PgProxy, proxy_dsn: str, postgres_dsn: str, schema: str, loop: str
) -> None:
    """The child's connections are black-holed (new ones too, so its server-side cancel cannot get through) and
    there is no client_timeout: its abandoned append would wait forever; ``aclose`` shuts the socket down, so the
    process exits. The log holds the first batch, or both, never part of one."""
    _create_held(postgres_dsn, schema)

    def blackhole() -> None:
        proxy.blackhole_new = True
        assert proxy.blackhole() >= 1

    try:
        lines = _run_child(proxy_dsn, schema, f"dsh-abandon-{uuid.uuid4().hex[:8]}", loop, blackhole)
    finally:
        proxy.blackhole_new = False
        proxy.close_all()
    assert lines == ["ready", "abandoned", "closed"]
    assert anyio.run(_stored, postgres_dsn, schema, "held") in (one_turn_log(), one_turn_log() + simple_turn(6, 2))
