"""Write-behind controller (spec coordinator §3, scenarios 105-114) on asyncio and trio.

Time is driven by ``ManualScheduler``; background writes run in a real task group. "Settled" means
every task is blocked (``anyio.wait_all_tasks_blocked``), so a write a timer started has reached the
recording sink (or its gate) before the test looks.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup, TaskStatus
from dsh.session_persistence._coordinator.scheduling import ManualScheduler, TaskGroupScheduler
from dsh.session_persistence._coordinator.write_behind import (
    WriteBehindAbandonedError,
    WriteBehindController,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.anyio

Event = dict[str, Any]


class Boom(Exception):
    """Injected sink failure."""


def ev(seq: int, text: str = "") -> Event:
    return {"seq": seq, "data": {"text": text or f"e{seq}"}}


def seqs(batches: list[list[Event]]) -> list[list[int]]:
    return [[e["seq"] for e in b] for b in batches]


class Sink:
    """Recording durable sink with per-attempt gates and failures (attempts numbered from 0)."""

    def __init__(self) -> None:
        self.calls: list[list[Event]] = []
        self.written: list[list[Event]] = []
        self.gates: dict[int, anyio.Event] = {}
        self.failures: dict[int, BaseException] = {}
        self.started = anyio.Event()
        self.wrote = anyio.Event()
        self.reports: list[BaseException] = []

    def background_failed(self, error: BaseException) -> None:
        self.reports.append(error)

    def gate(self, attempt: int) -> anyio.Event:
        gate = self.gates[attempt] = anyio.Event()
        return gate

    def release_all(self) -> None:
        for gate in self.gates.values():
            gate.set()

    async def write_batch(self, batch: list[Event]) -> None:
        attempt = len(self.calls)
        self.calls.append(list(batch))
        self.started.set()
        gate = self.gates.get(attempt)
        if gate is not None:
            await gate.wait()
        failure = self.failures.get(attempt)
        if failure is not None:
            raise failure
        self.written.append(list(batch))
        self.wrote.set()


class Harness:
    def __init__(
        self, tg: TaskGroup, max_delay_ms: int, copy_fn: Callable[[Event], Event] | None, held: bool = False
    ) -> None:
        self.tg = tg
        self.clock = ManualScheduler()
        self.sink = Sink()
        self.reports = self.sink.reports
        kwargs: dict[str, Any] = {} if copy_fn is None else {"copy": copy_fn}
        self.ctl: WriteBehindController[Event] = WriteBehindController(
            sink=self.sink,
            scheduler=self.clock,
            spawn=tg.start_soon,
            max_delay_ms=max_delay_ms,
            held=held,
            **kwargs,
        )

    def probe(self) -> WriteBehindController[Event]:
        """The controller, through a call so the type checker does not narrow its properties."""
        return self.ctl

    async def advance(self, ms: float) -> None:
        await self.clock.advance_settled(ms)

    def start_flush(self) -> FlushCall:
        call = FlushCall()
        self.tg.start_soon(call.run, self.ctl)
        return call


class FlushCall:
    """A flush running in its own task; records its outcome."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: BaseException | None = None

    async def run(self, ctl: WriteBehindController[Event]) -> None:
        try:
            await ctl.flush()
        except Exception as exc:
            self.error = exc
        finally:
            self.done.set()


@asynccontextmanager
async def harness(
    max_delay_ms: int = 200, copy_fn: Callable[[Event], Event] | None = None, *, held: bool = False
) -> AsyncIterator[Harness]:
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            h = Harness(tg, max_delay_ms, copy_fn, held)
            try:
                yield h
            finally:
                # Never leave a write blocked: the task group could not exit.
                h.sink.release_all()


async def settle() -> None:
    await anyio.wait_all_tasks_blocked()


# --- 7.D scenarios -------------------------------------------------------------------------------


