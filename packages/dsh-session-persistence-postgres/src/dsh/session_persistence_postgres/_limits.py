"""The schema version and PostgreSQL's identifier limit: constants the package exports without loading psycopg."""

from __future__ import annotations

__all__ = ["MAX_IDENTIFIER_BYTES", "SCHEMA_VERSION"]

#: The schema version this build creates and reads.
SCHEMA_VERSION = 1

#: PostgreSQL truncates identifiers to this many bytes (NAMEDATALEN - 1); longer schema names are refused.
MAX_IDENTIFIER_BYTES = 63
