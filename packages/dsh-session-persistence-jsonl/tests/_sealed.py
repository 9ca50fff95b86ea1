"""Sealed (encrypted) JsonlBackend factories shared by the encryption tests and the kits run on them.

Importable by module path (the crash kit's child processes put this directory on ``sys.path``). The keys are
fixed test keys: 32 bytes each, never used outside the test suite.
"""

from __future__ import annotations

import os
from typing import Any

from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl.encryption import StaticKeyProvider

KEY_OLD = bytes(range(32))
KEY_NEW = bytes(range(100, 132))
HERE = os.path.dirname(os.path.abspath(__file__))


def provider(current: str = "k1", **keys: bytes) -> StaticKeyProvider:
    """``k1`` (and whatever else is named) by default."""
    return StaticKeyProvider(current, keys or {"k1": KEY_OLD})


def sealed_backend(root: str | os.PathLike[str], **kwargs: Any) -> JsonlBackend:
    """A backend that seals with ``k1``: what the crash kit's child processes build."""
    return JsonlBackend(root, encryption=provider(), **kwargs)
