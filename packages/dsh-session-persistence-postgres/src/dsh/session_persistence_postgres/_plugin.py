"""Plugin module for the ``dsh.session`` entry-point group: contributes :class:`PostgresBackend` as ``"postgres"``."""

from __future__ import annotations

from ._backend import PostgresBackend
from ._core import hookimpl

__all__ = ["dsh_session_backends"]


@hookimpl
def dsh_session_backends() -> list[type[object]]:
    """The PostgreSQL backend class (``NAME = "postgres"``)."""
    return [PostgresBackend]
