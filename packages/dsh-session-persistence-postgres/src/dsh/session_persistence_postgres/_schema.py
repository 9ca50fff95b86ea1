"""The database schema: created and versioned by the backend itself.

Four objects live in one PostgreSQL schema (``public`` unless the backend is given another one):

* ``dsh_schema``: a single row with the schema ``version`` and a random ``store_id`` (the backend identity that
  prefixes every revision token, so revisions from two databases never compare equal);
* ``dsh_revisions``: a sequence; every change to a session takes a fresh value as its revision, so a revision
  never repeats, not even for a deleted and re-created id;
* ``dsh_sessions``: one row per materialized session (header JSON, inherited cut, ``next_seq``, revision,
  ``updated_at`` in ms), indexed for ``list`` (creation order) and ``list_page`` (recent, created);
* ``dsh_events``: one row per event, keyed by ``(session_id, seq)``, the compact JSON line or its zstd frame
  (sealed, with its ``key_id`` and ``nonce``, in a sealed session: see :mod:`._sealing`).

Schema v1 is a plaintext store; v2 a store an encrypting backend has opened (``encryption=``), which may hold
sealed sessions. This build reads both; it bumps v1 to v2 when an encrypting backend starts, so a 0.1/0.2
reader (which reads only v1) refuses the store instead of decoding ciphertext as JSON. The sealing columns
(``dsh_sessions.seal_id``, ``dsh_events.key_id``, ``dsh_events.nonce``: nullable, so adding them is a catalog
change) are added to every store this build opens, v1 included: a 0.1 or 0.2 writer never names them, so they
stay ``NULL`` (plaintext) for its rows, and the store stays v1 until it may hold ciphertext.

Creation runs under a transaction-scoped advisory lock, so processes starting together create it once. A schema
newer than this build is refused with :class:`SchemaVersionError`; nothing is ever dropped. A store created by 0.1
(same schema version) is upgraded in place at the first start: ``updated_at``, the listing indexes and two
activity triggers are added, and every session whose last activity is unknown is stamped with the upgrade's time.

The triggers keep ``updated_at`` true for writers that do not set it (a 0.1 process still appending to an upgraded
store): an insert that leaves it 0 and an update that moves ``next_seq`` without setting it get the server's
clock. Without them a live session written by a 0.1 writer would list as ancient, and ``prune`` would delete it.
"""

from __future__ import annotations

import uuid

from psycopg import Connection, sql
from psycopg.rows import TupleRow

from ._errors import PostgresConfigurationError, SchemaVersionError
from ._limits import MAX_IDENTIFIER_BYTES, SCHEMA_VERSION, SEALED_SCHEMA_VERSION

__all__ = [
    "MAX_IDENTIFIER_BYTES",
    "NOW_MS",
    "SCHEMA_VERSION",
    "SEALED_SCHEMA_VERSION",
    "Tables",
    "ensure_schema",
    "quote_identifier",
]

# pg_advisory_xact_lock(int, int) key: a constant class ("dsh\0") and the hash of the schema name.
_LOCK_CLASS = 0x64736800

_Conn = Connection[TupleRow]

#: The triggers that stamp activity a writer did not record (a 0.1 writer), by name.
INSERT_TRIGGER = "dsh_sessions_insert_activity"
UPDATE_TRIGGER = "dsh_sessions_update_activity"

#: Milliseconds since the epoch of the statement's start: the server's clock, one clock for every writer.
NOW_MS = "(extract(epoch FROM statement_timestamp()) * 1000)::bigint"


