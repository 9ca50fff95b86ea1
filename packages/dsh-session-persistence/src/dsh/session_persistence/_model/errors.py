"""The error taxonomy shared by every package.

Persistence errors derive from :class:`SessionPersistenceError`; errors raised by the in-memory session core
for bad caller input are plain ``ValueError``/``TypeError`` subclasses so they read naturally at the call site.
Cancellation is never converted into any of these.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "CheckpointPolicyMissingError",
    "EncryptionUnavailableError",
    "EventValidationError",
    "IncompleteInheritedPrefixError",
    "LifecycleArgumentError",
    "ReentrantAppendError",
    "SessionChangedError",
    "SessionCursorError",
    "SessionDecryptError",
    "SessionKeyError",
    "SessionDisposeError",
    "SessionNeedsRepairError",
    "SessionLifecycleError",
    "LiveTurnOpenError",
    "NoInterruptedTurnError",
    "SessionLockedError",
    "SessionStorageError",
    "SessionWriteInDoubtError",
    "SessionIdError",
    "ToolDefinitionError",
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


class SessionStorageError(SessionPersistenceError):
    """The storage under a backend failed (EIO, ENOSPC, ENAMETOOLONG, a lost connection, a failed rollback).

    ``errno`` and ``path`` are kept when the failure came from the operating system (``None`` otherwise); the
    original exception is chained as ``__cause__``. Whether the failed write reached storage is unknown unless
    the backend says otherwise: the coordinator reads the stored state back before writing again.
    """

    def __init__(self, message: str, *, errno: int | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno
        self.path = path

    @classmethod
    def from_os_error(cls, action: str, exc: OSError, path: str | None = None) -> SessionStorageError:
        """Wrap an ``OSError`` raised while doing ``action`` (chain it with ``raise ... from exc``)."""
        where = path if path is not None else exc.filename
        text = exc.strerror or str(exc) or type(exc).__name__
        message = f"{action} failed: {text}" + (f" ({where})" if where is not None else "")
        return cls(message, errno=exc.errno, path=None if where is None else str(where))


class SessionKeyError(SessionPersistenceError):
    """A key is missing or unusable: an encrypted log names a key the backend was not given, a key source is
    unreadable or malformed, the cipher library is not installed, or there is no current key to encrypt with.

    The message names the session and the batch (or the key source); it never shows key bytes.
    """


class EncryptionUnavailableError(SessionPersistenceError):
    """Encrypted sessions were asked for, but the cipher package (``cryptography``, the ``[encryption]`` extra of
    ``dsh-session-persistence``) is not installed. An installation problem, not a key problem: no key would help.
    """


class SessionDecryptError(SessionPersistenceError):
    """An encrypted batch fails authentication: the key is wrong, or its bytes were altered or moved.

    Not a :class:`SessionPersistenceCorruptionError`: repair never offers to discard what a wrong key cannot open.
    """


class SessionWriteInDoubtError(SessionStorageError):
    """A durable write failed after it may have reached storage, and reading back could not settle it."""


class SessionLockedError(SessionPersistenceError):
    """Another writer holds the session's writer lease; nothing was written.

    ``holder`` describes the other writer where the backend knows it (for example ``"pid 4242 on host-a"``).
    """

    def __init__(self, session_id: str, holder: str | None = None) -> None:
        who = f" by {holder}" if holder else " by another writer"
        super().__init__(f'session "{session_id}" is locked{who}; one writer per session')
        self.session_id = session_id
        self.holder = holder


class CheckpointPolicyMissingError(SessionPersistenceError):
    """An agent would run on persisted sessions with no checkpoint policy registered on its host.

    Without one, nothing is made durable before a model request or a tool's side effect: a crash can lose the
    conversation or repeat a tool. Install it (``pip install dsh-session-checkpoint-policy``, or the safe set
    ``pip install dsh-sessions``), or opt out explicitly with ``require_checkpoint_policy=False``.
    """

    def __init__(self, what: str = "this agent") -> None:
        super().__init__(
            f"no checkpoint policy is registered, so {what} would make nothing durable before a model request or "
            "a tool call (a crash can lose the conversation or repeat a tool's side effect): "
            "pip install dsh-session-checkpoint-policy (or pip install dsh-sessions for the safe set), "
            "or pass require_checkpoint_policy=False to run without checkpoints"
        )


class ToolDefinitionError(SessionPersistenceError, TypeError):
    """A tool is built in a way that cannot work: a ``check`` whose body never learns the call id it is asked
    about, or ``with_call_id=True`` on a function that takes no ``call_id``. Raised when the tool is built."""


class SessionLiveError(SessionPersistenceError):
    """An operation that needs a cold session found it live."""


class LifecycleArgumentError(SessionPersistenceError, ValueError):
    """A listing, deletion, retention or compaction request is malformed (a bad limit, order or duration)."""


class SessionCursorError(LifecycleArgumentError):
    """A listing cursor is malformed or was made for another storage root, order or filter set."""


class SessionIdError(LifecycleArgumentError):
    """A session id is not one a session can have: not a ``str``, empty, or holding a lone surrogate code point
    (text no log or file name can hold). Refused at every entry that takes an id, before any I/O."""


class SessionChangedError(SessionPersistenceError):
    """The stored log changed after it was read (its revision moved); nothing was written or deleted."""

    def __init__(self, session_id: str, message: str | None = None) -> None:
        super().__init__(message or f'session "{session_id}" changed while the operation ran; nothing was changed')
        self.session_id = session_id


class SessionDisposeError(SessionPersistenceError):
    """Closing a coordinator could not make every live session durable: a final flush still failed.

    ``errors`` holds each failing session's own error (typed, in the order the sessions went live); the first
    is chained as ``__cause__``. The events those flushes did not cover were never acknowledged. Every other
    session was flushed and the backend was closed.
    """

    def __init__(self, backend: str, errors: Sequence[Exception]) -> None:
        self.errors: tuple[Exception, ...] = tuple(errors)
        first = self.errors[0] if self.errors else None
        more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        super().__init__(f"{backend} dispose failed: a final flush failed: {first}{more}")
        self.__cause__ = first


class SessionNeedsRepairError(SessionPersistenceError):
    """The stored log ends in an interrupted turn or a torn tail: load (or repair) it before compacting."""

    def __init__(self, session_id: str, message: str | None = None) -> None:
        super().__init__(
            message
            or f'session "{session_id}" is not closed (an interrupted turn or a torn tail): load or repair it first'
        )
        self.session_id = session_id


class NoInterruptedTurnError(SessionPersistenceError, RuntimeError):
    """``continue_interrupted`` was asked to continue a session whose last turn did not end ``interrupted``."""


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
    """An event breaks the turn/step rules (a turn or step opened twice, closed without opening, out of order)."""

    def __init__(self, message: str, rule: str, seq: int) -> None:
        super().__init__(message)
        self.rule = rule
        self.seq = seq


class ReentrantAppendError(RuntimeError):
    """A ``session_event`` observer tried to append while the previous append was still being published."""


class SessionLifecycleError(ValueError):
    """A session store operation named a session that is not live, or an id that is taken."""
