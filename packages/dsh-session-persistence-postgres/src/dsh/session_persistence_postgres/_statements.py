"""The SQL of every primitive, composed once per schema.

Each write is one statement (data-modifying CTEs), so with the transaction's ``BEGIN``, its timeouts and its
``COMMIT`` sent as one pipeline an append costs one round trip. The compare-and-set on ``next_seq`` happens
under the session row's lock inside that statement: a batch is stored only if the row's ``next_seq`` is the
batch's first seq, so a stale or duplicate writer (including a retry of a write that did in fact commit)
changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from ._schema import Tables

__all__ = ["Statements"]

_EVENTS_FROM_ARRAYS = (
    "unnest(%(seqs)s::bigint[], %(flags)s::boolean[], %(bodies)s::bytea[]) AS u(seq, compressed, body)"
)


@dataclass(frozen=True)
class Statements:
    """Composed statements for one schema's tables."""

    set_timeouts: sql.Composed
    create: sql.Composed
    append: sql.Composed
    head: sql.Composed
    events_from: sql.Composed
    events_between: sql.Composed
    revision: sql.Composed
    snapshots: sql.Composed
    rewrite_row: sql.Composed
    rewrite_delete: sql.Composed
    rewrite_insert: sql.Composed
    settings: sql.Composed

    @classmethod
    def for_tables(cls, t: Tables) -> Statements:
        names = {"sessions": t.sessions, "events": t.events, "rev": t.revisions_literal}

        def q(text: str) -> sql.Composed:
            return sql.SQL(text).format(**names)

        return cls(
            set_timeouts=q(
                "SELECT set_config('lock_timeout', %(lock)s, true),"
                " set_config('statement_timeout', %(statement)s, true)"
            ),
            # First batch: the session row and its events in one statement; an existing id inserts nothing.
            create=q(
                "WITH r AS (SELECT nextval({rev}) AS v), "
                "s AS (INSERT INTO {sessions} (id, header, inherited_event_count, next_seq, revision, created_revision)"
                " SELECT %(id)s, %(header)s::json, %(cut)s, %(n)s, r.v, r.v FROM r"
                " ON CONFLICT (id) DO NOTHING RETURNING id), "
                "e AS (INSERT INTO {events} (session_id, seq, compressed, body)"
                " SELECT s.id, u.seq, u.compressed, u.body FROM s, " + _EVENTS_FROM_ARRAYS + " RETURNING 1) "
                "SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM e)"
            ),
            # Later batches: compare-and-set next_seq (row lock held to commit), then the events.
            append=q(
                "WITH s AS (UPDATE {sessions} SET next_seq = next_seq + %(n)s, revision = nextval({rev})"
                " WHERE id = %(id)s AND next_seq = %(first)s RETURNING id), "
                "e AS (INSERT INTO {events} (session_id, seq, compressed, body)"
                " SELECT s.id, u.seq, u.compressed, u.body FROM s, " + _EVENTS_FROM_ARRAYS + " RETURNING 1) "
                "SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM e),"
                " (SELECT next_seq FROM {sessions} WHERE id = %(id)s)"
            ),
            head=q("SELECT header::text, inherited_event_count, next_seq, revision FROM {sessions} WHERE id = %(id)s"),
            events_from=q(
                "SELECT seq, compressed, body FROM {events} WHERE session_id = %(id)s AND seq >= %(from)s ORDER BY seq"
            ),
            events_between=q(
                "SELECT seq, compressed, body FROM {events}"
                " WHERE session_id = %(id)s AND seq >= %(from)s AND seq < %(to)s ORDER BY seq"
            ),
            revision=q("SELECT revision FROM {sessions} WHERE id = %(id)s"),
            snapshots=q("SELECT id, header::text, revision FROM {sessions} ORDER BY created_revision"),
            rewrite_row=q(
                "UPDATE {sessions} SET next_seq = %(n)s, revision = nextval({rev}) WHERE id = %(id)s RETURNING 1"
            ),
            rewrite_delete=q("DELETE FROM {events} WHERE session_id = %(id)s"),
            rewrite_insert=q(
                "INSERT INTO {events} (session_id, seq, compressed, body)"
                " SELECT %(id)s, u.seq, u.compressed, u.body FROM " + _EVENTS_FROM_ARRAYS
            ),
            settings=q("SELECT current_setting('fsync'), current_setting('synchronous_commit')"),
        )