def quote_identifier(name: str) -> str:
    """``name`` as a PostgreSQL quoted identifier: in double quotes, inner double quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def _check_schema_name(schema: str) -> None:
    if not schema:
        raise PostgresConfigurationError("schema must be a non-empty PostgreSQL schema name")
    if "\0" in schema:
        raise PostgresConfigurationError(f"schema name {schema!r} contains a NUL character")
    size = len(schema.encode())
    if size > MAX_IDENTIFIER_BYTES:
        # PostgreSQL would silently truncate it, and two long names sharing a prefix would share one store.
        raise PostgresConfigurationError(
            f"schema name {schema!r} is {size} bytes long; PostgreSQL keeps only the first {MAX_IDENTIFIER_BYTES}, "
            "so it is refused rather than silently truncated"
        )


class Tables:
    """Quoted names of the backend's objects inside one PostgreSQL schema (any name PostgreSQL keeps as is)."""

    def __init__(self, schema: str) -> None:
        _check_schema_name(schema)
        self.schema_name = schema
        self.schema = sql.Identifier(schema)
        self.meta = sql.Identifier(schema, "dsh_schema")
        self.sessions = sql.Identifier(schema, "dsh_sessions")
        self.events = sql.Identifier(schema, "dsh_events")
        self.revisions = sql.Identifier(schema, "dsh_revisions")
        self.created_index = sql.Identifier("dsh_sessions_created")
        self.recent_index = sql.Identifier("dsh_sessions_recent")
        self.created_at_index = sql.Identifier("dsh_sessions_created_at")
        self.touch_function = sql.Identifier(schema, "dsh_touch_activity")
        self.insert_trigger = sql.Identifier(INSERT_TRIGGER)
        self.update_trigger = sql.Identifier(UPDATE_TRIGGER)
        # nextval() takes the sequence as a regclass literal: the quoted, qualified name as text.
        self.revisions_literal = sql.Literal(f"{quote_identifier(schema)}.{quote_identifier('dsh_revisions')}")


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
            " created_revision bigint NOT NULL,"
            " updated_at bigint NOT NULL DEFAULT 0)"
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


def _index_ddl(t: Tables) -> list[sql.Composed]:
    """The listing column and indexes; additive, so stores created by 0.1 get them at start (same version)."""
    return [
        sql.SQL("ALTER TABLE {sessions} ADD COLUMN IF NOT EXISTS updated_at bigint NOT NULL DEFAULT 0").format(
            sessions=t.sessions
        ),
        sql.SQL("CREATE INDEX IF NOT EXISTS {name} ON {sessions} (created_revision)").format(
            name=t.created_index, sessions=t.sessions
        ),
        sql.SQL("CREATE INDEX IF NOT EXISTS {name} ON {sessions} (updated_at DESC, id)").format(
            name=t.recent_index, sessions=t.sessions
        ),
        sql.SQL("CREATE INDEX IF NOT EXISTS {name} ON {sessions} (((header->>'createdAt')::bigint) DESC, id)").format(
            name=t.created_at_index, sessions=t.sessions
        ),
    ]


def _sealing_ddl(t: Tables) -> list[sql.Composed]:
    """The sealing columns (nullable, no default: catalog-only changes, no table rewrite)."""
    return [
        sql.SQL("ALTER TABLE {sessions} ADD COLUMN IF NOT EXISTS seal_id text").format(sessions=t.sessions),
        sql.SQL("ALTER TABLE {events} ADD COLUMN IF NOT EXISTS key_id text").format(events=t.events),
        sql.SQL("ALTER TABLE {events} ADD COLUMN IF NOT EXISTS nonce bytea").format(events=t.events),
    ]


def _activity_ddl(t: Tables) -> list[sql.Composed]:
    """The activity triggers, then the unknown activity of existing rows stamped with now (never "long ago").

    The insert trigger covers a writer that leaves the column to its default (0); the update trigger a writer
    that moves ``next_seq`` (an append, a truncation) without touching ``updated_at``. The backend's own writes
    always set it, and a compaction keeps ``next_seq``, so neither trigger changes what they record.
    """
    return [
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN NEW.updated_at := " + NOW_MS + "; RETURN NEW; END$$"
        ).format(fn=t.touch_function),
        sql.SQL(
            "CREATE TRIGGER {name} BEFORE INSERT ON {sessions} FOR EACH ROW WHEN (NEW.updated_at = 0)"
            " EXECUTE FUNCTION {fn}()"
        ).format(name=t.insert_trigger, sessions=t.sessions, fn=t.touch_function),
        sql.SQL(
            "CREATE TRIGGER {name} BEFORE UPDATE ON {sessions} FOR EACH ROW"
            " WHEN (NEW.next_seq IS DISTINCT FROM OLD.next_seq AND NEW.updated_at = OLD.updated_at)"
            " EXECUTE FUNCTION {fn}()"
        ).format(name=t.update_trigger, sessions=t.sessions, fn=t.touch_function),
        # Rows a writer never stamped (0.1's, or 0.2's upgrade of them): their last activity was at the latest now.
        sql.SQL("UPDATE {sessions} SET updated_at = " + NOW_MS + " WHERE updated_at = 0").format(sessions=t.sessions),
    ]


