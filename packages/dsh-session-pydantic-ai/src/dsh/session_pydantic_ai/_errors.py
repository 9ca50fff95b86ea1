"""The typed errors and the warning of the pydantic-ai integration."""

from __future__ import annotations

from dsh.session_persistence import SessionPersistenceError

__all__ = ["DurabilityClosedError", "HistoryMismatchError", "NotDurableWarning", "RunOverlapError"]


class DurabilityClosedError(SessionPersistenceError, RuntimeError):
    """The :class:`DshDurability` was closed (``aclose()`` or the end of its ``async with``); nothing was written."""


class HistoryMismatchError(SessionPersistenceError, ValueError):
    """A run's ``message_history`` does not start with the messages the session holds: recording it would fork the
    log. Pass ``message_history=await durability.history()`` (nothing of the run was written, no model was asked)."""


class RunOverlapError(SessionPersistenceError, RuntimeError):
    """A second run started on a :class:`DshDurability` while one is still running: one session records one run at
    a time (nothing of the second run was written)."""


class NotDurableWarning(UserWarning):
    """The session's backend keeps nothing past this process (the in-memory backend): a crash while a tool runs loses
    the record of the call, so a restarted program may repeat its side effect. Issued once per
    :class:`DshDurability`, before the first tool body runs."""
