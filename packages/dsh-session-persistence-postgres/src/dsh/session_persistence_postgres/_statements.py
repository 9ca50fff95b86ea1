"""The SQL of every primitive, composed once per schema.

Each write is one statement (data-modifying CTEs), so with the transaction's ``BEGIN``, its timeouts and its
``COMMIT`` sent as one message an append costs one round trip. The compare-and-set on ``next_seq`` happens
under the session row's lock inside that statement: a batch is stored only if the row's ``next_seq`` is the
batch's first seq, so a stale or duplicate writer (including a retry of a write that did in fact commit)
changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from ._schema import NOW_MS, Tables

__all__ = ["Statements", "list_page_query"]


_EVENTS_FROM_ARRAYS = (
    "unnest(%(seqs)s::bigint[], %(flags)s::boolean[], %(bodies)s::bytea[], %(key_ids)s::text[],"
    " %(nonces)s::bytea[]) AS u(seq, compressed, body, key_id, nonce)"
)
_EVENT_COLUMNS = "(session_id, seq, compressed, body, key_id, nonce)"
_EVENT_VALUES = "s.id, u.seq, u.compressed, u.body, u.key_id, u.nonce"
# A write to a session is also conditional on its incarnation's seal id (NULL: plaintext): rows are never
# sealed for, or stored into, an incarnation other than the one they were sealed for.
_SAME_SEAL = "seal_id IS NOT DISTINCT FROM %(seal)s::text"


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
    seal: sql.Composed
    snapshots: sql.Composed
    rewrite: sql.Composed
    settings: sql.Composed
    delete: sql.Composed
    append_group: sql.Composed
    heads_of: sql.Composed
    events_of: sql.Composed

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
                "s AS (INSERT INTO {sessions}"
                " (id, header, inherited_event_count, next_seq, revision, created_revision, updated_at, seal_id)"
                " SELECT %(id)s, %(header)s::json, %(cut)s, %(n)s, r.v, r.v, " + NOW_MS + ", %(seal)s::text FROM r"
                " ON CONFLICT (id) DO NOTHING RETURNING id), "
                "e AS (INSERT INTO {events} " + _EVENT_COLUMNS + ""
                " SELECT " + _EVENT_VALUES + " FROM s, " + _EVENTS_FROM_ARRAYS + " RETURNING 1) "
                "SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM e)"
            ),
            # Later batches: compare-and-set next_seq (row lock held to commit), then the events.
            append=q(
                "WITH s AS (UPDATE {sessions} SET next_seq = next_seq + %(n)s, revision = nextval({rev}),"
                " updated_at = " + NOW_MS + ""
                " WHERE id = %(id)s AND next_seq = %(first)s AND " + _SAME_SEAL + " RETURNING id), "
                "e AS (INSERT INTO {events} " + _EVENT_COLUMNS + ""
                " SELECT " + _EVENT_VALUES + " FROM s, " + _EVENTS_FROM_ARRAYS + " RETURNING 1) "
                "SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM e),"
                " (SELECT next_seq FROM {sessions} WHERE id = %(id)s),"
                " (SELECT " + _SAME_SEAL + " FROM {sessions} WHERE id = %(id)s)"
            ),
            head=q(
                "SELECT header::text, inherited_event_count, next_seq, revision, seal_id FROM {sessions}"
                " WHERE id = %(id)s"
            ),
            events_from=q(
                "SELECT seq, compressed, body, key_id, nonce FROM {events}"
                " WHERE session_id = %(id)s AND seq >= %(from)s ORDER BY seq"
            ),
            events_between=q(
                "SELECT seq, compressed, body, key_id, nonce FROM {events}"
                " WHERE session_id = %(id)s AND seq >= %(from)s AND seq < %(to)s ORDER BY seq"
            ),
            revision=q("SELECT revision FROM {sessions} WHERE id = %(id)s"),
            seal=q("SELECT seal_id FROM {sessions} WHERE id = %(id)s"),
            snapshots=q("SELECT id, header::text, revision FROM {sessions} ORDER BY created_revision"),
            # The whole replacement in one statement, all of it conditional on the session row's update (the
            # revision check and the seal id the rows were sealed for): rows past the new end are deleted, the
            # others inserted or overwritten; ``new_seal`` is the incarnation's seal id from now on (a compaction
            # by an encrypting backend seals a plaintext session).
            rewrite=q(
                "WITH s AS (UPDATE {sessions} SET next_seq = %(n)s, revision = nextval({rev}),"
                " updated_at = CASE WHEN %(touch)s THEN " + NOW_MS + " ELSE updated_at END,"
                " seal_id = %(new_seal)s::text"
                " WHERE id = %(id)s AND (%(expected)s::bigint IS NULL OR revision = %(expected)s::bigint)"
                " AND " + _SAME_SEAL + " RETURNING id), "
                "d AS (DELETE FROM {events} WHERE session_id IN (SELECT id FROM s) AND seq >= %(n)s RETURNING 1), "
                "i AS (INSERT INTO {events} " + _EVENT_COLUMNS + ""
                " SELECT " + _EVENT_VALUES + " FROM s, " + _EVENTS_FROM_ARRAYS + ""
                " ON CONFLICT (session_id, seq) DO UPDATE SET compressed = EXCLUDED.compressed, body = EXCLUDED.body,"
                " key_id = EXCLUDED.key_id, nonce = EXCLUDED.nonce"
                " RETURNING 1) "
                "SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM d), (SELECT count(*) FROM i)"
            ),
            # Later batches of many sessions in one statement (the group committer): each session's row is locked
            # in id order (two groups sharing sessions never deadlock), its next_seq compare-and-set against its
            # batch's first seq, and the events inserted only for the sessions whose check held. One row per batch:
            # id, stored, and (read in the statement's snapshot, as for ``append``) next_seq and seal check.
            append_group=q(
                "WITH b AS (SELECT * FROM unnest(%(ids)s::text[], %(firsts)s::bigint[], %(ns)s::bigint[],"
                " %(seals)s::text[]) AS b(id, first, n, seal)), "
                "l AS (SELECT id FROM {sessions} WHERE id = ANY(%(ids)s::text[]) ORDER BY id FOR UPDATE), "
                "s AS (UPDATE {sessions} t SET next_seq = t.next_seq + b.n, revision = nextval({rev}),"
                " updated_at = " + NOW_MS + " FROM b JOIN l ON l.id = b.id"
                " WHERE t.id = b.id AND t.next_seq = b.first"
                " AND t.seal_id IS NOT DISTINCT FROM b.seal RETURNING t.id), "
                "e AS (INSERT INTO {events} " + _EVENT_COLUMNS + ""
                " SELECT u.sid, u.seq, u.compressed, u.body, u.key_id, u.nonce FROM unnest(%(sids)s::text[],"
                " %(seqs)s::bigint[], %(flags)s::boolean[], %(bodies)s::bytea[], %(key_ids)s::text[],"
                " %(nonces)s::bytea[]) AS u(sid, seq, compressed, body, key_id, nonce)"
                " WHERE u.sid IN (SELECT id FROM s) RETURNING 1) "
                "SELECT b.id, b.id IN (SELECT id FROM s), t.next_seq, t.seal_id IS NOT DISTINCT FROM b.seal"
                " FROM b LEFT JOIN {sessions} t ON t.id = b.id"
            ),
            # The read-back of a group: every session's head, and its rows in the range its batch would fill.
            heads_of=q(
                "SELECT id, header::text, inherited_event_count, next_seq, revision, seal_id FROM {sessions}"
                " WHERE id = ANY(%(ids)s::text[])"
            ),
            events_of=q(
                "SELECT e.session_id, e.seq, e.compressed, e.body, e.key_id, e.nonce FROM {events} e"
                " JOIN unnest(%(ids)s::text[], %(froms)s::bigint[], %(tos)s::bigint[]) AS r(id, lo, hi)"
                " ON e.session_id = r.id AND e.seq >= r.lo AND e.seq < r.hi ORDER BY e.session_id, e.seq"
            ),
            settings=q("SELECT current_setting('fsync'), current_setting('synchronous_commit')"),
            delete=q(
                "DELETE FROM {sessions} WHERE id = %(id)s"
                " AND (%(expected)s::bigint IS NULL OR revision = %(expected)s::bigint) RETURNING 1"
            ),
        )


def list_page_query(
    t: Tables,
    order: str,
    after: tuple[int, str] | None,
    cwd: str | None,
    parent: str | None,
    since: int | None,
    limit: int | None,
) -> tuple[sql.Composed, dict[str, object]]:
    """One page in ``order`` (newest first, ties by ascending id) after a keyset position: an index scan."""
    key = sql.SQL("updated_at" if order == "recent" else "((header->>'createdAt')::bigint)")
    where: list[sql.Composable] = [sql.SQL("true")]
    params: dict[str, object] = {}
    if after is not None:
        where.append(sql.SQL("({key} < %(k)s OR ({key} = %(k)s AND id > %(after)s))").format(key=key))
        params.update(k=after[0], after=after[1])
    if cwd is not None:
        where.append(sql.SQL("header->>'cwd' = %(cwd)s"))
        params["cwd"] = cwd
    if parent is not None:
        where.append(sql.SQL("header->>'parentSession' = %(parent)s"))
        params["parent"] = parent
    if since is not None:
        where.append(sql.SQL("updated_at >= %(since)s"))
        params["since"] = since
    query = sql.SQL(
        "SELECT id, header::text, revision, updated_at FROM {sessions} WHERE {where} ORDER BY {key} DESC, id"
    ).format(sessions=t.sessions, where=sql.SQL(" AND ").join(where), key=key)
    if limit is not None:
        # A literal, not a parameter: with the limit known the planner walks the index and stops early.
        query = sql.SQL("{} LIMIT {}").format(query, sql.Literal(int(limit)))
    return query, params
