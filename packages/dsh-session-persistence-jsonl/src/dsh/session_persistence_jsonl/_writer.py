"""The backend's long-lived writer: a few threads fed by queues, one hand-off per wake, completions through the
waiting event loop's own thread-safe call.

Written against anyio and the standard library only, so it could move to the core's backend face once a second
backend needs it; until then it lives with the one backend that uses it.

Handing each blocking primitive to a fresh worker-thread call costs two threads sleeping and waking per step,
for every session apart. Here a backend keeps a small set of *lanes* (a thread and its queue). A job goes to the
lane its key picks (the same key always picks the same lane, so one session's jobs run one at a time, in the
order they were submitted); a lane's thread takes every job queued for it at each wake and runs them in order,
so many sessions' batches cost one wake, and the lanes' syncs overlap (group commit). Each completion is
reported back through the waiting loop's thread-safe call (asyncio's ``call_soon_threadsafe``, trio's
``TrioToken.run_sync_soon``), coalesced: completions that find the loop has not yet picked up the previous ones
join them, one loop wake for all of them.

A job once queued runs to its end, and the caller's wait is shielded: a cancelled caller sees its cancellation
once the job has finished, never in the middle of a durable step (so whatever the job did is known).

Threads start on first use and are daemons, so a backend that is never closed does not hold the process open;
a lane's thread ends after ``idle_seconds`` without work, and :meth:`BlockingWriter.aclose` ends them all once
their queued jobs are done (a later job starts a lane again). After ``fork`` the child starts with no thread and
no queued job of the parent's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

__all__ = ["BlockingWriter"]

T = TypeVar("T")


class _Job:
    __slots__ = ("args", "callback", "done", "error", "func", "mailbox", "result")

    def __init__(
        self,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        mailbox: _Mailbox | None,
        callback: Callable[[Any, BaseException | None], None] | None = None,
    ) -> None:
        self.func = func
        self.args = args
        self.mailbox = mailbox
        self.callback = callback
        self.done = anyio.Event() if callback is None else None
        self.result: Any = None
        self.error: BaseException | None = None

    def finish(self) -> None:
        """On the writer thread, once the job has run: report to its waiter or call its callback."""
        callback = self.callback
        if callback is None:
            assert self.mailbox is not None
            self.mailbox.deliver(self)
            return
        error, self.error = self.error, None
        try:
            callback(self.result, error)
        except BaseException:  # a callback must never end the lane's thread
            logging.getLogger("dsh.session_persistence_jsonl").exception("writer completion callback raised")


class _Mailbox:
    """Finished jobs waiting for one event loop to pick them up: one thread-safe call per batch of them."""

    __slots__ = ("_lock", "_post", "_ready")

    def __init__(self, post: Callable[[Callable[[], None]], object]) -> None:
        self._post = post
        self._lock = threading.Lock()
        self._ready: list[_Job] = []

    def deliver(self, job: _Job) -> None:
        """From a writer thread: hand ``job`` back to its loop (a call is scheduled only if none is pending)."""
        with self._lock:
            self._ready.append(job)
            if len(self._ready) > 1:
                return  # the call scheduled for the first one picks this one up too
        try:
            self._post(self._wake)
        except RuntimeError:
            # The loop is closed (trio's RunFinishedError is a RuntimeError): nobody is left to wait.
            with self._lock:
                self._ready.clear()

    def _wake(self) -> None:
        """On the loop's thread: wake every waiter whose job finished."""
        with self._lock:
            ready, self._ready = self._ready, []
        for job in ready:
            assert job.done is not None
            job.done.set()


# Event loop (asyncio) or trio token -> its mailbox; weak, so a finished loop takes its mailbox with it.
_mailboxes: weakref.WeakKeyDictionary[object, _Mailbox] = weakref.WeakKeyDictionary()
_mailboxes_lock = threading.Lock()


