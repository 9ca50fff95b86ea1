"""Timers for the write-behind controller: a tiny scheduler protocol and two implementations.

The controller is a synchronous state machine; the only things it needs from the outside world
are "call me back in N milliseconds" and "run this coroutine function as a background task".
Keeping timers behind :class:`Scheduler` lets tests drive time by hand on both asyncio and trio
(trio has ``MockClock``, asyncio has no equivalent, so we do not depend on either).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeAlias

import anyio

from .waits import current_library

__all__ = [
    "ManualScheduler",
    "ManualTimer",
    "Scheduler",
    "Spawn",
    "TaskGroupScheduler",
    "TimerHandle",
]

_logger = logging.getLogger("dsh.session_persistence")

#: Starts ``func()`` as a background task in a task group owned by the caller. The bound method
#: ``TaskGroup.start_soon`` fits. Spawned work must survive the cancellation of whoever caused it
#: to be spawned (a flush caller that gives up, a producer), so it never runs in the caller's task.
Spawn: TypeAlias = Callable[[Callable[[], Coroutine[Any, Any, None]]], object]


class TimerHandle(Protocol):
    """An armed timer; :meth:`cancel` guarantees the callback will not run afterwards."""

    def cancel(self) -> None:
        """Disarm the timer (idempotent; a no-op once the callback has run)."""
        ...


class Scheduler(Protocol):
    """Millisecond clock plus one-shot timers, as seen by the write-behind controller."""

    def now_ms(self) -> float:
        """Current time in milliseconds on this scheduler's clock (monotonic, arbitrary origin)."""
        ...

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle:
        """Run the synchronous ``callback`` once, ``delay_ms`` milliseconds from now, unless cancelled."""
        ...


class _WheelTimer:
    """Handle for one deadline kept in a :class:`TaskGroupScheduler`'s heap."""

    __slots__ = ("_callback", "_owner", "due")

    def __init__(self, owner: TaskGroupScheduler, due: float, callback: Callable[[], None]) -> None:
        self._owner = owner
        self.due = due
        self._callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        # Lazy deletion: the entry stays in the heap and is dropped when it reaches the top, so a cancel
        # costs no wake-up of the timer task. A fired or cancelled handle has no callback left.
        if self._callback is not None:
            self._callback = None
            self._owner._live -= 1

    def _take(self) -> Callable[[], None] | None:
        callback, self._callback = self._callback, None
        return callback


class TaskGroupScheduler:
    """Production scheduler: one long-lived task, spawned into the caller's task group, runs every timer.

    ``spawn`` is typically ``task_group.start_soon``. Arming and cancelling a timer are heap operations on the
    event loop thread; neither spawns a task (a write-behind window is armed and cancelled once per durable
    batch, so a task per timer cost two task switches per commit). The timer task sleeps until the earliest
    live deadline; with no live timer left it lingers until the latest deadline ever armed, then ends, so an
    owner's task group is not held open by idle timers for longer than their own delays. Must be used from
    inside the event loop that runs the task group.
    """

    def __init__(self, spawn: Spawn) -> None:
        self._spawn = spawn
        self._order = itertools.count()
        self._heap: list[tuple[float, int, _WheelTimer]] = []
        self._live = 0
        self._latest = 0.0
        self._running = False
        self._target: float | None = None
        self._wake: anyio.CancelScope | None = None
        self._clock: Callable[[], float] | None = None

    def now_ms(self) -> float:
        """Event-loop clock in milliseconds (``anyio.current_time()``: the running loop's own clock, looked up once,
        since a window is armed per durable batch)."""
        clock = self._clock
        if clock is None:
            clock = self._clock = _loop_clock()
        return clock() * 1000.0

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle:
        """Arm ``callback`` to run once ``delay_ms`` from now on the timer task, unless cancelled first."""
        due = self.now_ms() + delay_ms
        timer = _WheelTimer(self, due, callback)
        heapq.heappush(self._heap, (due, next(self._order), timer))
        self._live += 1
        if due > self._latest:
            self._latest = due
        if len(self._heap) > 64 and len(self._heap) > 4 * self._live:
            # Many cancelled entries buried under a live one: compact, so memory follows the live timers.
            self._heap = [entry for entry in self._heap if entry[2]._callback is not None]
            heapq.heapify(self._heap)
        if not self._running:
            self._running = True
            try:
                self._spawn(self._run)
            except BaseException:
                self._running = False
                raise
        elif self._target is not None and due < self._target and self._wake is not None:
            self._wake.cancel()  # sleeping towards a later deadline: wake up and re-plan
        return timer

    async def _run(self) -> None:
        try:
            while True:
                heap = self._heap
                now = self.now_ms()
                while heap and (heap[0][2]._callback is None or heap[0][0] <= now):
                    callback = heapq.heappop(heap)[2]._take()
                    if callback is not None:
                        self._live -= 1
                        try:
                            callback()
                        except Exception:
                            # One broken callback must not stop every other timer of the owner.
                            _logger.exception("write-behind timer callback raised")
                        now = self.now_ms()
                if heap:
                    target = heap[0][0]
                elif now < self._latest:
                    target = self._latest  # linger: a new window is likely to be armed soon
                else:
                    return
                self._target = target
                with anyio.CancelScope() as scope:
                    self._wake = scope
                    await anyio.sleep(max(target - now, 0.0) / 1000)
                self._wake = None
        finally:
            self._running = False
            self._target = None
            self._wake = None


