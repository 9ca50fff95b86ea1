"""The backend's long-lived writer: a few threads fed by queues, one hand-off per wake, completions through the
waiting event loop's own thread-safe call.

Written against anyio and the standard library only, so it could move to the core's backend face once a second
backend needs it; until then it lives with the one backend that uses it.

Handing each blocking primitive to a fresh worker-thread call costs two threads sleeping and waking per step,
for every session apart. Here a backend keeps a small pool of long-lived threads fed by one queue of *keys* (a
session id each): a key's jobs run one at a time, in the order they were submitted, and a free thread takes the next
key that has work, so many sessions' steps cost one wake and their syncs overlap (group commit). A job that blocks
(an ``fsync`` that stalls for seconds) holds its own key and one thread: every other session's work goes on on the
other threads (0.3's fixed lanes held every session hashed to the stalled lane). Each completion is reported back
through the waiting loop's thread-safe call (asyncio's ``call_soon_threadsafe``, trio's
``TrioToken.run_sync_soon``), coalesced: completions that find the loop has not yet picked up the previous ones
join them, one loop wake for all of them; :meth:`BlockingWriter.submit` hands a callback instead, called on the
writer thread (the core's live commit reports through its own completion port).

A job once queued runs to its end, and the caller's wait is shielded: a cancelled caller sees its cancellation
once the job has finished, never in the middle of a durable step (so whatever the job did is known).

Threads start on demand (a job finds no idle thread) and are daemons, so a backend that is never closed does not
hold the process open; a thread ends after ``idle_seconds`` without work, and :meth:`BlockingWriter.aclose` ends
them all once their queued jobs are done (a later job starts one again). After ``fork`` the child starts with no
thread and no queued job of the parent's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections import deque
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
        except BaseException:  # a callback must never end a writer thread
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


class _Worker:
    """One pool thread's wake-up: a lock held while the thread sleeps, released by whoever hands it work."""

    __slots__ = ("thread", "wake")

    def __init__(self) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()
        self.thread: threading.Thread | None = None


class _Pool:
    """Worker threads (at most ``size``) sharing one queue of keys that have work; each key's jobs in order.

    A key is *ready* while its first job waits for a thread, *running* while a thread runs that job, and gone once
    its queue is empty. A worker takes the next ready key, runs its first job, then puts the key back at the end of
    the ready queue if it has more: one key never has two jobs running, and a job that blocks (an ``fsync`` that
    stalls) holds its own key and one thread, never another key's work while a thread is free.

    The hand-off is one plain lock (the state) and, per sleeping thread, its own wake lock: a submit that finds a
    thread asleep takes it off the idle stack under the state lock and releases its wake lock, so exactly that
    thread wakes, and a thread is never woken for nothing (no condition variable: no waiter lock made per wait).
    """

    __slots__ = ("idle", "idle_seconds", "keys", "lock", "name", "ready", "size", "started", "stopping", "threads")

    def __init__(self, size: int, name: str, idle_seconds: float) -> None:
        self.size = size
        self.name = name
        self.idle_seconds = idle_seconds
        self.lock = threading.Lock()
        self.keys: dict[Hashable, deque[_Job]] = {}
        self.ready: deque[Hashable] = deque()
        self.threads: set[threading.Thread] = set()
        self.idle: list[_Worker] = []  # sleeping threads, the last to sleep on top (its caches are warm)
        self.started = 0
        self.stopping = False

    def submit(self, key: Hashable, job: _Job) -> None:
        with self.lock:
            queue = self.keys.get(key)
            if queue is not None:
                queue.append(job)  # behind the key's earlier jobs; the key is ready or running already
                return
            self.keys[key] = deque((job,))
            self.ready.append(key)
            if self.idle:
                worker = self.idle.pop()
            elif len(self.threads) < self.size:
                thread = threading.Thread(target=self._serve, name=f"{self.name}-{self.started}", daemon=True)
                self.started += 1
                self.threads.add(thread)
                thread.start()
                return
            else:
                return  # every thread is busy: the first to finish its job takes this key
        worker.wake.release()  # outside the state lock: the woken thread takes it at once

    def _serve(self) -> None:
        lock = self.lock
        ready = self.ready
        me = _Worker()
        me.thread = threading.current_thread()
        finished: _Job | None = None  # the job just run, reported once this thread is seen idle or busy again
        lock.acquire()
        while True:
            while not ready:
                # The decision to end is taken under the lock a submit takes: a job is never stranded.
                if self.stopping:
                    self.threads.discard(me.thread)
                    lock.release()
                    if finished is not None:
                        finished.finish()
                    return
                self.idle.append(me)
                lock.release()
                if finished is not None:
                    # Reported only now that this thread is on the idle stack: the caller's next job, submitted
                    # once it hears of this one, finds the thread asleep and wakes it (no second thread started).
                    finished.finish()
                    finished = None
                woken = me.wake.acquire(True, self.idle_seconds)
                lock.acquire()
                if not woken:
                    if me in self.idle:
                        # Idle for idle_seconds and nobody chose this thread meanwhile: end it.
                        self.idle.remove(me)
                        if not ready:
                            self.threads.discard(me.thread)
                            lock.release()
                            return
                    else:
                        # A submit chose this thread just as the wait timed out: take its release, so that the
                        # next sleep does not wake at once.
                        lock.release()
                        me.wake.acquire()
                        lock.acquire()
            key = ready.popleft()
            job = self.keys[key][0]
            lock.release()
            if finished is not None:
                finished.finish()
                finished = None
            try:
                job.result = job.func(*job.args)
            except BaseException as exc:  # handed to the waiting caller, raised there
                job.error = exc
            lock.acquire()
            queue = self.keys[key]
            queue.popleft()
            if queue:
                ready.append(key)  # its next job, after every key that was ready before it
            else:
                del self.keys[key]
            finished = job

    def stop(self) -> list[threading.Thread]:
        """Ask every thread to end once no job is left; the threads to join."""
        with self.lock:
            self.stopping = True
            sleeping, self.idle = self.idle, []
            threads = list(self.threads)
        for worker in sleeping:
            worker.wake.release()
        return threads

    def restart_allowed(self) -> None:
        with self.lock:
            self.stopping = False

    def reset_after_fork(self) -> None:
        self.lock = threading.Lock()
        self.keys = {}
        self.ready = deque()
        self.threads = set()
        self.idle = []
        self.stopping = False


