"""The log's latest event of one type, found by looking only at what was appended since the last look.

The loop asks at every turn (the last ``turn/start``) and every step (the ``request/context`` in force). Walking
the log back from its end each time, or taking :attr:`Session.events` (a snapshot of the whole log after every
append), made each turn cost time in proportion to the whole session: quadratic over a long one.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from .._model.events import SessionEvent

__all__ = ["LatestOfType"]

E = TypeVar("E", bound=SessionEvent)


class _Log(Protocol):
    """What a look needs of a live ``Session`` (typed structurally: the loop's layers stay above the host's)."""

    def __len__(self) -> int: ...

    def events_from(self, start: int) -> tuple[SessionEvent, ...]: ...


class LatestOfType(Generic[E]):
    """The latest event of type ``kind`` in a session's log, remembered with how far the log was scanned and the
    last event scanned (so a log cut and refilled to the same length is noticed and scanned again)."""

    __slots__ = ("_found", "_kind", "_last", "_scanned")

    def __init__(self, kind: type[E]) -> None:
        self._kind = kind
        self._found: E | None = None
        self._scanned = 0
        self._last: object = None

    def find(self, session: _Log) -> E | None:
        count = len(session)
        scanned = self._scanned
        # The tail from the last event scanned on: its first event shows whether the scanned prefix still stands.
        tail = session.events_from(scanned - 1) if 0 < scanned <= count else ()
        if tail and tail[0] is self._last:
            found, fresh = self._found, tail[1:]
        else:
            found, tail = None, session.events_from(0)
            fresh = tail
        kind = self._kind
        for event in reversed(fresh):
            if type(event) is kind:
                found = event
                break
        if tail:
            self._found, self._scanned, self._last = found, count, tail[-1]
        return found