def _exists(conn: _Conn, query: str, *params: str) -> bool:
    row = conn.execute(query, params).fetchone()
    return row is not None and bool(row[0])


def _relation_exists(conn: _Conn, schema: str, name: str) -> bool:
    # Exact names from the catalog: never a text -> regclass parse, which would fold or mangle the case.
    return _exists(
        conn,
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s)",
        schema,
        name,
    )


def _trigger_exists(conn: _Conn, schema: str, name: str) -> bool:
    return _exists(
        conn,
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger tg JOIN pg_catalog.pg_class c ON c.oid = tg.tgrelid"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = 'dsh_sessions' AND tg.tgname = %s)",
        schema,
        name,
    )


def _column_exists(conn: _Conn, schema: str, table: str, column: str) -> bool:
    return _exists(
        conn,
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s AND a.attname = %s AND NOT a.attisdropped)",
        schema,
        table,
        column,
    )


def ensure_schema(conn: _Conn, t: Tables, sealing: bool = False) -> tuple[str, int]:
    """Create the schema if absent, refuse one of another version; return the store id and the schema version.

    ``sealing`` (a backend given keys): the store is made v2 (:data:`SEALED_SCHEMA_VERSION`) before anything
    sealed is written to it. ``conn`` must be idle: this runs its own transaction.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_CLASS, t.schema_name))
        if not _exists(conn, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s)", t.schema_name):
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(t.schema))
        if not _relation_exists(conn, t.schema_name, "dsh_schema"):
            for statement in [*_ddl(t), *_index_ddl(t), *_activity_ddl(t), *_sealing_ddl(t)]:
                conn.execute(statement)
            store_id = uuid.uuid4().hex
            conn.execute(
                sql.SQL("INSERT INTO {meta} (version, store_id) VALUES (%s, %s)").format(meta=t.meta),
                (SEALED_SCHEMA_VERSION if sealing else SCHEMA_VERSION, store_id),
            )
            return store_id, SEALED_SCHEMA_VERSION if sealing else SCHEMA_VERSION
        found = conn.execute(sql.SQL("SELECT version, store_id FROM {meta}").format(meta=t.meta)).fetchone()
        if found is not None and int(found[0]) in (SCHEMA_VERSION, SEALED_SCHEMA_VERSION):
            if not _trigger_exists(conn, t.schema_name, UPDATE_TRIGGER):
                # A store created by 0.1 (or upgraded by 0.2, which added only the column and indexes).
                for statement in [*_index_ddl(t), *_activity_ddl(t)]:
                    conn.execute(statement)
            if not _column_exists(conn, t.schema_name, "dsh_events", "nonce"):
                for statement in _sealing_ddl(t):  # a store 0.1 or 0.2 created
                    conn.execute(statement)
            if sealing and int(found[0]) == SCHEMA_VERSION:
                conn.execute(sql.SQL("UPDATE {meta} SET version = %s").format(meta=t.meta), (SEALED_SCHEMA_VERSION,))
                found = (SEALED_SCHEMA_VERSION, found[1])
    if found is None:
        raise SchemaVersionError(f'dsh schema in "{t.schema_name}" has no version row', 0)
    version, store_id = int(found[0]), str(found[1])
    if version not in (SCHEMA_VERSION, SEALED_SCHEMA_VERSION):
        if version > SEALED_SCHEMA_VERSION:
            message = (
                f'the dsh tables in PostgreSQL schema "{t.schema_name}" use schema v{version}, but this backend '
                f"reads only v{SCHEMA_VERSION} and v{SEALED_SCHEMA_VERSION}: they were created by a newer "
                "dsh-session-persistence-postgres — upgrade it to open them"
            )
        else:
            message = (
                f'the dsh tables in PostgreSQL schema "{t.schema_name}" use schema v{version}, older than the '
                f"supported v{SCHEMA_VERSION}, and this build ships no upgrade path for it"
            )
        raise SchemaVersionError(message, version)
    return store_id, version
