"""A generic fault-injecting wrapper around any backend (the conformance kit's fault scenarios).

It forwards every primitive to the wrapped backend, counts calls, and fails primitives on demand either
*before* delegating (nothing reaches storage: a failed write or fsync that the backend rolled back) or *after*
delegating (the write is durable but the acknowledgement is lost: the rollback failed, the directory fsync after
publishing failed, the connection dropped after ``COMMIT``). Reads (``load_stored``) can be failed too, so a
read-back after a failed write can be made to fail as well. Optional primitives (``rewrite``,
``materialize_header``, ``load_stored_from``, ``locate``, ``read_raw``, ``aclose``, ``acquire_writer_lease``)
are forwarded only when the wrapped backend has them.
"""

from __future__ import annotations

import builtins
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import anyio

from .._backends.protocol import SessionBackend, SessionSnapshot, StorageMetadata, StoredPrefix
from .._model.events import SessionEvent
from .._model.header import SessionHeader

__all__ = ["FaultInjectingBackend", "InjectedFault"]

When = Literal["before", "after"]

_OPTIONAL = frozenset(
    {
        "load_stored_from",
        "locate",
        "read_raw",
        "supports_raw_artifacts",
        "aclose",
        "acquire_writer_lease",
    }
)
#: Primitives whose failures can be planned (``fail``); the mutating ones may fail before or after writing.
FAILABLE = frozenset({"append_batch", "materialize_header", "commit_repair", "rewrite", "load_stored"})


class InjectedFault(OSError):
    """The error :class:`FaultInjectingBackend` raises (an ``OSError``, like a failed write or fsync)."""


class _Plan:
    def __init__(self) -> None:
        self.planned: deque[When] = deque()
        self.sticky: When | None = None

    def next(self) -> When | None:
        if self.planned:
            return self.planned.popleft()
        return self.sticky


class FaultInjectingBackend:
    """Wrap ``inner`` and fail its primitives on demand.

    ``fail(primitive, times, when=...)`` queues failures for the next ``times`` calls of ``primitive``
    (``times=None``: every later call, a dead disk or a process that is gone); ``fail_appends`` and
    ``fail_reads`` are the shorthands for ``append_batch`` and ``load_stored``. ``heal()`` clears every planned
    failure. ``calls`` counts every primitive call by name, including failed ones.
    """

    def __init__(self, inner: SessionBackend) -> None:
        self.inner = inner
        self.NAME = inner.NAME
        self.calls: Counter[str] = Counter()
        self.append_failures = 0
        self.failures: Counter[str] = Counter()
        self._plans: dict[str, _Plan] = {name: _Plan() for name in FAILABLE}
        self._failure_waiters: builtins.list[tuple[int, anyio.Event]] = []
        if hasattr(inner, "rewrite"):
            self.rewrite = self._rewrite
        if hasattr(inner, "materialize_header"):
            self.materialize_header = self._materialize_header

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

    def fail(self, primitive: str, times: int | None = 1, *, when: When = "before") -> None:
        """Fail the next ``times`` calls of ``primitive`` (``None``: every later call)."""
        if primitive not in FAILABLE:
            raise ValueError(f"cannot plan failures of {primitive!r}; choose from {sorted(FAILABLE)}")
        plan = self._plans[primitive]
        if times is None:
            plan.sticky = when
        else:
            plan.planned.extend([when] * times)

    def fail_appends(self, times: int | None = 1, *, when: When = "before") -> None:
        """Fail the next ``times`` ``append_batch`` calls (``None``: every later call)."""
        self.fail("append_batch", times, when=when)

    def fail_reads(self, times: int | None = 1) -> None:
        """Fail the next ``times`` ``load_stored`` calls (``None``: every later call)."""
        self.fail("load_stored", times)

    def heal(self) -> None:
        """Forget every planned failure: later calls reach the wrapped backend again."""
        for plan in self._plans.values():
            plan.planned.clear()
            plan.sticky = None

    async def wait_for_append_failures(self, count: int) -> None:
        """Wait until ``append_batch`` has failed ``count`` times (e.g. a background write that failed)."""
        if self.append_failures >= count:
            return
        event = anyio.Event()
        self._failure_waiters.append((count, event))
        await event.wait()

    def _record_failure(self, primitive: str) -> None:
        self.failures[primitive] += 1
        if primitive != "append_batch":
            return
        self.append_failures += 1
        for count, event in self._failure_waiters:
            if self.append_failures >= count:
                event.set()

    async def _call(self, primitive: str, detail: str, run: Callable[[], Awaitable[Any]]) -> Any:
        self.calls[primitive] += 1
        failure = self._plans[primitive].next()
        if failure == "before":
            self._record_failure(primitive)
            raise InjectedFault(f"injected {primitive} failure before the write ({detail})")
        result = await run()
        if failure == "after":
            self._record_failure(primitive)
            raise InjectedFault(f"injected {primitive} failure after a durable write ({detail})")
        return result

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        await self._call(
            "append_batch", f"{len(events)} event(s)", lambda: self.inner.append_batch(storage, events, is_materialized)
        )

    async def commit_repair(
        self, storage: StorageMetadata, torn_marker: object | None, closers: Sequence[SessionEvent]
    ) -> None:
        await self._call(
            "commit_repair",
            f"{len(closers)} closer(s)",
            lambda: self.inner.commit_repair(storage, torn_marker, closers),
        )

    async def _rewrite(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        await self._call("rewrite", f"{len(events)} event(s)", lambda: self.inner.rewrite(storage, events))  # type: ignore[attr-defined]

    async def _materialize_header(self, storage: StorageMetadata) -> None:
        await self._call("materialize_header", "header", lambda: self.inner.materialize_header(storage))  # type: ignore[attr-defined]

    async def load_stored(self, session_id: str) -> StoredPrefix | None:
        result: StoredPrefix | None = await self._call(
            "load_stored", session_id, lambda: self.inner.load_stored(session_id)
        )
        return result

    async def read_stored_revision(self, session_id: str) -> str | None:
        self.calls["read_stored_revision"] += 1
        return await self.inner.read_stored_revision(session_id)

    async def list(self) -> builtins.list[SessionHeader]:
        self.calls["list"] += 1
        return await self.inner.list()

    async def list_snapshots(self) -> builtins.list[SessionSnapshot]:
        self.calls["list_snapshots"] += 1
        return await self.inner.list_snapshots()

    def __repr__(self) -> str:
        return f"<FaultInjectingBackend {self.inner!r}>"
