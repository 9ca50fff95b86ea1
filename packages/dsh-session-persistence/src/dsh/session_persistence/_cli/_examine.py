"""Read-only examination of one stored session: what ``list``, ``show``, ``verify``, ``repair`` and ``stats`` share.

``examine`` never writes. It asks the coordinator for the validated logical view (``inspect``: the stored events
plus the in-memory closers a cold load would commit), then the backend for the stored prefix (how many events are
on disk, whether a torn tail follows them). Damage and format refusals become a status, not an exception, so a
walk over many sessions reports each one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .._backends.protocol import SupportsLeaseProbe
from .._model.errors import (
    SessionDecryptError,
    SessionFormatUnsupportedError,
    SessionKeyError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    UnsupportedOperationError,
)
from .._model.events import SessionEvent
from .._model.header import SessionHeader
from .._model.views import SessionInspection
from ._context import Stack

__all__ = ["KEY_STATUSES", "RECOVERABLE", "SessionReport", "TornInfo", "examine", "file_stat"]

#: Statuses a cold load handles on its own (``verify`` exits 0 for them); ``live``: another process holds the
#: session's writer lease and is writing it (an open turn there is work in progress, not a crash).
RECOVERABLE = frozenset({"ok", "interrupted", "torn", "live"})
#: An encrypted session this run cannot open: ``no_key`` (its key is not provided), ``auth_failed`` (a batch fails
#: authentication: a wrong key, or altered bytes). Not damage (exit 7, not 1): the bytes may be intact.
KEY_STATUSES = frozenset({"no_key", "auth_failed"})


@dataclass(frozen=True)
class TornInfo:
    """A never-committed fragment after the last committed batch (cut by a cold load)."""

    #: Bytes a cold load truncates, when the backend tells (JSONL does).
    bytes: int | None
    #: Complete events found in the fragment that a cold load re-appends, when the backend tells.
    recovered_events: int | None


@dataclass
class SessionReport:
    """What one session looks like in storage."""

    id: str
    header: SessionHeader | None = None
    #: ``ok`` | ``interrupted`` (an open turn: a load appends closers) | ``torn`` (torn tail, maybe also closers) |
    #: ``corrupt`` | ``unsupported`` (intact, but this build refuses its format) | ``live`` (being written: ``holder``)
    #: | ``no_key`` / ``auth_failed`` (encrypted, and this run has no key that opens it: ``KEY_STATUSES``)
    status: str = "ok"
    message: str | None = None
    inspection: SessionInspection | None = None
    #: Events stored on disk (before any closers), ``None`` when unreadable.
    stored_events: int | None = None
    closers: tuple[SessionEvent, ...] = ()
    torn: TornInfo | None = None
    location: str | None = None
    size: int | None = None
    mtime_ms: int | None = None
    #: Who holds the writer lease when ``status`` is ``live`` (``""``: a writer that names none).
    holder: str | None = None
    extra: dict[str, object] = field(default_factory=dict)
    #: The typed error behind a ``no_key`` / ``auth_failed`` status (chained by the command that refuses).
    error: SessionPersistenceError | None = None

    @property
    def recoverable(self) -> bool:
        """Whether a cold load succeeds (possibly after repairing)."""
        return self.status in RECOVERABLE

    @property
    def events(self) -> tuple[SessionEvent, ...]:
        """The logical view (stored + pending closers), empty when unreadable."""
        return () if self.inspection is None else self.inspection.events

    @property
    def last_activity_ms(self) -> int | None:
        """Time of the last stored event, else the file's mtime, else the creation time."""
        if self.stored_events:
            return self.events[self.stored_events - 1].time
        if self.mtime_ms is not None:
            return self.mtime_ms
        return None if self.header is None else self.header.created_at


def file_stat(path: str | None) -> tuple[int | None, int | None]:
    """``(size, mtime_ms)`` of ``path``, ``(None, None)`` if it is not a readable file."""
    if path is None:
        return None, None
    try:
        st = os.stat(path)
    except OSError:
        return None, None
    return st.st_size, int(st.st_mtime * 1000)


def _location(stack: Stack, header: SessionHeader | None) -> str | None:
    if header is None:
        return None
    try:
        location = stack.coordinator.locate(header)
    except Exception:
        return None
    return None if location is None else location.path


async def examine(stack: Stack, session_id: str, header: SessionHeader | None = None) -> SessionReport:
    """Examine ``session_id`` without writing anything.

    Raises :class:`SessionNotFoundError` for an unknown id and ``OSError`` when storage cannot be read at all;
    damage and refusals are returned as the report's status.
    """
    report = SessionReport(id=session_id, header=header)
    try:
        inspection = await stack.coordinator.inspect(session_id)
    except SessionNotFoundError:
        raise
    except SessionFormatUnsupportedError as exc:
        report.status, report.message = "unsupported", str(exc)
    except SessionKeyError as exc:
        report.status, report.message, report.error = "no_key", str(exc), exc
    except SessionDecryptError as exc:
        report.status, report.message, report.error = "auth_failed", str(exc), exc
    except SessionPersistenceCorruptionError as exc:
        report.status, report.message = "corrupt", _with_cause(exc)
    except SessionPersistenceError as exc:
        report.status, report.message = "corrupt", _with_cause(exc)
    else:
        report.inspection = inspection
        report.header = inspection.meta
        stored = await stack.backend.load_stored(session_id)
        if stored is None:  # removed between the two reads
            raise SessionNotFoundError(session_id)
        report.stored_events = len(stored.events)
        report.closers = inspection.events[len(stored.events) :]
        marker = stored.torn_marker
        if marker is not None:
            truncate_to = getattr(marker, "truncate_to", None)
            expected = getattr(marker, "expected_size", None)
            recovered = getattr(marker, "recovered_events", None)
            report.torn = TornInfo(
                bytes=expected - truncate_to if isinstance(truncate_to, int) and isinstance(expected, int) else None,
                recovered_events=len(recovered) if isinstance(recovered, list) else None,
            )
            report.status = "torn"
        elif report.closers:
            report.status = "interrupted"
        holder = await _lease_holder(stack, report.header)
        if holder is not None:
            report.status, report.holder = "live", holder
    report.location = _location(stack, report.header)
    report.size, report.mtime_ms = file_stat(report.location)
    return report


async def _lease_holder(stack: Stack, header: SessionHeader) -> str | None:
    """Who is writing the session now (``None``: nobody, or the backend cannot tell); never takes the lease."""
    backend = stack.backend
    if not isinstance(backend, SupportsLeaseProbe):
        return None
    try:
        return await backend.writer_lease_holder(header)
    except (UnsupportedOperationError, SessionPersistenceError):
        return None


def _with_cause(exc: BaseException) -> str:
    text = str(exc)
    cause = exc.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        text = f"{text}: {cause}"
    return text
