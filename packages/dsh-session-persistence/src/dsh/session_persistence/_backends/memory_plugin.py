"""Entry-point plugin (group ``dsh.session``) that makes the in-memory backend discoverable as ``"memory"``."""

from __future__ import annotations

from .._host.host import hookimpl
from .memory import MemoryBackend

__all__ = ["dsh_session_backends"]


@hookimpl
def dsh_session_backends() -> list[type[object]]:
    """The backends this distribution provides: :class:`MemoryBackend`."""
    return [MemoryBackend]
