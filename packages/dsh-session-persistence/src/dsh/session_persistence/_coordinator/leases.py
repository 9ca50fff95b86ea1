"""The writer leases one coordinator holds: at most one per session id, taken before the first write.

The coordinator takes a session's lease before its first write or adoption (and before a cold load commits
repair or a rewrite runs) and keeps it until the session is disposed or the coordinator closes, so a second
writer, in this process or another, is refused with :class:`SessionLockedError` before it writes anything. A
backend without the lease primitive (see :class:`~dsh.session_persistence.backend.SupportsWriterLease`) keeps
the 0.1 behaviour: every call here is then a no-op and only the backend's own checks stop a second writer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from .._backends.protocol import WriterLease
from .._model.header import SessionHeader

__all__ = ["LeaseTable"]

_logger = logging.getLogger("dsh.session_persistence")

Acquire = Callable[[SessionHeader], Awaitable[WriterLease]]


class LeaseTable:
    """Leases held by one coordinator, keyed by session id."""

    def __init__(self, acquire: Acquire | None) -> None:
        self._acquire = acquire
        self.held: dict[str, WriterLease] = {}

    @property
    def supported(self) -> bool:
        """Whether the backend has a lease primitive at all."""
        return self._acquire is not None

    def holds(self, session_id: str) -> bool:
        """Whether this coordinator holds ``session_id``'s lease (always true without a lease primitive)."""
        return self._acquire is None or session_id in self.held

    async def acquire(self, meta: SessionHeader) -> bool:
        """Take the lease of ``meta.id`` unless already held; ``True`` when it was taken just now.

        Raises :class:`~dsh.session_persistence.SessionLockedError` when another writer holds it.
        """
        if self.holds(meta.id):
            return False
        assert self._acquire is not None
        with anyio.CancelScope(shield=True):
            # Shielded: a lease taken by a cancelled caller must still be recorded, or nobody would release it.
            self.held[meta.id] = await self._acquire(meta)
        return True

    async def release(self, session_id: str) -> None:
        """Give the lease of ``session_id`` back (no-op when not held). A failed release is logged, not raised:
        the lease is then released when the process exits."""
        lease = self.held.pop(session_id, None)
        if lease is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await lease.release()
            except Exception as exc:
                _logger.warning('writer lease of session "%s" could not be released: %s', session_id, exc)

    async def release_all(self) -> None:
        """Release every lease still held (coordinator teardown)."""
        for session_id in list(self.held):
            await self.release(session_id)
