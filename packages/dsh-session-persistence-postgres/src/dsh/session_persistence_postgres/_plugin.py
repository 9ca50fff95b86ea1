"""Plugin module for the ``dsh.session`` entry-point group: contributes :class:`PostgresBackend` as ``"postgres"``."""

from __future__ import annotations

import pluggy

from ._backend import PostgresBackend
from ._core import PROJECT_NAME

__all__ = ["dsh_session_backends"]

# A third-party plugin builds its own marker from the public project name, as pluggy intends.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookimpl
def dsh_session_backends() -> list[type[object]]:
    """The PostgreSQL backend class (``NAME = "postgres"``)."""
    return [PostgresBackend]
