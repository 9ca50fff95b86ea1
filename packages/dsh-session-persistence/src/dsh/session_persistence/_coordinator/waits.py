"""Backend-native waits for the commit path: a one-shot signal and a completion port, per async library.

The commit path's hot steps must not pay anyio's generic machinery (an ``anyio.Event`` per waiter, a cancel scope per
wait, a task per background step). This module finds out once which library runs the coordinator and then uses that
library's own primitive:

* :class:`Signal`: a one-shot completion that callers park on. asyncio: one future per parked caller, made only
  when a caller actually waits; trio: the parked task itself (``wait_task_rescheduled``), no object at all. A caller
  cancelled while parked leaves alone; the signal and the other waiters are untouched.
* :class:`CompletionPort`: how a thread (a backend's writer) hands a completion back to the loop: the callbacks
  queue under a lock and one thread-safe call (asyncio's ``call_soon_threadsafe``, trio's ``run_sync_soon``) runs
  every callback queued by then, so many completions cost one loop wake.

Everything else (task groups, cancellation, threads at the edges) stays anyio.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["CompletionPort", "Signal", "current_library"]

_logger = logging.getLogger("dsh.session_persistence")


def current_library() -> str:
    """``"asyncio"`` or ``"trio"``: the async library running in this thread (asked once per coordinator)."""
    trio = sys.modules.get("trio")  # trio runs only if it was imported; asking costs nothing otherwise
    if trio is not None:
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:
            pass
        else:
            return "trio"
    asyncio.get_running_loop()  # raises RuntimeError outside any supported loop
    return "asyncio"


class Signal:
    """A one-shot completion: :meth:`set` once (with an error or not), any number of callers :meth:`wait`.

    ``set`` and ``wait`` run on the loop's thread. A caller that arrives after ``set`` returns (or raises the error)
    at once, after a cancellation check; the error is raised to every waiter.
    """

    __slots__ = ("_error", "_is_set", "_loop", "_trio", "_waiters")

    def __init__(self, library: str, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._trio = library == "trio"
        self._loop = loop  # asyncio: the loop its futures belong to (else the running loop, asked per wait)
        self._is_set = False
        self._error: BaseException | None = None
        self._waiters: list[Any] | None = None

    def set(self, error: BaseException | None = None) -> None:
        """Complete the signal and wake every parked caller (a second call is ignored)."""
        if self._is_set:
            return
        self._is_set = True
        self._error = error
        waiters, self._waiters = self._waiters, None
        if not waiters:
            return
        if self._trio:
            import trio

            for task in waiters:
                trio.lowlevel.reschedule(task)
        else:
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    async def wait(self) -> None:
        """Park until :meth:`set`; raise its error. A cancelled caller abandons only its own wait."""
        if self._is_set:
            await _checkpoint_if_cancelled(self._trio)
        elif self._trio:
            await self._park_trio()
        else:
            await self._park_asyncio()
        error = self._error
        if error is not None:
            raise error

    async def _park_asyncio(self) -> None:
        loop = self._loop
        future = (loop if loop is not None else asyncio.get_running_loop()).create_future()
        waiters = self._waiters
        if waiters is None:
            waiters = self._waiters = []
        waiters.append(future)
        try:
            await future
        except BaseException:
            # Cancelled: leave the list (the signal may still be pending for others).
            current = self._waiters
            if current is not None and future in current:
                current.remove(future)
            raise

    async def _park_trio(self) -> None:
        import trio

        task = trio.lowlevel.current_task()
        waiters = self._waiters
        if waiters is None:
            waiters = self._waiters = []
        waiters.append(task)

        def abort(_: Any) -> Any:
            current = self._waiters
            if current is not None and task in current:
                current.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)


async def _checkpoint_if_cancelled(trio_loop: bool) -> None:
    if trio_loop:
        import trio

        await trio.lowlevel.checkpoint_if_cancelled()
    else:
        from anyio.lowlevel import checkpoint_if_cancelled

        await checkpoint_if_cancelled()


class CompletionPort:
    """Hands callbacks from any thread to one event loop, one loop wake for every callback queued meanwhile.

    Made on the loop's thread (it remembers that loop). :meth:`post` may be called from any thread, the loop's
    own included: the callback always runs later, on the loop, never inside ``post`` (so a caller never sees its
    completion re-entrantly). After the loop has finished, posted callbacks are dropped.
    """

    __slots__ = ("_lock", "_loop", "_post", "_ready", "library")

    def __init__(self, library: str | None = None) -> None:
        self.library = library or current_library()
        self._loop: asyncio.AbstractEventLoop | None = None
        if self.library == "trio":
            import trio

            self._post: Callable[[Callable[[], None]], object] = trio.lowlevel.current_trio_token().run_sync_soon
        else:
            loop = self._loop = asyncio.get_running_loop()
            self._post = loop.call_soon_threadsafe
        self._lock = threading.Lock()
        self._ready: list[Callable[[], None]] = []

    def signal(self) -> Signal:
        """A new :class:`Signal` for this port's loop (on asyncio its futures are made on that loop, which is not
        looked up again per wait)."""
        return Signal(self.library, self._loop)

    def post(self, callback: Callable[[], None]) -> None:
        """Run ``callback()`` soon on the loop (thread-safe; one scheduled call serves every pending callback)."""
        with self._lock:
            self._ready.append(callback)
            if len(self._ready) > 1:
                return  # the call already scheduled picks this one up
        try:
            self._post(self._run)
        except RuntimeError:
            # The loop has finished (trio's RunFinishedError is a RuntimeError): nobody is left to complete.
            with self._lock:
                self._ready.clear()

    def _run(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for callback in ready:
            try:
                callback()
            except Exception:
                # One broken completion must not strand the others queued behind it.
                _logger.exception("session persistence completion callback raised")
