"""The backend writer (``BlockingWriter``): one session's jobs in order, one at a time; different sessions' jobs at
once, and a stalled job never holds another session's; a job always runs to its end before its cancelled caller
leaves, errors reach the caller, and no thread outlives ``aclose`` or holds the process open. Every test runs on
asyncio and trio."""

from __future__ import annotations

import subprocess
import sys
import threading

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from dsh.session_persistence_jsonl._writer import BlockingWriter

pytestmark = pytest.mark.anyio

#: A guard against a deadlock in the code under test, never a timing assertion: far above any real wait.
STUCK = 60.0


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(name) and t.is_alive()]


async def test_jobs_of_one_key_run_in_order_one_at_a_time() -> None:
    writer = BlockingWriter(4, name="dsh-test-order")
    gate = threading.Event()
    ran: list[str] = []

    def first() -> None:
        assert gate.wait(STUCK)
        ran.append("first")

    def second() -> None:
        ran.append("second")

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.run, "session-a", first)
            await anyio.lowlevel.checkpoint()  # queued first
            tg.start_soon(writer.run, "session-a", second)
            await anyio.sleep(0.05)
            try:
                assert ran == []  # the second waits behind the first, on the same lane
            finally:
                gate.set()
        assert ran == ["first", "second"]
    finally:
        await writer.aclose()


async def test_jobs_of_different_lanes_run_at_the_same_time() -> None:
    writer = BlockingWriter(2, name="dsh-test-overlap")
    other_ran = threading.Event()

    def waits_for_the_other() -> str:
        assert other_ran.wait(STUCK), "the other lane never ran while this one was busy"
        return "done"

    try:
        async with anyio.create_task_group() as tg:
            # hash(0) % 2 == 0 and hash(1) % 2 == 1: two lanes.
            tg.start_soon(writer.run, 0, waits_for_the_other)
            await anyio.lowlevel.checkpoint()
            assert await writer.run(1, other_ran.set) is None
        assert await writer.run(0, waits_for_the_other) == "done"
    finally:
        await writer.aclose()


async def test_a_cancelled_caller_leaves_only_after_its_job_ended() -> None:
    writer = BlockingWriter(1, name="dsh-test-shield")
    started = threading.Event()
    gate = threading.Event()
    ended: list[bool] = []
    seen_by_caller: list[list[bool]] = []

    def step() -> None:
        started.set()
        assert gate.wait(STUCK)
        ended.append(True)

    async def caller() -> None:
        try:
            await writer.run("s", step)
            await anyio.lowlevel.checkpoint()  # where a cancelled caller sees its cancellation
        finally:
            seen_by_caller.append(list(ended))

    try:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(caller)
                await anyio.to_thread.run_sync(started.wait, STUCK)
                scope.cancel()
                # The job is released from outside a moment later; the caller is still waiting for it then.
                threading.Timer(0.05, gate.set).start()
        assert scope.cancelled_caught
        assert seen_by_caller == [[True]]  # the step ran to its end before the caller left
    finally:
        gate.set()
        await writer.aclose()


async def test_a_job_error_is_raised_to_its_caller_and_the_lane_goes_on() -> None:
    writer = BlockingWriter(1, name="dsh-test-errors")

    def fails() -> None:
        raise OSError(5, "disk on fire")

    try:
        with pytest.raises(OSError, match="disk on fire"):
            await writer.run("s", fails)
        assert await writer.run("s", lambda: 42) == 42
    finally:
        await writer.aclose()


async def test_aclose_ends_every_thread_and_a_later_job_starts_one_again() -> None:
    name = "dsh-test-close"
    writer = BlockingWriter(3, name=name, idle_seconds=3600)
    together = threading.Barrier(3, timeout=STUCK)  # three jobs that can only finish together need three threads
    async with anyio.create_task_group() as tg:
        for key in range(3):
            tg.start_soon(writer.run, key, together.wait)
    assert len(_threads(name)) == 3
    await writer.aclose()
    assert _threads(name) == []
    assert await writer.run(0, lambda: "again") == "again"
    assert len(_threads(name)) == 1
    await writer.aclose()
    await writer.aclose()  # idempotent
    assert _threads(name) == []


async def test_a_sleeping_thread_takes_the_next_job_and_no_thread_is_started_for_it() -> None:
    name = "dsh-test-reuse"
    writer = BlockingWriter(4, name=name, idle_seconds=3600)
    try:
        for step in range(20):  # one after the other: each finds the thread asleep and wakes it
            assert await writer.run(f"session-{step % 3}", lambda step=step: step) == step
        assert len(_threads(name)) == 1
    finally:
        await writer.aclose()
    assert _threads(name) == []


async def test_an_idle_thread_ends_and_jobs_racing_its_timeout_all_run() -> None:
    """A thread ends after ``idle_seconds`` without work; a job submitted as a thread's wait times out is never
    stranded (the thread either takes it or ends with nobody having chosen it)."""
    name = "dsh-test-idle"
    writer = BlockingWriter(2, name=name, idle_seconds=0.001)
    try:
        with anyio.fail_after(STUCK):
            for step in range(200):
                assert await writer.run(f"session-{step % 2}", lambda step=step: step) == step
                if step % 7 == 0:
                    await anyio.sleep(0.001)  # about one idle period: some waits time out as the next job comes
            # Every thread ends once idle (the threads themselves decide: nothing here to wait on but their end).
            for thread in _threads(name):
                await anyio.to_thread.run_sync(thread.join, STUCK)
        assert _threads(name) == []
        assert await writer.run("later", lambda: "again") == "again"
    finally:
        await writer.aclose()
    assert _threads(name) == []


async def test_a_stalled_job_holds_only_its_own_session() -> None:
    """A session whose step stalls (a slow fsync) holds one thread and its own later steps; every other session's
    steps run on the other thread meanwhile (0.3's fixed lanes held every session hashed to the stalled lane)."""
    writer = BlockingWriter(2, name="dsh-test-stall")
    stalled = threading.Event()
    release = threading.Event()
    after_stall: list[str] = []

    def stall() -> None:
        stalled.set()
        assert release.wait(STUCK)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.run, "slow", stall)
            await anyio.to_thread.run_sync(stalled.wait, STUCK)
            tg.start_soon(writer.run, "slow", lambda: after_stall.append("slow again"))
            with anyio.fail_after(STUCK):
                for key in range(20):  # with two fixed lanes, about half of these keys would share the stalled one
                    assert await writer.run(f"session-{key}", lambda key=key: key) == key
            assert after_stall == []  # the stalled session's own next step still waits behind it
            release.set()
        assert after_stall == ["slow again"]
    finally:
        release.set()
        await writer.aclose()


def test_an_unclosed_writer_does_not_hold_the_process_open() -> None:
    script = (
        "import anyio\n"
        "from dsh.session_persistence_jsonl._writer import BlockingWriter\n"
        "writer = BlockingWriter(2, idle_seconds=3600)\n"
        "async def main():\n"
        "    assert await writer.run('s', lambda: 7) == 7\n"
        "anyio.run(main)\n"
        "print('exiting')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=STUCK, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exiting"


def test_lanes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="lanes"):
        BlockingWriter(0)
    with pytest.raises(ValueError, match="idle_seconds"):
        BlockingWriter(1, idle_seconds=0)
