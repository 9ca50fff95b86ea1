"""The preparation cache: cold reads kept for a resume that follows a preview (the seed's ``preparations``).

A picker or ``inspect`` reads and validates a stored log; a ``load`` of the same session a moment later would read
and validate it again. The cache keeps the last few validated reads, each with the revision it was read at, and
hands one back only after the backend confirms the stored revision is still that one: a log written since
(by this coordinator or any other writer) is read afresh, never served stale. Bounded in sessions and in events
(a stand-in for memory: a log larger than the event budget is never kept).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["DEFAULT_MAX_CACHED_EVENTS", "PreparationCache"]

T = TypeVar("T")

#: Events kept across every cached read (a 10 MB log holds ~40,000 events).
DEFAULT_MAX_CACHED_EVENTS = 250_000


class PreparationCache(Generic[T]):
    """Session id -> (revision, value), least recently used first out; ``size`` weighs a value in events."""

    def __init__(self, max_sessions: int, size: Callable[[T], int], max_events: int = DEFAULT_MAX_CACHED_EVENTS):
        self.max_sessions = max_sessions
        self.max_events = max_events
        self._size = size
        self._entries: OrderedDict[str, tuple[str, T, int]] = OrderedDict()
        self._events = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def cached_events(self) -> int:
        """Events held by every entry together."""
        return self._events

    def revision_of(self, session_id: str) -> str | None:
        """The revision a cached read of ``session_id`` was taken at, or ``None``."""
        entry = self._entries.get(session_id)
        return None if entry is None else entry[0]

    def take(self, session_id: str, revision: str | None) -> T | None:
        """The cached value if it was read at ``revision`` (the one storage reports now); a stale entry is dropped."""
        entry = self._entries.get(session_id)
        if entry is None:
            return None
        if revision is None or entry[0] != revision:
            self.drop(session_id)
            return None
        self._entries.move_to_end(session_id)
        return entry[1]

    def put(self, session_id: str, revision: str, value: T) -> None:
        """Keep ``value`` read at ``revision``, evicting the least recently used entries over either bound."""
        self.drop(session_id)
        weight = self._size(value)
        if weight > self.max_events:
            return
        self._entries[session_id] = (revision, value, weight)
        self._events += weight
        while len(self._entries) > self.max_sessions or self._events > self.max_events:
            _, (_, _, evicted) = self._entries.popitem(last=False)
            self._events -= evicted

    def drop(self, session_id: str) -> None:
        """Forget ``session_id`` (after this coordinator wrote it, deleted it or handed it to a live Session)."""
        entry = self._entries.pop(session_id, None)
        if entry is not None:
            self._events -= entry[2]