async def test_105_fixed_window_batches_snapshot_copies() -> None:
    async with harness(copy_fn=copy.deepcopy) as h:
        e0 = ev(0, "original")
        h.ctl.enqueue(e0)
        e0["data"]["text"] = "mutated"
        await h.advance(150)
        h.ctl.enqueue(ev(1))
        await h.advance(49)
        assert h.sink.calls == []
        assert h.probe().has_work
        await h.advance(1)
        assert seqs(h.sink.calls) == [[0, 1]]
        assert h.sink.calls[0][0]["data"]["text"] == "original"
        assert not h.probe().has_work
        assert not h.probe().timer_armed


async def test_105_default_copy_is_identity() -> None:
    async with harness() as h:
        e0 = ev(0)
        h.ctl.enqueue(e0)
        await h.advance(200)
        assert h.sink.calls[0][0] is e0


async def test_106_later_events_never_extend_the_window() -> None:
    async with harness() as h:
        for i in range(20):
            if i:
                await h.advance(10)
            h.ctl.enqueue(ev(i))
        assert h.clock.now_ms() == 190
        await h.advance(9)
        assert h.sink.calls == []
        await h.advance(1)
        assert seqs(h.sink.calls) == [list(range(20))]
        assert not h.probe().has_work


async def test_107_concurrent_flushes_share_one_barrier_that_drains_late_events() -> None:
    async with harness() as h:
        h.sink.gate(0)
        h.ctl.enqueue(ev(0))
        first, second = h.start_flush(), h.start_flush()
        await settle()
        assert seqs(h.sink.calls) == [[0]]
        assert h.probe().flushing
        h.ctl.enqueue(ev(1))
        assert not h.probe().timer_armed, "events admitted during a barrier arm no window"
        assert not first.done.is_set()
        assert not second.done.is_set()
        h.sink.gates[0].set()
        await first.done.wait()
        await second.done.wait()
        assert first.error is None
        assert second.error is None
        assert seqs(h.sink.calls) == [[0], [1]]
        assert not h.probe().timer_armed
        assert not h.probe().flushing
        assert not h.probe().has_work


async def test_108_empty_flush_completes_at_once_and_does_not_strand_later_events() -> None:
    async with harness() as h:
        await h.ctl.flush()
        assert not h.probe().flushing
        h.ctl.enqueue(ev(0))
        await settle()
        assert h.sink.calls == []
        assert h.probe().timer_armed
        await h.advance(199)
        assert h.sink.calls == []
        await h.advance(1)
        assert seqs(h.sink.calls) == [[0]]


async def test_108_event_after_a_draining_flush_is_not_stranded() -> None:
    async with harness() as h:
        h.ctl.enqueue(ev(0))
        await h.ctl.flush()
        assert not h.probe().flushing, "the barrier closes in the step that observes emptiness"
        h.ctl.enqueue(ev(1))
        assert h.probe().timer_armed
        await h.advance(200)
        assert seqs(h.sink.calls) == [[0], [1]]


async def test_109_follow_up_starts_when_active_write_succeeds_if_its_deadline_passed() -> None:
    async with harness() as h:
        gate = h.sink.gate(0)
        h.ctl.enqueue(ev(0))
        await h.advance(200)
        assert seqs(h.sink.calls) == [[0]]
        h.ctl.enqueue(ev(1))
        await h.advance(250)  # e1's deadline (t=400) passes while write #1 is active
        assert seqs(h.sink.calls) == [[0]]
        assert not h.probe().timer_armed
        gate.set()
        await settle()  # no clock movement: the follow-up starts immediately
        assert seqs(h.sink.calls) == [[0], [1]]
        assert not h.probe().has_work


async def test_110_follow_up_keeps_its_own_window_if_not_yet_expired() -> None:
    async with harness() as h:
        gate = h.sink.gate(0)
        h.ctl.enqueue(ev(0))
        await h.advance(200)
        assert seqs(h.sink.calls) == [[0]]
        h.ctl.enqueue(ev(1))  # t=200: arms its own window, due at 400
        await h.advance(50)
        gate.set()
        await settle()
        assert seqs(h.sink.calls) == [[0]]
        await h.advance(149)
        assert seqs(h.sink.calls) == [[0]]
        await h.advance(1)
        assert seqs(h.sink.calls) == [[0], [1]]
        assert not h.probe().has_work


