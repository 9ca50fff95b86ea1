"""A store created by 0.1, upgraded by this backend while a 0.1 writer keeps appending to it: activity is never
reported as old, so ``list_page(order="recent")``, ``since=`` and ``prune`` never treat a live session as ancient.

The 0.1 store and writer are reproduced statement for statement from the 0.1.0 release (the commit
``tools/releases.toml`` records); :func:`test_the_reproduction_is_the_released_code` checks each statement
against that commit's source when the repository's history is at hand.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path

import anyio
import anyio.to_thread
import msgspec
import psycopg
import pytest
import tomllib
from dsh.session_persistence import Host, PersistenceCoordinator
from dsh.session_persistence.backend import ListQuery, SessionHeader, encode_event, header_to_builtins
from dsh.session_persistence.testing import one_turn_log, simple_turn
from dsh.session_persistence_postgres import PostgresBackend

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[3]

# 0.1.0's _schema._ddl and ensure_schema, for schema {s}.
DDL_01 = [
    'CREATE SCHEMA "{s}"',
    'CREATE TABLE "{s}".dsh_schema ( singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),'
    " version integer NOT NULL, store_id text NOT NULL)",
    'CREATE SEQUENCE "{s}".dsh_revisions',
    'CREATE TABLE "{s}".dsh_sessions ( id text PRIMARY KEY, header json NOT NULL,'
    " inherited_event_count bigint NOT NULL CHECK (inherited_event_count >= 0),"
    " next_seq bigint NOT NULL CHECK (next_seq >= 0), revision bigint NOT NULL, created_revision bigint NOT NULL)",
    'CREATE TABLE "{s}".dsh_events ( session_id text NOT NULL REFERENCES "{s}".dsh_sessions (id) ON DELETE CASCADE,'
    " seq bigint NOT NULL CHECK (seq >= 0), compressed boolean NOT NULL, body bytea NOT NULL,"
    " PRIMARY KEY (session_id, seq))",
    "INSERT INTO \"{s}\".dsh_schema (version, store_id) VALUES (1, '0123456789abcdef0123456789abcdef')",
]
# 0.1.0's _insert_session (the first batch) and _advance (each later batch), then its event rows.
INSERT_01 = (
    'WITH r AS (SELECT nextval(\'"{s}"."dsh_revisions"\') AS v) '
    'INSERT INTO "{s}".dsh_sessions (id, header, inherited_event_count, next_seq, revision, created_revision) '
    "SELECT %s, %s::json, %s, %s, r.v, r.v FROM r ON CONFLICT (id) DO NOTHING RETURNING id"
)
ADVANCE_01 = (
    'UPDATE "{s}".dsh_sessions SET next_seq = next_seq + %s, revision = nextval(\'"{s}"."dsh_revisions"\') '
    "WHERE id = %s AND next_seq = %s RETURNING next_seq"
)
EVENTS_01 = 'INSERT INTO "{s}".dsh_events (session_id, seq, compressed, body) VALUES (%s, %s, false, %s)'


class Writer01:
    """Appends as a 0.1 process does: one transaction per batch, never touching ``updated_at`` (0.1 sent the event
    rows with ``COPY``; plain inserts store the same rows)."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.conn = psycopg.connect(dsn)
        self.schema = schema

    def q(self, text: str) -> bytes:
        return text.replace("{s}", self.schema).encode()

    def create(self, meta: SessionHeader, events: list[object]) -> None:
        header = msgspec.json.encode(header_to_builtins(meta)).decode()
        with self.conn.transaction():
            assert self.conn.execute(self.q(INSERT_01), (meta.id, header, 0, len(events))).fetchone() is not None
            self._rows(meta.id, events)

    def append(self, session_id: str, events: list[object]) -> None:
        first = events[0].seq  # type: ignore[attr-defined]
        with self.conn.transaction():
            assert self.conn.execute(self.q(ADVANCE_01), (len(events), session_id, first)).fetchone() is not None
            self._rows(session_id, events)

    def _rows(self, session_id: str, events: list[object]) -> None:
        for event in events:
            self.conn.execute(self.q(EVENTS_01), (session_id, event.seq, encode_event(event)))  # type: ignore[attr-defined]

    def close(self) -> None:
        self.conn.close()


