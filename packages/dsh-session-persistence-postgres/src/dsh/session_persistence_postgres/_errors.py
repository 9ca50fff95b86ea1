"""The errors this backend adds to the core vocabulary (all :class:`SessionPersistenceError` subclasses)."""

from __future__ import annotations

from ._core import SessionFormatUnsupportedError, SessionKeyError, SessionPersistenceError

__all__ = ["PostgresConfigurationError", "SchemaVersionError", "SealedStoreError", "WeakDurabilityError"]


class PostgresConfigurationError(SessionPersistenceError, ValueError):
    """The backend was given settings it cannot use (a schema name PostgreSQL would alter, a bad timeout)."""


class WeakDurabilityError(SessionPersistenceError):
    """The server acknowledges commits it may lose (``fsync`` or ``synchronous_commit`` off) and the caller did
    not opt in with ``allow_weak_durability=True``. ``settings`` maps each weakened setting to its value."""

    def __init__(self, message: str, settings: dict[str, str]) -> None:
        super().__init__(message)
        self.settings = settings


class SchemaVersionError(SessionFormatUnsupportedError):
    """The database holds a dsh schema version this build cannot use (newer, or unknown)."""

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version


class SealedStoreError(SessionKeyError):
    """A backend without keys was asked to write plaintext rows into a store whose schema version says it holds
    sealed sessions (:data:`SEALED_SCHEMA_VERSION`). Give the store's keys, or opt out on purpose with
    ``allow_plaintext=True`` (``dsh-sessions -o allow_plaintext=true``). Nothing was written."""
