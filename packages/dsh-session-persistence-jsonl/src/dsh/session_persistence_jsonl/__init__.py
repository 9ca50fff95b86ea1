"""JSONL backend for dsh sessions: one append-only, checksummed ``.jsonl.zstd`` transcript per session.

``JsonlBackend(root, compression="zstd" | "none", pack_chunks=True)`` implements the
:class:`dsh.session_persistence.backend.SessionBackend` primitives; the ``PersistenceCoordinator`` layers
serialization, write-behind and crash repair on top. The plugin module registers it under the name
``"jsonl"`` (entry-point group ``dsh.session``).
"""

from __future__ import annotations

from ._backend import JsonlBackend, SessionLogExistsError
from ._scan import TornTail

__all__ = ["JsonlBackend", "SessionLogExistsError", "TornTail"]
