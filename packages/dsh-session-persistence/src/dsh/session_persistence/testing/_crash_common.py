"""What the crash-state harness's recording child and its checker share: the session id, the factory spec."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["SESSION_ID", "load_factory"]

SESSION_ID = "crash-states"


def load_factory(
    spec: str, sys_path: Sequence[str] = (), kwargs: Mapping[str, Any] | None = None
) -> Callable[[str], Any]:
    """Resolve ``module:callable`` (after putting ``sys_path`` first on ``sys.path``) into ``root -> backend``.

    The backend is built as ``callable(root, **kwargs)``.
    """
    for entry in reversed(sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"backend factory must be 'module:callable', got {spec!r}")
    factory: Callable[..., Any] = getattr(importlib.import_module(module_name), attr)
    options = dict(kwargs or {})
    return lambda root: factory(root, **options)
