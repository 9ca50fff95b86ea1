"""The per-id FIFO chain: storage work for one session id runs one operation at a time, in call order.

A caller takes its ticket synchronously, before its first suspension, so "A called before B in the same tick"
means A's storage work runs first; different ids never wait for each other. A ticket cancelled while queued
leaves at once (its followers re-check their predecessor), a failed operation never blocks the chain, and an
id's queue is removed when it empties, so an idle coordinator holds no chain at all. Serialized code calls the
coordinator's inner helpers, never a public serialized method (that would wait for itself).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import TypeVar

import anyio
import anyio.lowlevel

__all__ = ["FifoChains", "Ticket"]

T = TypeVar("T")


class Ticket:
    """One caller's place in an id's chain; :meth:`wait` returns once it has left (finished or cancelled).

    The event a follower waits on is made only when one does: most tickets (a live commit's) are never waited on.
    """

    __slots__ = ("_event", "left")

    def __init__(self) -> None:
        self.left = False
        self._event: anyio.Event | None = None

    def leave(self) -> None:
        """Mark the ticket as gone and wake whoever waits for it (idempotent)."""
        self.left = True
        event = self._event
        if event is not None:
            event.set()

    async def wait(self) -> None:
        """Wait until the ticket has left the queue."""
        if self.left:
            await anyio.lowlevel.checkpoint()
            return
        event = self._event
        if event is None:
            event = self._event = anyio.Event()
        await event.wait()


class FifoChains:
    """One ticket queue per session id; ``queues`` is empty whenever no storage work is queued."""

    def __init__(self) -> None:
        self.queues: dict[str, deque[Ticket]] = {}

    def take(self, session_id: str) -> Ticket:
        """Join the end of ``session_id``'s queue now (call this before any ``await``)."""
        ticket = Ticket()
        self.queues.setdefault(session_id, deque()).append(ticket)
        return ticket

    def release(self, session_id: str, ticket: Ticket) -> None:
        """Leave the queue (idempotent) and wake the follower."""
        queue = self.queues.get(session_id)
        if queue is not None:
            if len(queue) == 1 and queue[0] is ticket:
                # The common case (a live commit's ticket, alone in its id's queue): no search, no scan.
                del self.queues[session_id]
            else:
                with suppress(ValueError):  # released already (idempotent)
                    queue.remove(ticket)
                if not queue:
                    del self.queues[session_id]
        ticket.leave()

    async def run(self, session_id: str, func: Callable[[], Awaitable[T]], ticket: Ticket | None = None) -> T:
        """Run ``func`` once every earlier ticket of ``session_id`` has left the queue, then leave it."""
        if ticket is None:
            ticket = self.take(session_id)
        try:
            while True:
                queue = self.queues[session_id]
                index = queue.index(ticket)
                if index == 0:
                    break
                await queue[index - 1].wait()
            return await func()
        finally:
            self.release(session_id, ticket)

    async def wait_idle_step(self) -> bool:
        """Wait for the last ticket of some queue to leave; ``False`` when no queue is left."""
        if not self.queues:
            return False
        await next(iter(self.queues.values()))[-1].wait()
        return True
