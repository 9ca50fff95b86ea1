"""A caller's deadline bounds its wait, never the work: a write its caller abandoned is finished, then settled.

Every primitive runs in a worker thread on a blocking psycopg connection. A cancelled caller (its
``anyio.fail_after`` deadline passed) leaves at once: the thread is abandoned, not stopped, and goes on to its end,
bounded by the backend's own timeouts (``client_timeout`` drops a silent connection, ``connect_timeout`` bounds each
reconnect, ``retry_timeout`` bounds reconnecting and reading back). A write has an outcome the caller never saw, so
the writes of one session form a chain: the next one starts only after the previous one's thread has ended, and if
the previous one was abandoned after it was sent, the next one learns first what it left (the primitive reads back;
see :meth:`WriteChains.run`).

A write abandoned before its thread started may never run at all (anyio's asyncio backend drops a job whose caller
left while it was still queued; trio runs it): such a write is *skipped*, nothing of it is sent, and the chain goes
on as if it had never been there. Nothing may wait for it to end.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from ._core import SessionStorageError

__all__ = ["WriteChains", "run_abandonable"]

T = TypeVar("T")


async def run_abandonable(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread; a cancelled caller leaves at once, the thread runs to its end.

    If the caller leaves before a thread picked the call up, ``fn`` may never run (asyncio) or run later (trio).
    """
    return await anyio.to_thread.run_sync(functools.partial(fn, *args), abandon_on_cancel=True)


class _Link:
    """One write of a session: ``sent`` once it started, ``ended`` when its thread ended, ``abandoned`` by its caller.

    ``before`` is the session's write it follows (dropped once this one started).
    """

    __slots__ = ("abandoned", "before", "ended", "sent")

    def __init__(self, before: _Link | None) -> None:
        self.before = before
        self.sent = False
        self.ended = False
        self.abandoned = False

    @property
    def unknown(self) -> bool:
        """Its caller left after it was sent: what it stored is unknown to anyone until read back."""
        return self.abandoned and self.sent

    @property
    def skipped(self) -> bool:
        """Its caller left before it was sent: it never sends anything, whether or not its thread ever runs."""
        return self.abandoned and not self.sent


def _effective(link: _Link | None) -> _Link | None:
    """The write that ``link`` stands for in its chain: itself, or (skipped) the write it followed."""
    while link is not None and link.skipped:
        link = link.before
    return link


class WriteChains:
    """The last write of each session; a session's writes run one after another, across abandoned callers."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._last: dict[str, _Link] = {}
        self._closed = False

    def close(self) -> None:
        """No write starts any more; every write still waiting for its turn fails typed (nothing of it is sent)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    async def run(self, session_id: str, fn: Callable[..., T]) -> T | None:
        """Run ``fn(after_unknown=...)`` once the session's previous write has ended; ``None`` if abandoned unsent.

        ``after_unknown`` is true when that previous write was abandoned by its caller after it was sent: ``fn``
        reads the stored state back before sending anything (the abandoned batch may have committed).
        """
        with self._cond:
            if self._closed:
                raise SessionStorageError("PostgresBackend is closed")
            link = _Link(self._last.get(session_id))
            self._last[session_id] = link

        def body() -> T | None:
            with self._cond:
                while True:
                    before = _effective(link.before)
                    if link.abandoned or self._closed or before is None or before.ended:
                        break
                    self._cond.wait()
                if link.abandoned:
                    return None  # its caller left before it started: nothing is sent (already skipped)
                if self._closed:
                    link.abandoned = True  # skipped: the next write (none can start now) passes over it
                    raise SessionStorageError("PostgresBackend is closed")
                link.sent = True
                link.before = None
            try:
                return fn(after_unknown=before is not None and before.unknown)
            finally:
                with self._cond:
                    link.ended = True
                    # An abandoned write stays the session's last until the next write has read back after it.
                    if self._last.get(session_id) is link and not link.unknown:
                        del self._last[session_id]
                    self._cond.notify_all()

        try:
            return await run_abandonable(body)
        except anyio.get_cancelled_exc_class():
            with self._cond:
                link.abandoned = True
                if link.skipped:
                    self._pass_over(session_id, link)
                elif session_id not in self._last:
                    self._last[session_id] = link  # it ended as its caller left: the next write still reads back
                self._cond.notify_all()  # a write waiting behind a skipped one may go now
            raise

    def enter(self, session_id: str) -> _Link | None:
        """A sent link for a write that needs no wait and no read-back, or ``None`` if the session's chain is busy.

        Free means no write of the session is in flight and none was left in doubt: the write may go to the group
        committer at once (see :mod:`._group`). It counts as sent from now on: once queued it is always sent, so a
        caller that leaves makes it *unknown* and the session's next write reads back first (:meth:`run`).
        """
        with self._cond:
            if self._closed:
                raise SessionStorageError("PostgresBackend is closed")
            if session_id in self._last:
                return None
            link = _Link(None)
            link.sent = True
            self._last[session_id] = link
            return link

    def end(self, session_id: str, link: _Link, *, unknown: bool = False) -> None:
        """``link``'s write ended (the committer settled it): the session's next write may start; ``unknown``: what
        it stored is not known, so that write reads back first."""
        with self._cond:
            if unknown:
                link.abandoned = True  # sent and unsettled: the same state as a write whose caller left
            link.ended = True
            if self._last.get(session_id) is link and not link.unknown:
                del self._last[session_id]
            self._cond.notify_all()

    def abandon(self, session_id: str, link: _Link) -> None:
        """``link``'s caller left: if its write has already ended, the next write still reads back after it."""
        with self._cond:
            link.abandoned = True
            if session_id not in self._last:
                self._last[session_id] = link
            self._cond.notify_all()

    def _pass_over(self, session_id: str, link: _Link) -> None:
        """``link`` will never send: if it is the session's last, the write it followed takes its place."""
        if self._last.get(session_id) is not link:
            return  # a later write follows it and passes over it by itself (see :func:`_effective`)
        before = _effective(link.before)
        if before is None or (before.ended and not before.unknown):
            del self._last[session_id]
        else:
            self._last[session_id] = before