def _current_mailbox() -> _Mailbox:
    """The mailbox of the event loop running in this thread (made on first use)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return _trio_mailbox()
    box = _mailboxes.get(loop)
    return box if box is not None else _new_mailbox(loop, loop.call_soon_threadsafe)


def _trio_mailbox() -> _Mailbox:
    import trio  # not asyncio: the only other loop anyio runs on

    token = trio.lowlevel.current_trio_token()
    box = _mailboxes.get(token)
    return box if box is not None else _new_mailbox(token, token.run_sync_soon)


def _new_mailbox(loop: object, post: Callable[[Callable[[], None]], object]) -> _Mailbox:
    with _mailboxes_lock:
        box = _mailboxes.get(loop)
        if box is None:
            box = _mailboxes[loop] = _Mailbox(post)
    return box


class _Lane:
    """One writer thread and its queue."""

    __slots__ = ("cond", "idle_seconds", "jobs", "name", "stopping", "thread")

    def __init__(self, name: str, idle_seconds: float) -> None:
        self.name = name
        self.idle_seconds = idle_seconds
        self.cond = threading.Condition(threading.Lock())
        self.jobs: list[_Job] = []
        self.thread: threading.Thread | None = None
        self.stopping = False

    def submit(self, job: _Job) -> None:
        with self.cond:
            self.jobs.append(job)
            if self.thread is None:
                self.thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self.thread.start()
            else:
                self.cond.notify()

    def _serve(self) -> None:
        cond = self.cond
        while True:
            with cond:
                while not self.jobs:
                    # The decision to end is taken under the lock a submit takes: a job is never stranded.
                    if self.stopping or (not cond.wait(self.idle_seconds) and not self.jobs):
                        self.thread = None
                        return
                jobs, self.jobs = self.jobs, []
            for job in jobs:
                try:
                    job.result = job.func(*job.args)
                except BaseException as exc:  # handed to the waiting caller, raised there
                    job.error = exc
                job.finish()

    def stop(self) -> threading.Thread | None:
        """Ask the thread to end once its queue is empty; the thread to join (``None`` if there is none)."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
            return self.thread

    def restart_allowed(self) -> None:
        with self.cond:
            self.stopping = False

    def reset_after_fork(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.jobs = []
        self.thread = None
        self.stopping = False


_writers: weakref.WeakSet[BlockingWriter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The parent's threads do not exist in the child, and its queued jobs belong to the parent's loops.
    global _mailboxes_lock
    _mailboxes_lock = threading.Lock()
    _mailboxes.clear()
    for writer in list(_writers):
        for lane in writer._lanes:
            lane.reset_after_fork()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


class BlockingWriter:
    """A backend's blocking steps, run off the event loop by a few long-lived threads (one hand-off per wake).

    :param lanes: threads, each with its own queue; jobs with equal keys share a lane and run in submission
        order, jobs of different lanes run at the same time (their syncs overlap).
    :param name: the threads' name (shown by debuggers and ``threading.enumerate``).
    :param idle_seconds: a lane's thread ends after this long without a job (the next job starts it again).

    Works from any number of asyncio and trio event loops at once (each job reports back to the loop that
    submitted it). Close it with :meth:`aclose` (a backend does so in its own ``aclose``).
    """

    def __init__(self, lanes: int = 2, *, name: str = "dsh-session-writer", idle_seconds: float = 10.0) -> None:
        if type(lanes) is not int or lanes < 1:
            raise ValueError(f"lanes must be a positive integer, got {lanes!r}")
        if not idle_seconds > 0:
            raise ValueError(f"idle_seconds must be positive, got {idle_seconds!r}")
        self._lanes = tuple(_Lane(f"{name}-{index}", idle_seconds) for index in range(lanes))
        _writers.add(self)

    @property
    def lanes(self) -> int:
        """How many lanes (threads at most) this writer has."""
        return len(self._lanes)

    async def run(self, key: Hashable, func: Callable[..., T], *args: Any) -> T:
        """Run ``func(*args)`` on the lane of ``key`` after every job queued there before it; its result or its
        exception. The wait is shielded: the job always runs to its end before the caller sees a cancellation.
        """
        lanes = self._lanes
        job = _Job(func, args, _current_mailbox())
        lanes[hash(key) % len(lanes) if len(lanes) > 1 else 0].submit(job)
        done = job.done
        assert done is not None
        try:
            await done.wait()
        except anyio.get_cancelled_exc_class():
            # Shielded only once cancelled (a cancel scope per step costs more than the wait itself).
            with anyio.CancelScope(shield=True):
                await done.wait()
            raise
        error = job.error
        if error is not None:
            job.error = None  # no cycle through the traceback
            raise error
        result: T = job.result
        return result

    def submit(
        self,
        key: Hashable,
        func: Callable[..., T],
        args: tuple[Any, ...],
        callback: Callable[[Any, BaseException | None], None],
    ) -> None:
        """Queue ``func(*args)`` on the lane of ``key`` (after every job queued there) and return at once; once it has
        run, ``callback(result, error)`` is called on the writer thread. The job runs to its end whatever happens
        to the submitter; the callback must be quick and must not block (it typically posts to a loop)."""
        lanes = self._lanes
        lanes[hash(key) % len(lanes) if len(lanes) > 1 else 0].submit(_Job(func, args, None, callback))

    async def aclose(self) -> None:
        """End every lane's thread once its queued jobs are done, and wait for them (idempotent; a later
        :meth:`run` starts a lane again)."""
        threads = [thread for thread in (lane.stop() for lane in self._lanes) if thread is not None]
        try:
            if threads:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(_join_all, threads)
        finally:
            for lane in self._lanes:
                lane.restart_allowed()


def _join_all(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join()
