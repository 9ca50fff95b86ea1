"""JSONL backend for dsh sessions: one append-only, checksummed ``.jsonl.zstd`` transcript per session.

``JsonlBackend(root, compression="zstd" | "none", pack_chunks=True, max_batch_bytes=256 MiB)`` implements the
:class:`dsh.session_persistence.backend.SessionBackend` primitives; the ``PersistenceCoordinator`` layers
serialization, write-behind and crash repair on top. Each durable batch is written (log format v1) as a small
declaration followed by its data, so a torn write and damage are told apart. The plugin module registers it
under the name ``"jsonl"`` (entry-point group ``dsh.session``).
"""

from __future__ import annotations

from ._facade import JsonlBackend, SessionLogExistsError
from ._files.discovery import Damaged
from ._files.sealed_store import SealedStoreError
from ._format.v0 import TornTail
from ._format.v1 import BatchTooLargeError
from ._format.v1_damage import DamagedTail

__all__ = [
    "BatchTooLargeError",
    "Damaged",
    "DamagedTail",
    "JsonlBackend",
    "SealedStoreError",
    "SessionLogExistsError",
    "TornTail",
]
