"""Timers for the write-behind controller: a tiny scheduler protocol and two implementations.

The controller is a synchronous state machine; the only things it needs from the outside world
are "call me back in N milliseconds" and "run this coroutine function as a background task".
Keeping timers behind :class:`Scheduler` lets tests drive time by hand on both asyncio and trio
(trio has ``MockClock``, asyncio has no equivalent, so we do not depend on either).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeAlias

import anyio

__all__ = [
    "ManualScheduler",
    "ManualTimer",
    "Scheduler",
    "Spawn",
    "TaskGroupScheduler",
    "TimerHandle",
]

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


class _SleepingTimer:
    """Handle for a timer task that sleeps in the owner's task group."""

    __slots__ = ("_cancelled", "_fired", "_scope")

    def __init__(self) -> None:
        # Created before the task starts: anyio lets a scope be cancelled before it is entered,
        # so a cancel() that races the task's start still stops the sleep at once.
        self._scope = anyio.CancelScope()
        self._cancelled = False
        self._fired = False

    def cancel(self) -> None:
        if self._fired:
            return
        # The flag matters as much as the scope: a sleep that already finished may have its task
        # rescheduled without a checkpoint, where scope cancellation no longer applies.
        self._cancelled = True
        self._scope.cancel()

    async def run(self, delay_ms: int, callback: Callable[[], None]) -> None:
        with self._scope:
            await anyio.sleep(delay_ms / 1000)
        if self._cancelled:
            return
        self._fired = True
        callback()


class TaskGroupScheduler:
    """Production scheduler: each timer is a task sleeping in a task group owned by the caller.

    ``spawn`` is typically ``task_group.start_soon``. Cancelling a handle cancels the sleeping
    task, so disarmed timers do not linger until their deadline. Must be used from inside the
    event loop that runs the task group.
    """

    def __init__(self, spawn: Spawn) -> None:
        self._spawn = spawn

    def now_ms(self) -> float:
        """Event-loop clock in milliseconds (``anyio.current_time()``)."""
        return anyio.current_time() * 1000.0

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle:
        """Spawn a task that sleeps ``delay_ms`` and then calls ``callback`` unless cancelled."""
        timer = _SleepingTimer()

        async def sleep_then_call() -> None:
            await timer.run(delay_ms, callback)

        self._spawn(sleep_then_call)
        return timer


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
