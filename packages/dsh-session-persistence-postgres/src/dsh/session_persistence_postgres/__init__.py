"""PostgreSQL backend for dsh sessions: one row per session, one row per event, every write one transaction.

``PostgresBackend(conninfo, schema="public")`` implements the :class:`dsh.session_persistence.backend.SessionBackend`
primitives over psycopg 3's async connection pool (asyncio only: psycopg's async API does not run on trio). The
plugin module registers it under the name ``"postgres"`` (entry-point group ``dsh.session``).
"""

from __future__ import annotations

from ._backend import PostgresBackend
from ._schema import SCHEMA_VERSION, SchemaVersionError

NAME = PostgresBackend.NAME

__all__ = ["NAME", "SCHEMA_VERSION", "PostgresBackend", "SchemaVersionError"]
