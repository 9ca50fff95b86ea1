"""The error taxonomy shared by every package (DESIGN.md §6).

Persistence errors derive from :class:`SessionPersistenceError`; errors raised by the in-memory session core
for bad caller input are plain ``ValueError``/``TypeError`` subclasses so they read naturally at the call site.
Cancellation is never converted into any of these.
"""

from __future__ import annotations

__all__ = [
    "EventValidationError",
    "IncompleteInheritedPrefixError",
    "ReentrantAppendError",
    "SessionLifecycleError",
    "LiveTurnOpenError",
    "SeqMismatchError",
    "SessionAlreadyExistsError",
    "SessionFormatUnsupportedError",
    "SessionIdCollisionError",
    "SessionLiveError",
    "SessionNotFoundError",
    "SessionPersistenceCorruptionError",
    "SessionPersistenceError",
    "SessionReservedError",
    "TurnInvariantError",
    "UnknownEventTypeError",
    "UnsupportedOperationError",
]


class SessionPersistenceError(Exception):
    """Base class of every persistence failure."""


class SessionPersistenceCorruptionError(SessionPersistenceError):
    """Committed data is damaged or fails validation; the cause is chained as ``__cause__``."""


class SessionFormatUnsupportedError(SessionPersistenceError):
    """The stored log is intact but this build cannot interpret it (newer/older format, unknown event type).

    ``location`` is the raw artifact path when the backend keeps one artifact per session.
    """

    def __init__(self, message: str, location: str | None = None) -> None:
        if location is not None:
            message = f"{message} (raw log: {location})"
        super().__init__(message)
        self.location = location


class SessionNotFoundError(SessionPersistenceError, LookupError):
    """No stored artifact and no live materialized state for the id."""

    def __init__(self, session_id: str, message: str | None = None) -> None:
        super().__init__(message if message is not None else f'session "{session_id}" not found')
        self.session_id = session_id


class SeqMismatchError(SessionPersistenceError, ValueError):
    """An appended batch does not continue the stored log contiguously."""


class IncompleteInheritedPrefixError(SessionPersistenceError, ValueError):
    """The first materializing batch of a seeded session does not reach its inherited cut."""


class LiveTurnOpenError(SessionPersistenceError):
    """``load`` of a live session whose turn is still open."""


class SessionAlreadyExistsError(SessionPersistenceError):
    """``create`` of an id that is already registered or stored."""


class SessionIdCollisionError(SessionPersistenceError):
    """A live session and stored/registered state disagree about the same id."""


class SessionReservedError(SessionPersistenceError):
    """The id is reserved by another owner (a preparation or an in-flight cold read)."""


class SessionLiveError(SessionPersistenceError):
    """An operation that needs a cold session found it live."""


class UnsupportedOperationError(SessionPersistenceError, NotImplementedError):
    """The backend does not implement an optional capability."""


class EventValidationError(ValueError):
    """An event (or its envelope) is invalid for the session core."""


class UnknownEventTypeError(EventValidationError):
    """A decoded event has a type this build does not know and is not marked ``ignorable``."""

    def __init__(self, message: str, event_type: str, seq: int) -> None:
        super().__init__(message)
        self.event_type = event_type
        self.seq = seq


class TurnInvariantError(ValueError):
    """An event breaks the turn/step relational rules (session-core §2.2)."""

    def __init__(self, message: str, rule: str, seq: int) -> None:
        super().__init__(message)
        self.rule = rule
        self.seq = seq


class ReentrantAppendError(RuntimeError):
    """A ``session_event`` observer tried to append while the previous append was still being published."""


class SessionLifecycleError(ValueError):
    """A session store operation named a session that is not live, or an id that is taken."""