_writers: weakref.WeakSet[BlockingWriter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The parent's threads do not exist in the child, and its queued jobs belong to the parent's loops.
    global _mailboxes_lock
    _mailboxes_lock = threading.Lock()
    _mailboxes.clear()
    for writer in list(_writers):
        writer._pool.reset_after_fork()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


class BlockingWriter:
    """A backend's blocking steps, run off the event loop by a few long-lived threads (one hand-off per wake).

    :param lanes: threads at most; jobs with equal keys run one at a time in submission order, jobs of different
        keys run at the same time on different threads (their syncs overlap).
    :param name: the threads' name (shown by debuggers and ``threading.enumerate``).
    :param idle_seconds: a thread ends after this long without a job (a later job starts one again).

    Works from any number of asyncio and trio event loops at once (each job reports back to the loop that
    submitted it). Close it with :meth:`aclose` (a backend does so in its own ``aclose``).
    """

    def __init__(self, lanes: int = 2, *, name: str = "dsh-session-writer", idle_seconds: float = 10.0) -> None:
        if type(lanes) is not int or lanes < 1:
            raise ValueError(f"lanes must be a positive integer, got {lanes!r}")
        if not idle_seconds > 0:
            raise ValueError(f"idle_seconds must be positive, got {idle_seconds!r}")
        self._pool = _Pool(lanes, name, idle_seconds)
        _writers.add(self)

    @property
    def lanes(self) -> int:
        """How many threads at most this writer runs at once."""
        return self._pool.size

    async def run(self, key: Hashable, func: Callable[..., T], *args: Any) -> T:
        """Run ``func(*args)`` on a writer thread after every job of ``key`` queued before it; its result or its
        exception. The wait is shielded: the job always runs to its end before the caller sees a cancellation.
        """
        job = _Job(func, args, _current_mailbox())
        self._pool.submit(key, job)
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
        """Queue ``func(*args)`` behind every job of ``key`` queued before it and return at once; once it has
        run, ``callback(result, error)`` is called on the writer thread. The job runs to its end whatever happens
        to the submitter; the callback must be quick and must not block (it typically posts to a loop)."""
        self._pool.submit(key, _Job(func, args, None, callback))

    async def aclose(self) -> None:
        """End every thread once the queued jobs are done, and wait for them (idempotent; a later :meth:`run` starts
        one again)."""
        threads = self._pool.stop()
        try:
            if threads:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(_join_all, threads)
        finally:
            self._pool.restart_allowed()


def _join_all(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join()
