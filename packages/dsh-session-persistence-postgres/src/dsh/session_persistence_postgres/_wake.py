"""A caller's wait for the group committer, on its own event loop's primitive (an asyncio future, a trio event).

The committer thread wakes a group's callers with one thread-safe call into their loop (``call_soon_threadsafe``,
or trio's ``run_sync_soon``), which runs :meth:`Waiter.wake` for each of them there. A cancelled caller leaves its
wait at once; a wake that finds it gone does nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["DoneWaiter", "Waiter"]


class Waiter:
    """One caller's completion. ``key`` identifies its loop; ``post`` runs a callback on that loop from any thread."""

    __slots__ = ("_event", "_future", "key", "post")

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None
        self._event: Any = None
        self.key: object
        self.post: Callable[[Callable[[], None]], object]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio: the backend runs on anyio, so trio
            import trio

            token = trio.lowlevel.current_trio_token()
            self._event = trio.Event()
            self.key = token
            self.post = token.run_sync_soon
        else:
            self._future = loop.create_future()
            self.key = loop
            self.post = loop.call_soon_threadsafe

    def wake(self) -> None:
        """Run on the caller's loop: its wait ends (nothing if it already left)."""
        if self._future is not None:
            if not self._future.done():
                self._future.set_result(None)
        else:
            self._event.set()

    async def wait(self) -> None:
        if self._future is not None:
            await self._future
        else:
            await self._event.wait()


#: The one "loop" every :class:`DoneWaiter` belongs to: the committer thread itself.
_COMMITTER = object()


class DoneWaiter:
    """A submitted job's completion (the core's ``SupportsSubmitAppend``): ``done(error)`` is called on the committer
    thread once the group has settled, with the job's outcome (``None``: stored). No loop is involved: the caller's
    completion port brings it to the caller's loop."""

    __slots__ = ("done", "job")

    key = _COMMITTER

    def __init__(self, done: Callable[[BaseException | None], None]) -> None:
        self.done = done
        self.job: Any = None  # the GroupJob, set right after it is made

    @staticmethod
    def post(callback: Callable[[], None]) -> None:
        callback()  # already on the committer thread, where done() may be called

    def wake(self) -> None:
        self.done(self.job.error)
