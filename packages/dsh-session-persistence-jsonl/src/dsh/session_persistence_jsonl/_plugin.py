"""Plugin module for the ``dsh.session`` entry-point group: contributes :class:`JsonlBackend` as ``"jsonl"``."""

from __future__ import annotations

from dsh.session_persistence.backend import hookimpl

from ._facade import JsonlBackend

__all__ = ["dsh_session_backends"]


@hookimpl
def dsh_session_backends() -> list[type[object]]:
    """The JSONL backend class (``NAME = "jsonl"``)."""
    return [JsonlBackend]
