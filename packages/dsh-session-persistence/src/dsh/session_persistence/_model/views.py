"""Immutable results of the persistence service's body reads (coordinator.md §1.1).

Every body-bearing read returns the header *and* the exact inherited cut beside it, so a consumer never has to
recompute the cut from a ``session/end-seed`` marker. Events are frozen structs in an immutable sequence (a tuple,
or a :class:`~dsh.session_persistence.backend.StoredEvents` whose packed chunk runs expand where a reader asks for
them); a view may be shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .events import SessionEvent
from .header import SessionHeader

__all__ = ["SessionEventSuffix", "SessionInspection"]


@dataclass(frozen=True, slots=True)
class SessionInspection:
    """A logical view of one session: header, inherited cut and the events (returned by ``load``/``inspect``)."""

    meta: SessionHeader
    inherited_event_count: int
    events: Sequence[SessionEvent]


@dataclass(frozen=True, slots=True)
class SessionEventSuffix:
    """A detached physical suffix (``read_from``): the events with ``seq >= from_seq``, nothing repaired.

    ``inherited_event_count`` is the unchanged cut: a consumer skipping parent-owned events starts at
    ``max(from_seq, inherited_event_count)``.
    """

    meta: SessionHeader
    inherited_event_count: int
    from_seq: int
    events: tuple[SessionEvent, ...]
