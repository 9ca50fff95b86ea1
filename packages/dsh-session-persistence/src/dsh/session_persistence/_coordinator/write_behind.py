"""Per-session write-behind controller (spec coordinator §3).

A synchronous state machine: :meth:`WriteBehindController.enqueue` is called from the synchronous
``session_event`` hook and never blocks. Events wait in ``pending`` for a fixed window (armed by the
first pending event, never extended), then go to the durable sink as one batch. At most one write is
in flight; events that arrive meanwhile form a follow-up batch. :meth:`WriteBehindController.flush`
is a shared quiescence barrier. A failed background write keeps its events (in order, in front of
newer ones), is reported once, and pauses automatic retry until a new event or an explicit flush.
A controller may start *held* (its session is not bound to storage yet): no write starts until
:meth:`WriteBehindController.release`, which may hand it a backlog of events the sink must write first.

Driven by completions: a write is started (through the sink's ``submit_batch`` where it has one, else as a task in
the owner's task group) and its end arrives as a call of :meth:`WriteBehindController._written`, which starts the
next write or completes the barrier. A flush caller parks on the barrier's one :class:`~.waits.Signal`; no task,
cancel scope or event is made per barrier or per batch on the submit path, and a cancelled flush caller abandons
only its own wait (the writes go on).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Generic, Protocol, TypeVar

import anyio
from anyio.lowlevel import checkpoint_if_cancelled

from .scheduling import Scheduler, Spawn, TimerHandle
from .waits import Signal, current_library

__all__ = [
    "DEFAULT_MAX_DELAY_MS",
    "MAX_DELAY_MS_LIMIT",
    "WriteBehindAbandonedError",
    "WriteBehindController",
]

_logger = logging.getLogger("dsh.session_persistence")

E = TypeVar("E")

#: Default write-behind window in milliseconds.
DEFAULT_MAX_DELAY_MS = 200
#: Largest accepted window (the JavaScript timer limit the original API inherited).
MAX_DELAY_MS_LIMIT = 2_147_483_647


class WriteBehindAbandonedError(RuntimeError):
    """A flush barrier's drain task was cancelled (its task group is shutting down) before it finished.

    Raised to flush callers that were still waiting on that barrier: their own wait was not
    cancelled, but quiescence was not reached. The events that were not confirmed durable stay
    pending.
    """


def _identity(event: E) -> E:
    return event


class _Write(Generic[E]):
    """One in-flight write: the batch it took, and whether a barrier or the window started it.

    It is also the sink's ``done`` callback (calling it completes the write on its controller): one tracked object
    per write rather than a partial over a bound method. The controller's ``_active`` and ``owner`` form a cycle
    only while the write is in flight; completing it breaks the cycle.
    """

    __slots__ = ("background", "batch", "owner")

    def __init__(self, owner: WriteBehindController[E], batch: list[E], background: bool) -> None:
        self.owner = owner
        self.batch = batch
        self.background = background

    def __call__(self, error: BaseException | None) -> None:
        self.owner._written(self, error)


class BatchSink(Protocol[E]):
    """Where a controller's batches go: the durable write, and who hears of a failed background write.

    A sink may also have ``submit_batch(batch, done) -> bool``: start the write without an await and call
    ``done(error)`` once, later, on the loop's thread (never inside ``submit_batch``); ``False`` means nothing was
    started and the controller runs ``write_batch`` in a task instead. With it, a commit costs the controller no task.
    """

    async def write_batch(self, batch: list[E]) -> None: ...

    def background_failed(self, error: BaseException) -> None: ...


Submit = Callable[[list[E], Callable[[BaseException | None], None]], bool]


class WriteBehindController(Generic[E]):
    """Batches one live session's events into durable writes (spec coordinator §3.2).

    :param sink: where batches go (a :class:`BatchSink`): ``write_batch`` is awaited with the whole batch (a
        fresh list, ordered by enqueue); ``background_failed`` is called exactly once per failed *background*
        write (never for a barrier write, whose error goes to the flush callers instead).
    :param scheduler: clock and timers (:class:`~._scheduling.TaskGroupScheduler` in production,
        :class:`~._scheduling.ManualScheduler` in tests).
    :param spawn: starts a background task in a task group the caller owns (``tg.start_soon``): used only for a
        write the sink cannot submit.
    :param max_delay_ms: the fixed window, an integer in ``1..2147483647`` (default 200).
    :param copy: snapshot taken of each event at enqueue time; identity by default because the
        session's events are immutable structs.
    :param held: start held: events are admitted (and windows armed) but no write starts, and a flush
        waits, until :meth:`release`.
    :param signal: makes the barrier's one-shot signal (the coordinator's completion port's ``signal``; by
        default, one for the library running the first barrier).
    """

    def __init__(
        self,
        *,
        sink: BatchSink[E],
        scheduler: Scheduler,
        spawn: Spawn,
        max_delay_ms: int = DEFAULT_MAX_DELAY_MS,
        copy: Callable[[E], E] = _identity,
        held: bool = False,
        signal: Callable[[], Signal] | None = None,
    ) -> None:
        if type(max_delay_ms) is not int or not 1 <= max_delay_ms <= MAX_DELAY_MS_LIMIT:
            raise TypeError(f"max_delay_ms must be an integer between 1 and {MAX_DELAY_MS_LIMIT}")
        self._sink = sink
        self._submit: Submit[E] | None = getattr(sink, "submit_batch", None)
        self._scheduler = scheduler
        self._spawn = spawn
        self._max_delay_ms = max_delay_ms
        self._copy = copy
        # Per event the default copy is no call at all (the session's events are immutable structs).
        self._copies = copy is not _identity
        self._signal = signal

        self._pending: list[E] = []
        self._timer: TimerHandle | None = None
        self._active: _Write[E] | None = None
        self._barrier: Signal | None = None
        self._deadline_expired = False
        self._automatic_paused = False
        self._held = held
        self._released: anyio.Event | None = None  # created by the first flush that has to wait for release

    # -- introspection ---------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        """True while events are pending or a write is in flight."""
        return bool(self._pending) or self._active is not None

    @property
    def max_delay_ms(self) -> int:
        """The configured window in milliseconds."""
        return self._max_delay_ms

    @property
    def pending_count(self) -> int:
        """Number of events not yet handed to a write (including a failed batch put back)."""
        return len(self._pending)

    @property
    def timer_armed(self) -> bool:
        """True while an automatic-write window is armed."""
        return self._timer is not None

    @property
    def automatic_paused(self) -> bool:
        """True after a failed write until a new event or an explicit flush."""
        return self._automatic_paused

    @property
    def held(self) -> bool:
        """True until :meth:`release` (no write has started yet)."""
        return self._held

    @property
    def flushing(self) -> bool:
        """True while a flush barrier is draining."""
        return self._barrier is not None

    # -- producer side ---------------------------------------------------------------------------

    def enqueue(self, event: E) -> None:
        """Admit one event. Synchronous and non-blocking; never raises a write error."""
        pending = self._pending
        pending.append(self._copy(event) if self._copies else event)
        if self._barrier is not None:
            # The running barrier drains everything admitted before it observes emptiness.
            return
        if self._automatic_paused:
            self._automatic_paused = False
            self._deadline_expired = False
            self._cancel_timer()
            self._arm()
        elif len(pending) == 1:
            # Fixed window: only the first pending event arms it; later ones join it without reset.
            self._arm()

    def release(self, backlog: Sequence[E] = ()) -> None:
        """End the hold: writes may start. Called once, synchronously.

        ``backlog`` are events that belong in front of everything admitted so far but were never handed to a
        write (a seed its storage lacks): they become ordinary pending events, so a failed write of them is
        kept and retried like any other, and a write of them starts now rather than after a window. Without a
        backlog, a window that expired while held starts its write now.
        """
        if not self._held:
            raise RuntimeError("write-behind controller released twice")
        self._held = False
        if backlog:
            self._pending = [*map(self._copy, backlog), *self._pending]
        waiter = self._released
        if waiter is not None:
            waiter.set()
        if self._pending and self._active is None and self._barrier is None and (backlog or self._deadline_expired):
            self._start(background=True)

    def cancel_automatic_wait(self) -> None:
        """Disarm the window and forget an expired deadline (does not unpause, does not drain)."""
        self._cancel_timer()
        self._deadline_expired = False

    async def flush(self) -> None:
        """Quiescence barrier: return once nothing is pending and no write is active.

        Concurrent callers join one barrier and share its outcome. Events enqueued meanwhile are written by it
        too. A failing barrier write is raised to every joined caller (and not reported); its batch stays
        pending and automatic retry stays paused. Cancelling a caller abandons only that caller's wait: the
        writes are not the caller's. A held controller first waits for :meth:`release` (its backlog goes first).
        """
        if self._held:
            if self._released is None:
                self._released = anyio.Event()
            await self._released.wait()
        barrier = self._barrier
        if barrier is None:
            self._cancel_timer()
            self._deadline_expired = False
            self._automatic_paused = False
            if self._active is None and not self._pending:
                # Nothing to drain: complete without opening a barrier, so an event enqueued right
                # after starts its own automatic window instead of waiting behind a finished barrier.
                # No suspension on this path, but a cancelled caller still stops here.
                await checkpoint_if_cancelled()
                return
            barrier = self._barrier = self._new_signal()
            if self._active is None:
                # Otherwise the in-flight write's completion continues the drain.
                self._start(background=False)
        await barrier.wait()

    # -- internals -------------------------------------------------------------------------------

    def _new_signal(self) -> Signal:
        make = self._signal
        if make is None:
            library = current_library()
            make = self._signal = lambda: Signal(library)
        return make()

    def _arm(self) -> None:
        self._timer = self._scheduler.call_later(self._max_delay_ms, self._deadline_fired)

    def _cancel_timer(self) -> None:
        timer = self._timer
        if timer is not None:
            self._timer = None
            timer.cancel()

    def _deadline_fired(self) -> None:
        self._timer = None
        if self._barrier is not None or not self._pending:
            # Defensive: a barrier cancels the window when it starts and never re-arms it.
            return
        if self._held or self._active is not None:
            # Held: the write starts at release, after the backlog is in front. Active: the follow-up
            # starts the moment the active write succeeds.
            self._deadline_expired = True
        else:
            self._start(background=True)

    def _start(self, *, background: bool) -> None:
        """Take every pending event into one write and start it (through the sink's submit, else a task)."""
        batch = self._pending
        self._pending = []
        self._cancel_timer()
        self._deadline_expired = False
        write = _Write(self, batch, background)
        self._active = write
        submit = self._submit
        if submit is not None and submit(batch, write):
            return
        try:
            self._spawn(partial(self._run_in_task, write))
        except BaseException as exc:
            # Could not even start (the owner's task group is closed): keep the events, and pause
            # so that the next event arms a fresh window rather than joining a window that is gone.
            self._active = None
            self._fail(write)
            barrier = self._barrier
            if barrier is not None:
                self._barrier = None
                barrier.set(WriteBehindAbandonedError(f"write-behind flush could not start its write: {exc!r}"))
            raise

    async def _run_in_task(self, write: _Write[E]) -> None:
        try:
            await self._sink.write_batch(write.batch)
        except Exception as exc:
            self._written(write, exc)
        except BaseException:
            # Cancellation (owner shutting down) or an interpreter-level exit: the batch is not known
            # to be durable, so keep it; pause so a later event arms a fresh window. Never reported,
            # never converted into an error; joined flush callers are released, not stranded.
            self._abandoned(write)
            raise
        else:
            self._written(write, None)

    def _written(self, write: _Write[E], error: BaseException | None) -> None:
        """A write ended (on the loop's thread): account for it and start what comes next."""
        if self._active is not write:
            return  # defensive: a write is completed once
        self._active = None
        barrier = self._barrier
        if error is not None:
            self._fail(write)
            if write.background:
                # A background failure is reported once; a barrier that joined meanwhile retries the batch.
                self._report_failure(error)
                if barrier is None:
                    return
                self._automatic_paused = False
            else:
                assert barrier is not None
                self._barrier = None
                barrier.set(error)
                return
        if barrier is not None:
            if self._pending:
                self._start(background=False)
            else:
                # Close in the same step that observes emptiness: nothing can slip in between.
                self._barrier = None
                barrier.set()
        elif self._pending and self._deadline_expired:
            self._start(background=True)
        # Otherwise a non-empty pending list already has its own (unexpired) window armed.

    def _abandoned(self, write: _Write[E]) -> None:
        if self._active is write:
            self._active = None
        self._restore(write)
        if self._pending:
            self._cancel_timer()
            self._deadline_expired = False
            self._automatic_paused = True
        barrier = self._barrier
        if barrier is not None:
            self._barrier = None
            barrier.set(WriteBehindAbandonedError("write-behind flush was abandoned: its write was cancelled"))

    def _restore(self, write: _Write[E]) -> None:
        """Put a batch that did not become durable back in front of newer events, order preserved."""
        if self._pending:
            self._pending = [*write.batch, *self._pending]
        else:
            self._pending = write.batch

    def _fail(self, write: _Write[E]) -> None:
        self._restore(write)
        self._cancel_timer()
        self._deadline_expired = False
        self._automatic_paused = True

    def _report_failure(self, exc: BaseException) -> None:
        try:
            self._sink.background_failed(exc)
        except Exception:
            # The reporter is a logging hook; if it breaks, do not take the owner's task group down.
            _logger.exception("write-behind failure reporter raised while reporting %r", exc)
