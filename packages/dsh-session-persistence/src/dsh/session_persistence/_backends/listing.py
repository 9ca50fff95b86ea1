"""Paged, filtered listing: the query a backend answers, the rows it returns, and the opaque page cursor.

A backend that implements the optional ``list_page(query)`` primitive returns at most ``query.limit`` rows in
the query's order, after ``query.after`` (a keyset position), matching the query's filters. The coordinator
asks for one row more than the caller's limit to learn whether a next page exists, and owns the cursor: a
cursor is an opaque string bound to the backend's ``cursor_scope`` (one storage root or database), the order
and the filters it was made for, so a cursor replayed against another root or another query is refused with
:class:`~dsh.session_persistence.SessionCursorError` instead of silently listing the wrong sessions.

Orders (both newest first, ties broken by ascending id so the order is total):

* ``"recent"``: by last durable activity (``updated_at``, milliseconds since the epoch);
* ``"created"``: by the header's ``createdAt``.

A session written to between two pages may move in the ``"recent"`` order; keyset paging never repeats a row
whose key did not change, and never skips one that did not move.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from .._model.errors import LifecycleArgumentError, SessionCursorError
from .._model.header import SessionHeader
from .._model.jsonvalue import is_safe_int

__all__ = [
    "LIST_ORDERS",
    "ListOrder",
    "ListPosition",
    "ListQuery",
    "SessionListing",
    "SessionPage",
    "SupportsListPage",
    "decode_list_cursor",
    "encode_list_cursor",
    "make_list_query",
    "page_of",
]

ListOrder = Literal["recent", "created"]
LIST_ORDERS: tuple[ListOrder, ...] = ("recent", "created")
_CURSOR_VERSION = 1


@dataclass(frozen=True, slots=True)
class SessionListing:
    """One listed session: its header, its last durable activity and its current revision.

    ``updated_at`` is milliseconds since the epoch of the last durable write the backend can vouch for (for
    files, the modification time); ``revision`` is the opaque token ``read_stored_revision`` would return.
    """

    header: SessionHeader
    updated_at: int
    revision: str

    @property
    def id(self) -> str:
        return self.header.id


@dataclass(frozen=True, slots=True)
class ListPosition:
    """A keyset position: the sort key and the id of the last row of the previous page."""

    key: int
    session_id: str


@dataclass(frozen=True, slots=True)
class ListQuery:
    """What one ``list_page`` call asks a backend for (built and validated by :func:`make_list_query`).

    ``cwd`` matches the header's cwd exactly, ``parent`` its ``parentSession``, ``since`` keeps rows whose
    ``updated_at`` is at or after it (milliseconds since the epoch). ``limit`` ``None`` means every row.
    """

    limit: int | None = None
    after: ListPosition | None = None
    order: ListOrder = "recent"
    cwd: str | None = None
    parent: str | None = None
    since: int | None = None

    def sort_key(self, row: SessionListing) -> int:
        """The row's key in this query's order (larger keys come first)."""
        return row.updated_at if self.order == "recent" else row.header.created_at

    def order_key(self, row: SessionListing) -> tuple[int, str]:
        """Ascending sort key giving this query's order: ``sorted(rows, key=query.order_key)``."""
        return (-self.sort_key(row), row.header.id)

    def follows(self, row: SessionListing) -> bool:
        """Whether ``row`` comes strictly after the query's keyset position (always true without one)."""
        after = self.after
        if after is None:
            return True
        key = self.sort_key(row)
        return key < after.key or (key == after.key and row.header.id > after.session_id)

    def matches_header(self, header: SessionHeader) -> bool:
        """The header filters (cwd, parent), which need the header."""
        if self.cwd is not None and header.cwd != self.cwd:
            return False
        return not (self.parent is not None and header.parent_session != self.parent)

    def matches(self, row: SessionListing) -> bool:
        """Every filter and the keyset position."""
        if self.since is not None and row.updated_at < self.since:
            return False
        return self.matches_header(row.header) and self.follows(row)

    def filter_digest(self) -> str:
        """A short digest of the order and filters, which a cursor carries (the limit may change per page)."""
        blob = json.dumps([self.order, self.cwd, self.parent, self.since], separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class SessionPage:
    """One page of a listing: rows in the query's order and the cursor of the next page (``None`` at the end)."""

    entries: tuple[SessionListing, ...]
    next_cursor: str | None

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def headers(self) -> list[SessionHeader]:
        return [row.header for row in self.entries]


def page_of(rows: Iterable[SessionListing], query: ListQuery) -> list[SessionListing]:
    """Answer ``query`` over every row, in memory: filter, sort, cut at the limit (for simple backends)."""
    kept = sorted((row for row in rows if query.matches(row)), key=query.order_key)
    return kept if query.limit is None else kept[: query.limit]


def _since_ms(since: datetime | int | None) -> int | None:
    if since is None:
        return None
    if isinstance(since, datetime):
        if since.tzinfo is None:
            raise LifecycleArgumentError("since must be a timezone-aware datetime (or milliseconds since the epoch)")
        return int(since.timestamp() * 1000)
    if not is_safe_int(since) or isinstance(since, bool):
        raise LifecycleArgumentError(f"since must be a datetime or an integer of milliseconds, got {since!r}")
    return since


def make_list_query(
    *,
    limit: int | None = None,
    order: str = "recent",
    cwd: str | os.PathLike[str] | None = None,
    parent: str | None = None,
    since: datetime | int | None = None,
) -> ListQuery:
    """Validate listing arguments into a :class:`ListQuery` (no position yet); bad input raises a typed error."""
    if limit is not None and (type(limit) is not int or limit < 1):
        raise LifecycleArgumentError(f"limit must be a positive integer or None, got {limit!r}")
    if order not in LIST_ORDERS:
        raise LifecycleArgumentError(f'order must be "recent" or "created", got {order!r}')
    cwd_text = None if cwd is None else os.fspath(cwd)
    if cwd_text is not None and (not isinstance(cwd_text, str) or not os.path.isabs(cwd_text)):
        raise LifecycleArgumentError(f"cwd filter must be an absolute path, got {cwd_text!r}")
    if parent is not None and (type(parent) is not str or not parent):
        raise LifecycleArgumentError(f"parent filter must be a non-empty session id, got {parent!r}")
    return ListQuery(limit=limit, order=order, cwd=cwd_text, parent=parent, since=_since_ms(since))


def encode_list_cursor(scope: str, query: ListQuery, last: SessionListing) -> str:
    """The opaque cursor of the page after ``last``: bound to ``scope``, the order and the filters."""
    body = {
        "v": _CURSOR_VERSION,
        "s": hashlib.sha256(scope.encode()).hexdigest()[:16],
        "q": query.filter_digest(),
        "k": query.sort_key(last),
        "i": last.header.id,
    }
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_list_cursor(cursor: str, scope: str, query: ListQuery) -> ListPosition:
    """The keyset position inside ``cursor``; refuses a malformed cursor and one made for another root or query."""
    if type(cursor) is not str or not cursor:
        raise SessionCursorError("cursor must be a non-empty string from a previous page")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        body = json.loads(raw)
    except (binascii.Error, ValueError) as exc:
        raise SessionCursorError("cursor is not a listing cursor (malformed)") from exc
    if (
        type(body) is not dict
        or body.get("v") != _CURSOR_VERSION
        or not is_safe_int(body.get("k"))
        or type(body.get("i")) is not str
        or type(body.get("s")) is not str
        or type(body.get("q")) is not str
    ):
        raise SessionCursorError("cursor is not a listing cursor (malformed)")
    if body["s"] != hashlib.sha256(scope.encode()).hexdigest()[:16]:
        raise SessionCursorError("cursor belongs to another storage root; list again without a cursor")
    if body["q"] != query.filter_digest():
        raise SessionCursorError("cursor was made for another order or other filters; list again without a cursor")
    return ListPosition(key=body["k"], session_id=body["i"])


@runtime_checkable
class SupportsListPage(Protocol):
    """A backend that answers paged, ordered, filtered listings without loading every log.

    ``cursor_scope`` names the storage the cursors belong to (for files, the root; for a database, the
    database and schema): the coordinator binds every cursor to it, so a cursor from another root is refused.
    """

    @property
    def cursor_scope(self) -> str:
        """A stable string identifying this storage (never shown to users; only hashed into cursors)."""
        ...

    async def list_page(self, query: ListQuery) -> builtins.list[SessionListing]:
        """At most ``query.limit`` rows (all if ``None``) that satisfy ``query.matches``, in ``query.order_key`` order.

        The first page of a large store must not cost a read of every log or every header where the storage
        can order by activity cheaply (file modification times, an index). Unreadable headers are left out,
        as ``list`` leaves them out; ``verify`` is the tool that reports them.
        """
        ...