async def test_111_failed_background_write_is_reported_once_and_pauses_until_next_event() -> None:
    async with harness() as h:
        boom = Boom("disk full")
        h.sink.failures[0] = boom
        h.ctl.enqueue(ev(0))
        await h.advance(200)
        assert seqs(h.sink.calls) == [[0]]
        assert h.reports == [boom]
        assert h.reports[0] is boom
        assert h.probe().has_work
        assert h.probe().automatic_paused
        await h.advance(1000)
        assert len(h.sink.calls) == 1, "no automatic retry while paused"
        h.ctl.enqueue(ev(1))
        await h.advance(199)
        assert len(h.sink.calls) == 1
        await h.advance(1)
        assert seqs(h.sink.calls) == [[0], [0, 1]]
        assert seqs(h.sink.written) == [[0, 1]]
        assert len(h.reports) == 1
        assert not h.probe().has_work


async def test_112_barrier_ignores_overlapping_background_failure_and_retries() -> None:
    async with harness() as h:
        boom = Boom("transient")
        gate = h.sink.gate(0)
        h.sink.failures[0] = boom
        h.ctl.enqueue(ev(0))
        await h.advance(200)
        assert seqs(h.sink.calls) == [[0]]
        first, second = h.start_flush(), h.start_flush()
        await settle()
        assert not first.done.is_set()
        gate.set()
        await first.done.wait()
        await second.done.wait()
        assert first.error is None
        assert second.error is None
        assert seqs(h.sink.calls) == [[0], [0]]
        assert seqs(h.sink.written) == [[0]]
        assert h.reports == [boom]
        assert not h.probe().has_work
        assert not h.probe().automatic_paused


async def test_113_barrier_write_failure_is_raised_not_reported() -> None:
    async with harness() as h:
        boom = Boom("flush failed")
        h.sink.failures[0] = boom
        h.ctl.enqueue(ev(0))
        with pytest.raises(Boom) as info:
            await h.ctl.flush()
        assert info.value is boom
        assert h.reports == []
        assert h.probe().has_work
        assert h.probe().automatic_paused
        assert not h.probe().timer_armed
        await h.advance(1000)
        assert len(h.sink.calls) == 1
        h.ctl.enqueue(ev(1))
        await h.advance(199)
        assert len(h.sink.calls) == 1
        await h.advance(1)
        assert seqs(h.sink.calls) == [[0], [0, 1]]
        assert h.reports == []
        assert not h.probe().has_work


async def test_113_joined_callers_share_the_barrier_error() -> None:
    async with harness() as h:
        boom = Boom("shared")
        h.sink.gate(0)
        h.sink.failures[0] = boom
        h.ctl.enqueue(ev(0))
        first, second = h.start_flush(), h.start_flush()
        await settle()
        h.sink.gates[0].set()
        await first.done.wait()
        await second.done.wait()
        assert first.error is boom
        assert second.error is boom
        assert len(h.sink.calls) == 1
        assert h.reports == []
        assert not h.probe().flushing
        # The barrier is closed: the next flush is a new drain that retries the retained batch.
        await h.ctl.flush()
        assert seqs(h.sink.calls) == [[0], [0]]


async def test_114_huge_retained_batch_is_retried_as_one_batch() -> None:
    n = 150_000
    async with harness() as h:
        h.sink.failures[0] = Boom("too big today")
        events = [ev(i) for i in range(n)]
        for e in events:
            h.ctl.enqueue(e)
        with pytest.raises(Boom):
            await h.ctl.flush()
        assert h.ctl.pending_count == n
        await h.ctl.flush()
        assert [len(b) for b in h.sink.calls] == [n, n]
        assert h.sink.written == [events]
        assert all(a is b for a, b in zip(h.sink.written[0], events, strict=True))
        assert not h.probe().has_work


# --- further controller behaviour ----------------------------------------------------------------


