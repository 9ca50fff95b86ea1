"""A :class:`~dsh.session_persistence.MemoryBackend` with test controls (coordinator.md §7 ``ControlledBackend``).

Test hooks only, never for production use:

* counters ``load_attempts``, ``append_attempts``, ``repair_attempts``, ``revision_reads`` (every call, failed
  ones included);
* ``lifecycle``: ``"append-started"`` / ``"append-committed"`` per ``append_batch`` and ``"close"`` on ``aclose``;
* async hooks ``before_append(n)``, ``before_load_stored(n)``, ``before_commit_repair(n)`` and
  ``before_read_revision(n)`` (``n`` is the 1-based attempt number): await a gate in them, or raise to fail;
* :meth:`ControlledMemoryBackend.fail_next`: the next ``times`` calls of a primitive raise ``error``, either
  before the durable write or after it (the write happened, the acknowledgement was lost).
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

from .._backends.memory import MemoryBackend, MemoryStore
from .._backends.protocol import SessionSnapshot, StorageMetadata, StoredPrefix, StoredSuffix
from .._model.events import SessionEvent
from .._model.header import SessionHeader

__all__ = ["ControlledMemoryBackend", "Primitive"]

Primitive = Literal[
    "load_stored",
    "load_stored_from",
    "read_stored_revision",
    "append_batch",
    "commit_repair",
    "materialize_header",
    "rewrite",
    "list",
    "list_snapshots",
    "aclose",
]
Hook = Callable[[int], Awaitable[None]]


class _Planned:
    __slots__ = ("after", "error", "times")

    def __init__(self, error: BaseException, times: int | None, after: bool) -> None:
        self.error = error
        self.times = times
        self.after = after


class ControlledMemoryBackend(MemoryBackend):
    """:class:`MemoryBackend` plus counters, gates, a lifecycle log and failure injection (see the module doc)."""

    def __init__(self, store: MemoryStore | None = None) -> None:
        super().__init__(store)
        self.load_attempts = 0
        self.append_attempts = 0
        self.repair_attempts = 0
        self.revision_reads = 0
        self.seek_attempts = 0
        self.lifecycle: builtins.list[str] = []
        self.before_append: Hook | None = None
        self.before_load_stored: Hook | None = None
        self.before_commit_repair: Hook | None = None
        self.before_read_revision: Hook | None = None
        self._planned: dict[str, builtins.list[_Planned]] = {}

    def fail_next(
        self, primitive: Primitive, error: BaseException, *, times: int | None = 1, after_write: bool = False
    ) -> None:
        """Make the next ``times`` calls of ``primitive`` raise ``error`` (``times=None``: every call until
        :meth:`heal`). With ``after_write=True`` a mutating primitive raises after its durable write."""
        self._planned.setdefault(primitive, []).append(_Planned(error, times, after_write))

    def heal(self) -> None:
        """Forget every planned failure."""
        self._planned.clear()

    def _maybe_fail(self, primitive: str, after: bool) -> None:
        plans = self._planned.get(primitive)
        if not plans:
            return
        plan = plans[0]
        if plan.after != after:
            return
        if plan.times is not None:
            plan.times -= 1
            if plan.times <= 0:
                plans.pop(0)
        raise plan.error

    async def load_stored(self, session_id: str) -> StoredPrefix | None:
        self.load_attempts += 1
        if self.before_load_stored is not None:
            await self.before_load_stored(self.load_attempts)
        self._maybe_fail("load_stored", after=False)
        return await super().load_stored(session_id)

    async def load_stored_from(self, session_id: str, from_seq: int) -> StoredSuffix | None:
        self.seek_attempts += 1
        self._maybe_fail("load_stored_from", after=False)
        return await super().load_stored_from(session_id, from_seq)

    async def read_stored_revision(self, session_id: str) -> str | None:
        self.revision_reads += 1
        if self.before_read_revision is not None:
            await self.before_read_revision(self.revision_reads)
        self._maybe_fail("read_stored_revision", after=False)
        return await super().read_stored_revision(session_id)

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        self.append_attempts += 1
        self.lifecycle.append("append-started")
        if self.before_append is not None:
            await self.before_append(self.append_attempts)
        self._maybe_fail("append_batch", after=False)
        await super().append_batch(storage, events, is_materialized)
        self.lifecycle.append("append-committed")
        self._maybe_fail("append_batch", after=True)

    async def commit_repair(
        self, storage: StorageMetadata, torn_marker: object | None, closers: Sequence[SessionEvent]
    ) -> None:
        self.repair_attempts += 1
        if self.before_commit_repair is not None:
            await self.before_commit_repair(self.repair_attempts)
        self._maybe_fail("commit_repair", after=False)
        await super().commit_repair(storage, torn_marker, closers)
        self._maybe_fail("commit_repair", after=True)

    async def materialize_header(self, storage: StorageMetadata) -> None:
        self._maybe_fail("materialize_header", after=False)
        await super().materialize_header(storage)
        self._maybe_fail("materialize_header", after=True)

    async def rewrite(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        self._maybe_fail("rewrite", after=False)
        await super().rewrite(storage, events)
        self._maybe_fail("rewrite", after=True)

    async def list(self) -> builtins.list[SessionHeader]:
        self._maybe_fail("list", after=False)
        return await super().list()

    async def list_snapshots(self) -> builtins.list[SessionSnapshot]:
        self._maybe_fail("list_snapshots", after=False)
        return await super().list_snapshots()

    async def aclose(self) -> None:
        self.lifecycle.append("close")
        self._maybe_fail("aclose", after=False)
        await super().aclose()
