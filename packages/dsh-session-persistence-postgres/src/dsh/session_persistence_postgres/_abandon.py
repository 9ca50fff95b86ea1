"""A caller's deadline bounds its wait, never the work: a write its caller abandoned is finished, then settled.

Every primitive runs in a worker thread on a blocking psycopg connection. A cancelled caller (its
``anyio.fail_after`` deadline passed) leaves at once: the thread is abandoned, not stopped, and goes on to its end,
bounded by the backend's own timeouts (``client_timeout`` drops a silent connection, ``connect_timeout`` bounds each
reconnect, ``retry_timeout`` bounds reconnecting and reading back). A write has an outcome the caller never saw, so
the writes of one session form a chain: the next one starts only after the previous one's thread has ended, and if
the previous one was abandoned after it was sent, the next one learns first what it left (the primitive reads back;
see :meth:`WriteChains.run`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

__all__ = ["WriteChains", "run_abandonable"]

T = TypeVar("T")


async def run_abandonable(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread; a cancelled caller leaves at once, the thread runs to its end."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args), abandon_on_cancel=True)


class _Link:
    """One write of a session: ``done`` when its thread ended; ``sent`` once it started; ``abandoned`` by its caller."""

    __slots__ = ("abandoned", "done", "sent")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.sent = False
        self.abandoned = False

    @property
    def unknown(self) -> bool:
        """Its caller left after it was sent: what it stored is unknown to anyone until read back."""
        return self.abandoned and self.sent


class WriteChains:
    """The last write of each session; a session's writes run one after another, across abandoned callers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, _Link] = {}

    async def run(self, session_id: str, fn: Callable[..., T]) -> T | None:
        """Run ``fn(after_unknown=...)`` once the session's previous write has ended; ``None`` if abandoned unsent.

        ``after_unknown`` is true when that previous write was abandoned by its caller after it was sent: ``fn``
        reads the stored state back before sending anything (the abandoned batch may have committed).
        """
        link = _Link()
        with self._lock:
            before = self._last.get(session_id)
            self._last[session_id] = link

        def body() -> T | None:
            try:
                if before is not None:
                    before.done.wait()
                if link.abandoned:
                    return None  # its caller left before it started: nothing is sent
                link.sent = True
                return fn(after_unknown=before is not None and before.unknown)
            finally:
                with self._lock:
                    # An abandoned write stays the session's last until the next write has read back after it.
                    if self._last.get(session_id) is link and not link.unknown:
                        del self._last[session_id]
                link.done.set()

        try:
            return await run_abandonable(body)
        except anyio.get_cancelled_exc_class():
            with self._lock:
                link.abandoned = True
                if link.sent and session_id not in self._last:
                    self._last[session_id] = link  # it ended as its caller left: the next write still reads back
            raise