async def test_failed_batch_goes_back_in_front_of_newer_events() -> None:
    async with harness() as h:
        gate = h.sink.gate(0)
        h.sink.failures[0] = Boom()
        h.ctl.enqueue(ev(0))
        h.ctl.enqueue(ev(1))
        await h.advance(200)
        h.ctl.enqueue(ev(2))  # arrives during the doomed write
        gate.set()
        await settle()
        assert h.ctl.pending_count == 3
        await h.ctl.flush()
        assert seqs(h.sink.calls) == [[0, 1], [0, 1, 2]]


# --- held until bound: the backlog (a seed storage lacks) is written by the controller, first -------------


async def test_held_controller_starts_no_write_until_release_then_writes_backlog_first() -> None:
    async with harness(held=True) as h:
        h.ctl.enqueue(ev(2))
        await h.advance(1000)  # the window expires while held: nothing starts
        assert h.sink.calls == [] and h.probe().held
        h.ctl.release([ev(0), ev(1)])
        await settle()
        assert seqs(h.sink.calls) == [[0, 1, 2]], "the backlog goes in front, written at once"
        assert not h.probe().has_work


async def test_release_without_backlog_keeps_an_unexpired_window() -> None:
    async with harness(held=True) as h:
        h.ctl.enqueue(ev(0))
        await h.advance(100)
        h.ctl.release()
        await settle()
        assert h.sink.calls == []
        await h.advance(100)
        assert seqs(h.sink.calls) == [[0]]


async def test_failed_backlog_write_is_kept_and_the_next_flush_tries_again() -> None:
    async with harness(held=True) as h:
        boom = Boom("EIO")
        h.sink.failures[0] = boom
        h.ctl.release([ev(0)])
        await settle()
        assert h.reports == [boom]
        assert h.ctl.pending_count == 1 and h.probe().automatic_paused
        h.ctl.enqueue(ev(1))
        await h.ctl.flush()
        assert seqs(h.sink.calls) == [[0], [0, 1]]
        assert seqs(h.sink.written) == [[0, 1]]


async def test_flush_of_a_held_controller_waits_for_release() -> None:
    async with harness(held=True) as h:
        h.ctl.enqueue(ev(1))
        call = h.start_flush()
        await settle()
        assert not call.done.is_set() and h.sink.calls == []
        h.ctl.release([ev(0)])
        await call.done.wait()
        assert call.error is None
        assert seqs(h.sink.written) == [[0, 1]]


async def test_release_twice_is_refused() -> None:
    async with harness(held=True) as h:
        h.ctl.release()
        with pytest.raises(RuntimeError, match="released twice"):
            h.ctl.release()


async def test_cancel_automatic_wait_disarms_without_unpausing_or_draining() -> None:
    async with harness() as h:
        h.ctl.enqueue(ev(0))
        h.ctl.cancel_automatic_wait()
        assert not h.probe().timer_armed
        await h.advance(1000)
        assert h.sink.calls == []
        assert h.probe().has_work
        await h.ctl.flush()
        assert seqs(h.sink.calls) == [[0]]

    async with harness() as h:
        h.sink.failures[0] = Boom()
        h.ctl.enqueue(ev(0))
        await h.advance(200)
        assert h.probe().automatic_paused
        h.ctl.cancel_automatic_wait()
        assert h.probe().automatic_paused


async def test_cancel_automatic_wait_forgets_an_expired_deadline() -> None:
    async with harness() as h:
        gate = h.sink.gate(0)
        h.ctl.enqueue(ev(0))
        await h.advance(200)
        h.ctl.enqueue(ev(1))
        await h.advance(200)  # e1's deadline expires during the active write
        h.ctl.cancel_automatic_wait()
        gate.set()
        await settle()
        assert seqs(h.sink.calls) == [[0]], "no follow-up once the expired deadline was forgotten"
        await h.advance(1000)
        assert seqs(h.sink.calls) == [[0]]
        await h.ctl.flush()
        assert seqs(h.sink.calls) == [[0], [1]]