def _store_01(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        for statement in DDL_01:
            conn.execute(statement.replace("{s}", schema).encode())


def _header(session_id: str) -> SessionHeader:
    # createdAt long ago: a session resumed for weeks, still being written.
    return SessionHeader(id=session_id, created_at=1_600_000_000_000, cwd="/upgrade")


def test_the_reproduction_is_the_released_code() -> None:
    record = tomllib.loads((REPO / "tools" / "releases.toml").read_text())
    commit = next(
        r["commit"]
        for r in record["release"]
        if r["distribution"] == "dsh-session-persistence-postgres" and r["version"] == "0.1.0"
    )
    base = "packages/dsh-session-persistence-postgres/src/dsh/session_persistence_postgres"
    try:
        sources = " ".join(
            subprocess.run(
                ["git", "-C", str(REPO), "show", f"{commit}:{base}/{name}"], check=True, capture_output=True, text=True
            ).stdout
            for name in ("_schema.py", "_backend.py")
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"the 0.1.0 commit {commit[:12]} is not in this checkout's history")
    released = re.sub(r'"\s*\n\s*"', "", sources)  # join Python's implicitly concatenated string literals
    columns = "id text PRIMARY KEY, header json NOT NULL, inherited_event_count bigint NOT NULL"
    for fragment in (
        columns,
        "next_seq bigint NOT NULL CHECK (next_seq >= 0), revision bigint NOT NULL, created_revision bigint NOT NULL)",
        "INSERT INTO {sessions} (id, header, inherited_event_count, next_seq, revision, created_revision) ",
        "SELECT %s, %s::json, %s, %s, r.v, r.v FROM r ON CONFLICT (id) DO NOTHING RETURNING id",
        "UPDATE {sessions} SET next_seq = next_seq + %s, revision = nextval({rev}) ",
        "WHERE id = %s AND next_seq = %s RETURNING next_seq",
        "COPY {events} (session_id, seq, compressed, body) FROM STDIN",
    ):
        assert fragment in released, fragment
    assert "updated_at" not in released  # 0.1 never wrote the column


async def test_a_session_a_01_writer_appends_to_is_never_pruned(postgres_dsn: str) -> None:
    schema = f"up01_{uuid.uuid4().hex[:10]}"
    await anyio.to_thread.run_sync(_store_01, postgres_dsn, schema)
    old = await anyio.to_thread.run_sync(Writer01, postgres_dsn, schema)
    try:
        # Written by 0.1 before the upgrade: its last activity is unknown to the upgraded store ("idle" is never
        # written again, so only the upgrade can date it: at the latest, the upgrade's time).
        await anyio.to_thread.run_sync(old.create, _header("before"), one_turn_log())
        await anyio.to_thread.run_sync(old.create, _header("idle"), one_turn_log())
        backend = PostgresBackend(postgres_dsn, schema=schema)
        try:
            await backend.list()  # the upgrade runs at this first start
            # Written by the 0.1 process still running beside the upgraded backend: a new session, then appends.
            await anyio.to_thread.run_sync(old.create, _header("live"), one_turn_log())
            for n in range(4):
                await anyio.to_thread.run_sync(old.append, "live", simple_turn(6 + 3 * n, n + 2))
                await anyio.to_thread.run_sync(old.append, "before", simple_turn(6 + 3 * n, n + 2))
            # prune(older_than=30 days) through the coordinator, as a user runs it: nothing is that old.
            async with PersistenceCoordinator(Host(), PostgresBackend(postgres_dsn, schema=schema)) as persistence:
                await persistence.prune(older_than=timedelta(days=30), dry_run=False)
                assert sorted(h.id for h in await persistence.list()) == ["before", "idle", "live"]
                loaded = await persistence.load("live")
                assert len(loaded.events) == 6 + 3 * 4
            page = await backend.list_page(ListQuery(order="recent"))
            now_ms = await anyio.to_thread.run_sync(_server_now_ms, postgres_dsn)
            day = 86_400_000
            assert {row.header.id for row in page} == {"before", "idle", "live"}
            assert all(row.updated_at > now_ms - day for row in page), page
            assert len(await backend.list_page(ListQuery(since=now_ms - day))) == 3
        finally:
            await backend.aclose()
    finally:
        await anyio.to_thread.run_sync(old.close)


def _server_now_ms(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(b"SELECT (extract(epoch FROM statement_timestamp()) * 1000)::bigint").fetchone()
    assert row is not None
    return int(row[0])
