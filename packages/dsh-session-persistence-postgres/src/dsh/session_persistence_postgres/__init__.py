"""PostgreSQL backend for dsh sessions: one row per session, one row per event, every write one transaction.

``PostgresBackend(conninfo, schema="public", ...)`` implements the
:class:`dsh.session_persistence.backend.SessionBackend` primitives on sync psycopg 3 connections run in worker
threads, so it works under asyncio and trio. The plugin module registers it under the name ``"postgres"``
(entry-point group ``dsh.session``). ``PostgresBackend(..., encryption=provider)`` seals event bodies (see
:mod:`dsh.session_persistence.encryption` for the providers).

Importing the package (or the plugin module, which every ``dsh-sessions`` process loads) does not import psycopg:
it is loaded when the first ``PostgresBackend`` is built.
"""

from __future__ import annotations

from ._backend import PostgresBackend
from ._errors import PostgresConfigurationError, SchemaVersionError, SealedStoreError, WeakDurabilityError
from ._limits import MAX_IDENTIFIER_BYTES, SCHEMA_VERSION, SEALED_SCHEMA_VERSION

NAME = PostgresBackend.NAME

__all__ = [
    "MAX_IDENTIFIER_BYTES",
    "NAME",
    "SCHEMA_VERSION",
    "SEALED_SCHEMA_VERSION",
    "PostgresBackend",
    "PostgresConfigurationError",
    "SchemaVersionError",
    "SealedStoreError",
    "WeakDurabilityError",
]