def _loop_clock() -> Callable[[], float]:
    """The running event loop's clock in seconds: what ``anyio.current_time()`` reads, without its per-call lookup."""
    if current_library() == "trio":
        import trio

        return trio.current_time
    return asyncio.get_running_loop().time


class ManualTimer:
    """Handle returned by :meth:`ManualScheduler.call_later`."""

    __slots__ = ("_callback", "cancelled", "due_ms", "fired")

    def __init__(self, due_ms: float, callback: Callable[[], None]) -> None:
        self.due_ms = due_ms
        self._callback: Callable[[], None] | None = callback
        self.cancelled = False
        self.fired = False

    def cancel(self) -> None:
        """Disarm the timer; it is skipped when time passes its deadline."""
        if not self.fired:
            self.cancelled = True
        self._callback = None

    def _fire(self) -> None:
        callback = self._callback
        self._callback = None
        self.fired = True
        if callback is not None:
            callback()


class ManualScheduler:
    """Deterministic scheduler for tests: time moves only when :meth:`advance` is called.

    Timers fire in deadline order (ties in arming order), each with :meth:`now_ms` set to its own
    deadline; timers armed by a callback fire in the same :meth:`advance` if they fall due within
    it. Callbacks run synchronously inside :meth:`advance`; background tasks they spawn run only
    when the test yields to the event loop (see :meth:`advance_settled`).
    """

    def __init__(self, start_ms: float = 0.0) -> None:
        self._now = float(start_ms)
        self._order = itertools.count()
        self._heap: list[tuple[float, int, ManualTimer]] = []

    def now_ms(self) -> float:
        """The manual clock's current time in milliseconds."""
        return self._now

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> ManualTimer:
        """Arm a timer due at ``now_ms() + delay_ms``."""
        if delay_ms < 0:
            raise ValueError("delay_ms must not be negative")
        timer = ManualTimer(self._now + delay_ms, callback)
        heapq.heappush(self._heap, (timer.due_ms, next(self._order), timer))
        return timer

    @property
    def armed(self) -> list[ManualTimer]:
        """Timers that are neither cancelled nor fired, in firing order."""
        return [t for _, _, t in sorted(self._heap) if not t.cancelled and not t.fired]

    def next_deadline(self) -> float | None:
        """Deadline of the next armed timer, or ``None``."""
        self._drop_dead()
        return self._heap[0][0] if self._heap else None

    def advance(self, ms: float) -> None:
        """Move time forward by ``ms``, firing every timer that falls due on the way."""
        if ms < 0:
            raise ValueError("cannot move time backwards")
        target = self._now + ms
        while (timer := self._pop_due(target)) is not None:
            self._now = timer.due_ms
            timer._fire()
        self._now = target

    async def advance_settled(self, ms: float) -> None:
        """Like :meth:`advance`, but let the event loop settle after each fired timer and at the end.

        "Settled" means every task is blocked (``anyio.wait_all_tasks_blocked``), so a background
        write started by a timer has reached the sink (or its gate) before time moves on.
        """
        if ms < 0:
            raise ValueError("cannot move time backwards")
        target = self._now + ms
        while (timer := self._pop_due(target)) is not None:
            self._now = timer.due_ms
            timer._fire()
            await anyio.wait_all_tasks_blocked()
        self._now = target
        await anyio.wait_all_tasks_blocked()

    def _drop_dead(self) -> None:
        while self._heap and (self._heap[0][2].cancelled or self._heap[0][2].fired):
            heapq.heappop(self._heap)

    def _pop_due(self, target: float) -> ManualTimer | None:
        self._drop_dead()
        if self._heap and self._heap[0][0] <= target:
            return heapq.heappop(self._heap)[2]
        return None