async def test_cancelled_flush_caller_abandons_only_its_wait() -> None:
    async with harness() as h:
        gate = h.sink.gate(0)
        h.ctl.enqueue(ev(0))
        with anyio.CancelScope() as scope:
            h.tg.start_soon(_cancel_soon, scope)
            await h.ctl.flush()
        assert scope.cancelled_caught
        assert h.probe().flushing, "the shared drain keeps running"
        other = h.start_flush()
        await settle()
        assert not other.done.is_set()
        gate.set()
        await other.done.wait()
        assert other.error is None
        assert seqs(h.sink.written) == [[0]]
        assert not h.probe().has_work


async def _cancel_soon(scope: anyio.CancelScope) -> None:
    await anyio.wait_all_tasks_blocked()
    scope.cancel()


async def test_drain_cancelled_by_owner_releases_waiters_and_keeps_events() -> None:
    """The owner's task group shutting down mid-drain: waiters are not stranded, no event is lost."""
    with anyio.fail_after(20):
        clock = ManualScheduler()
        sink = Sink()
        gate = sink.gate(0)
        reports = sink.reports
        try:
            async with anyio.create_task_group() as outer:
                owner_scope = anyio.CancelScope()

                async def owner(*, task_status: TaskStatus[TaskGroup]) -> None:
                    with owner_scope:
                        async with anyio.create_task_group() as tg:
                            task_status.started(tg)
                            await anyio.sleep_forever()

                owner_tg = await outer.start(owner)
                ctl: WriteBehindController[Event] = WriteBehindController(
                    sink=sink,
                    scheduler=clock,
                    spawn=owner_tg.start_soon,
                )
                ctl.enqueue(ev(0))
                outer.start_soon(_cancel_soon, owner_scope)
                with pytest.raises(WriteBehindAbandonedError):
                    await ctl.flush()
                assert not ctl.flushing
                assert ctl.pending_count == 1
                assert ctl.automatic_paused
                assert reports == []
                ctl.enqueue(ev(1))
                assert ctl.timer_armed, "the next event arms a fresh window"
        finally:
            gate.set()


def test_max_delay_validation() -> None:
    def make(value: object) -> None:
        WriteBehindController[Event](
            sink=Sink(),
            scheduler=ManualScheduler(),
            spawn=lambda fn: None,
            max_delay_ms=value,  # type: ignore[arg-type]
        )

    for bad in (0, -1, 2_147_483_648, 1.5, True, "200", None):
        with pytest.raises(TypeError, match="between 1 and 2147483647"):
            make(bad)
    make(1)
    make(2_147_483_647)


async def test_reporter_error_does_not_break_the_controller() -> None:
    async with harness() as h:

        def bad_reporter(exc: BaseException) -> None:
            raise RuntimeError("logger broke")

        h.ctl._report = bad_reporter
        h.sink.failures[0] = Boom()
        h.ctl.enqueue(ev(0))
        await h.advance(200)
        assert h.probe().automatic_paused
        await h.ctl.flush()
        assert seqs(h.sink.written) == [[0]]


# --- schedulers ----------------------------------------------------------------------------------


def test_manual_scheduler_fires_in_deadline_then_arming_order() -> None:
    clock = ManualScheduler()
    fired: list[tuple[str, float]] = []

    def cb(name: str) -> Callable[[], None]:
        return lambda: fired.append((name, clock.now_ms()))

    clock.call_later(30, cb("c"))
    clock.call_later(10, cb("a1"))
    clock.call_later(10, cb("a2"))
    dropped = clock.call_later(20, cb("dropped"))
    dropped.cancel()

    def rearm() -> None:
        fired.append(("b", clock.now_ms()))
        clock.call_later(5, cb("b+5"))

    clock.call_later(20, rearm)
    clock.advance(9)
    assert fired == []
    clock.advance(40)
    assert fired == [("a1", 10), ("a2", 10), ("b", 20), ("b+5", 25), ("c", 30)]
    assert clock.now_ms() == 49
    assert clock.armed == []
    assert clock.next_deadline() is None
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)


