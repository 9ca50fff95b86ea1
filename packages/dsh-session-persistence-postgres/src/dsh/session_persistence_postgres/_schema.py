"""The database schema: created and versioned by the backend itself.

Four objects live in one PostgreSQL schema (``public`` unless the backend is given another one):

* ``dsh_schema``: a single row with the schema ``version`` and a random ``store_id`` (the backend identity that
  prefixes every revision token, so revisions from two databases never compare equal);
* ``dsh_revisions``: a sequence; every change to a session takes a fresh value as its revision, so a revision
  never repeats, not even for a deleted and re-created id;
* ``dsh_sessions``: one row per materialized session (header JSON, inherited cut, ``next_seq``, revision);
* ``dsh_events``: one row per event, keyed by ``(session_id, seq)``, the compact JSON line or its zstd frame.

Creation runs under a transaction-scoped advisory lock, so processes starting together create it once. A schema
newer than this build is refused with :class:`SchemaVersionError`; nothing is ever dropped or altered.
"""

from __future__ import annotations

import uuid

from psycopg import AsyncConnection, sql
from psycopg.rows import TupleRow

from ._core import SessionFormatUnsupportedError

__all__ = ["SCHEMA_VERSION", "SchemaVersionError", "Tables", "ensure_schema"]

#: The schema version this build creates and reads.
SCHEMA_VERSION = 1

# pg_advisory_xact_lock(int, int) key: a constant class ("dsh\0") and the hash of the schema name.
_LOCK_CLASS = 0x64736800


class SchemaVersionError(SessionFormatUnsupportedError):
    """The database holds a dsh schema version this build cannot use (newer, or unknown)."""

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version


class Tables:
    """Quoted names of the backend's objects inside one PostgreSQL schema."""

    def __init__(self, schema: str) -> None:
        if not schema:
            raise ValueError("schema must be a non-empty PostgreSQL schema name")
        self.schema_name = schema
        self.schema = sql.Identifier(schema)
        self.meta = sql.Identifier(schema, "dsh_schema")
        self.sessions = sql.Identifier(schema, "dsh_sessions")
        self.events = sql.Identifier(schema, "dsh_events")
        self.revisions = sql.Identifier(schema, "dsh_revisions")
        # nextval() takes the sequence as a regclass literal.
        self.revisions_literal = sql.Literal(f'"{schema}"."dsh_revisions"')


def _ddl(t: Tables) -> list[sql.Composed]:
    return [
        sql.SQL(
            "CREATE TABLE {meta} ("
            " singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),"
            " version integer NOT NULL,"
            " store_id text NOT NULL)"
        ).format(meta=t.meta),
        sql.SQL("CREATE SEQUENCE {revisions}").format(revisions=t.revisions),
        sql.SQL(
            "CREATE TABLE {sessions} ("
            " id text PRIMARY KEY,"
            " header json NOT NULL,"
            " inherited_event_count bigint NOT NULL CHECK (inherited_event_count >= 0),"
            " next_seq bigint NOT NULL CHECK (next_seq >= 0),"
            " revision bigint NOT NULL,"
            " created_revision bigint NOT NULL)"
        ).format(sessions=t.sessions),
        sql.SQL(
            "CREATE TABLE {events} ("
            " session_id text NOT NULL REFERENCES {sessions} (id) ON DELETE CASCADE,"
            " seq bigint NOT NULL CHECK (seq >= 0),"
            " compressed boolean NOT NULL,"
            " body bytea NOT NULL,"
            " PRIMARY KEY (session_id, seq))"
        ).format(events=t.events, sessions=t.sessions),
    ]


async def ensure_schema(conn: AsyncConnection[TupleRow], t: Tables) -> str:
    """Create the schema if absent, refuse one of another version; return the store id.

    ``conn`` must be in autocommit mode: this runs its own transaction.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_CLASS, t.schema_name))
        cur = await conn.execute("SELECT to_regnamespace(%s) IS NOT NULL", (t.schema_name,))
        row = await cur.fetchone()
        if row is None or not row[0]:
            await conn.execute(sql.SQL("CREATE SCHEMA {}").format(t.schema))
        cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{t.schema_name}"."dsh_schema"',))
        row = await cur.fetchone()
        if row is None or not row[0]:
            for statement in _ddl(t):
                await conn.execute(statement)
            store_id = uuid.uuid4().hex
            await conn.execute(
                sql.SQL("INSERT INTO {meta} (version, store_id) VALUES (%s, %s)").format(meta=t.meta),
                (SCHEMA_VERSION, store_id),
            )
            return store_id
        cur = await conn.execute(sql.SQL("SELECT version, store_id FROM {meta}").format(meta=t.meta))
        found = await cur.fetchone()
    if found is None:
        raise SchemaVersionError(f'dsh schema in "{t.schema_name}" has no version row', 0)
    version, store_id = int(found[0]), str(found[1])
    if version != SCHEMA_VERSION:
        if version > SCHEMA_VERSION:
            message = (
                f'the dsh tables in PostgreSQL schema "{t.schema_name}" use schema v{version}, but this backend '
                f"reads only v{SCHEMA_VERSION}: they were created by a newer dsh-session-persistence-postgres "
                "— upgrade it to open them"
            )
        else:
            message = (
                f'the dsh tables in PostgreSQL schema "{t.schema_name}" use schema v{version}, older than the '
                f"supported v{SCHEMA_VERSION}, and this build ships no upgrade path for it"
            )
        raise SchemaVersionError(message, version)
    return store_id
