"""A generic fault-injecting wrapper around any backend (the conformance kit's [fault] scenarios).

It forwards every primitive to the wrapped backend, counts calls, and fails ``append_batch`` on demand either
*before* delegating (nothing reaches storage: a failed write or fsync that the backend rolled back) or *after*
delegating (the batch is durable but the acknowledgement is lost: the process died between the fsync and the
return). Optional primitives (``rewrite``, ``materialize_header``, ``load_stored_from``, ``locate``,
``read_raw``, ``aclose``) are forwarded only when the wrapped backend has them.
"""

from __future__ import annotations

import builtins
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any, Literal

import anyio

from .._backend import SessionBackend, SessionSnapshot, StorageMetadata, StoredPrefix
from .._events import SessionEvent
from .._header import SessionHeader

__all__ = ["FaultInjectingBackend", "InjectedFault"]

When = Literal["before", "after"]

_OPTIONAL = frozenset(
    {"rewrite", "materialize_header", "load_stored_from", "locate", "read_raw", "supports_raw_artifacts", "aclose"}
)


class InjectedFault(OSError):
    """The error :class:`FaultInjectingBackend` raises (an ``OSError``, like a failed write or fsync)."""


class FaultInjectingBackend:
    """Wrap ``inner`` and fail its ``append_batch`` on demand.

    ``fail_appends(times, when=...)`` queues failures for the next ``times`` calls; ``times=None`` makes every
    later call fail (a dead disk, or a process that is gone). ``heal()`` clears every planned failure.
    ``calls`` counts every primitive call by name, including failed ones.
    """

    def __init__(self, inner: SessionBackend) -> None:
        self.inner = inner
        self.NAME = inner.NAME
        self.calls: Counter[str] = Counter()
        self.append_failures = 0
        self._planned: deque[When] = deque()
        self._sticky: When | None = None
        self._failure_waiters: builtins.list[tuple[int, anyio.Event]] = []

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not defined here: forward optional primitives the inner backend has.
        if name in _OPTIONAL:
            value = getattr(self.inner, name)
            if callable(value):
                return self._counted(name, value)
            return value
        raise AttributeError(name)

    def _counted(self, name: str, function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return function(*args, **kwargs)

        return call

    def fail_appends(self, times: int | None = 1, *, when: When = "before") -> None:
        """Fail the next ``times`` ``append_batch`` calls (``None``: every later call)."""
        if times is None:
            self._sticky = when
        else:
            self._planned.extend([when] * times)

    def heal(self) -> None:
        """Forget every planned failure: later appends reach the wrapped backend again."""
        self._planned.clear()
        self._sticky = None

    async def wait_for_append_failures(self, count: int) -> None:
        """Wait until ``append_batch`` has failed ``count`` times (e.g. a background write that failed)."""
        if self.append_failures >= count:
            return
        event = anyio.Event()
        self._failure_waiters.append((count, event))
        await event.wait()

    def _record_failure(self) -> None:
        self.append_failures += 1
        for count, event in self._failure_waiters:
            if self.append_failures >= count:
                event.set()

    def _next_failure(self) -> When | None:
        if self._planned:
            return self._planned.popleft()
        return self._sticky

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        self.calls["append_batch"] += 1
        failure = self._next_failure()
        if failure == "before":
            self._record_failure()
            raise InjectedFault(f"injected append failure before the write ({len(events)} event(s))")
        await self.inner.append_batch(storage, events, is_materialized)
        if failure == "after":
            self._record_failure()
            raise InjectedFault(f"injected append failure after a durable write ({len(events)} event(s))")

    async def load_stored(self, session_id: str) -> StoredPrefix | None:
        self.calls["load_stored"] += 1
        return await self.inner.load_stored(session_id)

    async def read_stored_revision(self, session_id: str) -> str | None:
        self.calls["read_stored_revision"] += 1
        return await self.inner.read_stored_revision(session_id)

    async def commit_repair(
        self, storage: StorageMetadata, torn_marker: object | None, closers: Sequence[SessionEvent]
    ) -> None:
        self.calls["commit_repair"] += 1
        await self.inner.commit_repair(storage, torn_marker, closers)

    async def list(self) -> builtins.list[SessionHeader]:
        self.calls["list"] += 1
        return await self.inner.list()

    async def list_snapshots(self) -> builtins.list[SessionSnapshot]:
        self.calls["list_snapshots"] += 1
        return await self.inner.list_snapshots()

    def __repr__(self) -> str:
        return f"<FaultInjectingBackend {self.inner!r}>"