async def test_production_scheduler_background_write_without_flush() -> None:
    sink = Sink()
    reports = sink.reports
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            ctl: WriteBehindController[Event] = WriteBehindController(
                sink=sink,
                scheduler=TaskGroupScheduler(tg.start_soon),
                spawn=tg.start_soon,
                max_delay_ms=20,
            )
            ctl.enqueue(ev(0))
            ctl.enqueue(ev(1))
            await sink.wrote.wait()
    # The task group exits only once the background write task has settled.
    assert not ctl.has_work
    assert seqs(sink.written) == [[0, 1]]
    assert reports == []


async def test_production_scheduler_cancelled_timer_never_fires() -> None:
    fired: list[str] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            scheduler = TaskGroupScheduler(tg.start_soon)
            start = scheduler.now_ms()
            handle = scheduler.call_later(1, lambda: fired.append("cancelled"))
            handle.cancel()
            scheduler.call_later(30, lambda: fired.append("kept"))
            # The task group exits only when the kept timer has fired and the cancelled one is gone.
        assert scheduler.now_ms() >= start
    assert fired == ["kept"]


# --- property: order, no loss, no duplicate among successful writes ------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.integers(1, 5)),
        st.tuples(st.just("advance"), st.integers(0, 450)),
        st.tuples(st.just("flush"), st.just(0)),
        st.tuples(st.just("flush_bg"), st.just(0)),
        st.tuples(st.just("fail"), st.integers(1, 2)),
        st.tuples(st.just("block"), st.just(0)),
        st.tuples(st.just("release"), st.just(0)),
        st.tuples(st.just("cancel_wait"), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, max_delay=st.sampled_from([1, 50, 200]))
async def test_property_every_event_written_once_in_order(ops: list[tuple[str, int]], max_delay: int) -> None:
    async with harness(max_delay_ms=max_delay) as h:
        enqueued: list[int] = []
        fail_budget = 0
        block_next = False
        original_write = h.sink.write_batch

        async def write(batch: list[Event]) -> None:
            nonlocal fail_budget, block_next
            attempt = len(h.sink.calls)
            if block_next:
                block_next = False
                h.sink.gate(attempt)
            if fail_budget:
                fail_budget -= 1
                h.sink.failures[attempt] = Boom(f"attempt {attempt}")
            await original_write(batch)

        h.sink.write_batch = write  # type: ignore[method-assign]
        flushes: list[FlushCall] = []
        for op, arg in ops:
            if op == "enqueue":
                for _ in range(arg):
                    h.ctl.enqueue(ev(len(enqueued)))
                    enqueued.append(len(enqueued))
            elif op == "advance":
                await h.advance(arg)
            elif op == "flush":
                call = h.start_flush()
                flushes.append(call)
                # Awaited inline unless a gate holds it; then it just runs on in the background.
                await settle()
            elif op == "flush_bg":
                flushes.append(h.start_flush())
            elif op == "fail":
                fail_budget = arg
            elif op == "block":
                block_next = True
            elif op == "release":
                h.sink.release_all()
                await settle()
            elif op == "cancel_wait":
                h.ctl.cancel_automatic_wait()
            # Invariant: pending events always have a way out (window, active write, barrier, or an
            # explicit pause/cancel that a later event or flush resolves).
        fail_budget = 0
        block_next = False
        h.sink.release_all()
        await settle()
        for call in flushes:
            await call.done.wait()
            assert call.error is None or isinstance(call.error, Boom)
        await h.ctl.flush()
        assert not h.probe().has_work
        assert not h.probe().flushing
        written = [e["seq"] for batch in h.sink.written for e in batch]
        assert written == enqueued
        # Every failed attempt is either reported (background) or raised to a flush (barrier).
        failed_attempts = len(h.sink.calls) - len(h.sink.written)
        barrier_errors = {id(c.error) for c in flushes if c.error is not None}
        assert len(h.reports) + len(barrier_errors) == failed_attempts
