"""The schema version and PostgreSQL's identifier limit: constants the package exports without loading psycopg."""

from __future__ import annotations

__all__ = ["MAX_IDENTIFIER_BYTES", "SCHEMA_VERSION", "SEALED_SCHEMA_VERSION"]

#: The schema version of a plaintext store (what 0.1 and 0.2 create and read).
SCHEMA_VERSION = 1
#: The schema version of a store that may hold sealed sessions; this build reads both.
SEALED_SCHEMA_VERSION = 2

#: PostgreSQL truncates identifiers to this many bytes (NAMEDATALEN - 1); longer schema names are refused.
MAX_IDENTIFIER_BYTES = 63
