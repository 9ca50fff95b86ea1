"""Fork boundaries: which prefix of a session a child may inherit, by event seq or by turn number."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .._model.errors import SessionPersistenceError
from .._model.events import SessionEvent, TurnEnd, TurnStart
from .._model.jsonvalue import is_safe_int

__all__ = ["SessionForkError", "fork_seed", "turn_boundary"]


class SessionForkError(SessionPersistenceError, ValueError):
    """A fork request that cannot be honoured; ``code`` is one of ``SESSION_ALREADY_EXISTS``,
    ``SESSION_NOT_FOUND``, ``SESSION_NOT_LIVE``, ``INVALID_BOUNDARY``, ``OPEN_TURN``.

    A :class:`SessionPersistenceError` like every error of the library; still a ``ValueError`` (what it was first),
    so ``except ValueError`` keeps catching it."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class ForkSource(Protocol):
    """What a fork reads of its source: the id and the events (a live Session or a detached view)."""

    @property
    def id(self) -> str: ...

    @property
    def events(self) -> Sequence[SessionEvent]: ...


def fork_seed(source: ForkSource, boundary: int | None) -> list[SessionEvent]:
    """The inherited prefix ``events[0..boundary]``; the boundary must not end inside an open turn."""
    events = source.events
    sid = source.id
    if boundary is None:
        if not events:
            return []
        boundary = len(events) - 1
    if not is_safe_int(boundary) or boundary < 0:
        raise SessionForkError(
            f'fork boundary for session "{sid}" must be a non-negative safe integer, got {boundary!r}',
            "INVALID_BOUNDARY",
        )
    if boundary >= len(events):
        last = len(events) - 1 if events else "none"
        raise SessionForkError(
            f'fork boundary {boundary} does not exist in session "{sid}" (last seq: {last})',
            "INVALID_BOUNDARY",
        )
    if events[boundary].seq != boundary:
        raise SessionForkError(
            f'fork boundary {boundary} does not match a contiguous event seq in session "{sid}"',
            "INVALID_BOUNDARY",
        )
    for event in reversed(events[: boundary + 1]):
        if type(event) is TurnEnd:
            break
        if type(event) is TurnStart:
            raise SessionForkError(
                f'fork boundary {boundary} in session "{sid}" ends inside open turn {event.data.turn}',
                "OPEN_TURN",
            )
    return list(events[: boundary + 1])


def turn_boundary(session_id: str, events: Sequence[SessionEvent], turn: int) -> int:
    """The seq of the ``turn/end`` that closes turn ``turn`` (a fork "after turn N" inherits up to it)."""
    if not is_safe_int(turn) or isinstance(turn, bool) or turn < 1:
        raise SessionForkError(f"fork turn must be a positive integer, got {turn!r}", "INVALID_BOUNDARY")
    for event in reversed(events):
        if type(event) is TurnEnd and event.data.turn == turn:
            return event.seq
    ended = [event.data.turn for event in events if type(event) is TurnEnd]
    last = f"last ended turn: {ended[-1]}" if ended else "no turn has ended"
    raise SessionForkError(f'turn {turn} of session "{session_id}" has not ended ({last})', "INVALID_BOUNDARY")
