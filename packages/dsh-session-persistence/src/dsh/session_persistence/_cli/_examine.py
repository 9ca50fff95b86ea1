"""Read-only examination of stored sessions: what ``list``, ``show``, ``verify``, ``repair`` and ``stats`` share.

``examine`` reads one session and never writes. It asks the coordinator for the validated logical view
(``inspect``: the stored events plus the in-memory closers a cold load would commit), then the backend for the
stored prefix (how many events are on disk, whether a torn tail follows them). Damage and format refusals become a
status, not an exception, so a walk over many sessions reports each one.

``walk`` examines every listed session; ``verify_walk`` every stored artifact, readable or not, so nothing damaged
hides behind "no sessions": ``list`` (the backend's header listing) leaves out what it cannot read (a zero-length
transcript, one without a header, a file whose name is not a session id), so with a backend that can enumerate its
artifacts (``SupportsArtifactScan``) ``verify`` examines every artifact by name instead. ``closer_plan`` and
``report_json`` are the per-session summaries the commands print.

The walks live here with ``examine`` so that every command reads sessions through one module over the coordinator
(siblings, not a chain of helpers); they take the coordinator, not the command's ``Stack``, so this module sits
right over ``_coordinator.service``, beside ``_context`` rather than over it (``tools/import-graph``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .._backends.protocol import SupportsArtifactScan, SupportsLeaseProbe
from .._coordinator.service import PersistenceCoordinator
from .._model.errors import (
    EncryptionUnavailableError,
    SessionDecryptError,
    SessionFormatUnsupportedError,
    SessionKeyError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    UnsupportedOperationError,
)
from .._model.events import SessionEvent
from .._model.header import SessionHeader, header_to_builtins
from .._model.views import SessionInspection
from ._io import Io
from ._output import Progress, iso_time

__all__ = [
    "KEY_STATUSES",
    "RECOVERABLE",
    "SessionReport",
    "TornInfo",
    "closer_plan",
    "examine",
    "file_stat",
    "report_json",
    "verify_walk",
    "walk",
]

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
    def events(self) -> Sequence[SessionEvent]:
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


def _location(coordinator: PersistenceCoordinator, header: SessionHeader | None) -> str | None:
    if header is None:
        return None
    try:
        location = coordinator.locate(header)
    except Exception:
        return None
    return None if location is None else location.path


async def examine(
    coordinator: PersistenceCoordinator, session_id: str, header: SessionHeader | None = None
) -> SessionReport:
    """Examine ``session_id`` without writing anything.

    Raises :class:`SessionNotFoundError` for an unknown id and ``OSError`` when storage cannot be read at all;
    damage and refusals are returned as the report's status.
    """
    report = SessionReport(id=session_id, header=header)
    try:
        inspection = await coordinator.inspect(session_id)
    except SessionNotFoundError:
        raise
    except SessionFormatUnsupportedError as exc:
        report.status, report.message = "unsupported", str(exc)
    except SessionKeyError as exc:
        report.status, report.message, report.error = "no_key", str(exc), exc
    except SessionDecryptError as exc:
        report.status, report.message, report.error = "auth_failed", str(exc), exc
    except EncryptionUnavailableError:
        raise  # the cipher is not installed: not this session's state, and no key would help
    except SessionPersistenceCorruptionError as exc:
        report.status, report.message = "corrupt", _with_cause(exc)
    except SessionPersistenceError as exc:
        report.status, report.message = "corrupt", _with_cause(exc)
    else:
        report.inspection = inspection
        report.header = inspection.meta
        stored = await coordinator.backend.load_stored(session_id)
        if stored is None:  # removed between the two reads
            raise SessionNotFoundError(session_id)
        report.stored_events = len(stored.events)
        report.closers = tuple(inspection.events[len(stored.events) :])
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
        holder = await _lease_holder(coordinator, report.header)
        if holder is not None:
            report.status, report.holder = "live", holder
    report.location = _location(coordinator, report.header)
    report.size, report.mtime_ms = file_stat(report.location)
    return report


async def _lease_holder(coordinator: PersistenceCoordinator, header: SessionHeader) -> str | None:
    """Who is writing the session now (``None``: nobody, or the backend cannot tell); never takes the lease."""
    backend = coordinator.backend
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


@runtime_checkable
class ListsDamaged(Protocol):
    """A backend that reports sessions whose header cannot be listed (each on its own, never failing ``list``)."""

    async def list_damaged(self) -> Sequence[Any]: ...


async def _damaged(coordinator: PersistenceCoordinator) -> list[SessionReport]:
    backend = coordinator.backend
    if not isinstance(backend, ListsDamaged):
        return []
    return [
        SessionReport(id=d.session_id or d.path, status="corrupt", message=d.message, location=d.path)
        for d in await backend.list_damaged()
    ]


async def walk(coordinator: PersistenceCoordinator, io: Io, label: str) -> list[SessionReport]:
    """Examine every listed session (read-only), newest first by creation time; unlistable ones count as damaged."""
    headers = await coordinator.list()
    progress = Progress(io.err, label, len(headers))
    reports: list[SessionReport] = []
    try:
        for done, header in enumerate(headers, 1):
            with contextlib.suppress(SessionNotFoundError):  # deleted since the listing: not an error
                reports.append(await examine(coordinator, header.id, header))
            progress.update(done)
    finally:
        progress.done()
    reports.extend(await _damaged(coordinator))
    reports.sort(key=lambda r: (r.header.created_at if r.header is not None else 0, r.id), reverse=True)
    return reports


def closer_plan(report: SessionReport) -> list[str]:
    """What a cold load would write, one human line per action."""
    lines: list[str] = []
    torn = report.torn
    if torn is not None:
        size = f"{torn.bytes} bytes" if torn.bytes is not None else "the bytes"
        where = f" at the end of {report.location}" if report.location else ""
        # Honest about what the bytes can tell: an unfinished final write looks the same as a file cut short.
        lines.append(
            f"truncate a torn tail ({size}{where}) after the last complete batch: an unfinished write, as a "
            "crash mid-append leaves, or a file cut short from outside (then whatever followed the cut is gone)"
        )
        if torn.recovered_events:
            lines.append(f"re-append the {torn.recovered_events} complete event(s) found in that tail")
    for event in report.closers:
        data: Any = event.data
        if event.type == "tool/result":
            call_id = getattr(data.message.source, "call_id", "?")
            code = getattr(data.error, "code", "?")
            lines.append(f"append tool/result {code} for call {call_id} (seq {event.seq})")
        elif event.type == "step/end":
            lines.append(f"append step/end closing step {data.step} (seq {event.seq})")
        elif event.type == "turn/end":
            lines.append(f"append turn/end {{interrupted}} closing turn {data.turn} (seq {event.seq})")
        else:  # pragma: no cover - repair emits only the three types above
            lines.append(f"append {event.type} (seq {event.seq})")
    return lines


def report_json(report: SessionReport) -> dict[str, Any]:
    """The machine-readable summary of one session (``list``, ``verify``, ``show``)."""
    header = report.header
    torn = report.torn
    return {
        "id": report.id,
        "status": report.status,
        "holder": report.holder,
        "recoverable": report.recoverable,
        "message": report.message,
        "createdAt": None if header is None else header.created_at,
        "created": None if header is None else iso_time(header.created_at),
        "cwd": None if header is None or not isinstance(header.cwd, str) else header.cwd,
        "header": None if header is None else header_to_builtins(header),
        "events": report.stored_events,
        "pendingClosers": [e.type for e in report.closers],
        "tornTail": None if torn is None else {"bytes": torn.bytes, "recoveredEvents": torn.recovered_events},
        "size": report.size,
        "lastActivityAt": report.last_activity_ms,
        "lastActivity": iso_time(report.last_activity_ms),
        "location": report.location,
    }


async def verify_walk(coordinator: PersistenceCoordinator, io: Io) -> list[SessionReport]:
    """Examine every artifact (read-only), newest first by creation time, unreadable ones included."""
    backend = coordinator.backend
    if not isinstance(backend, SupportsArtifactScan):
        return await walk(coordinator, io, "verifying sessions")
    artifacts = await backend.list_artifacts()
    progress = Progress(io.err, "verifying sessions", len(artifacts))
    reports: list[SessionReport] = []
    try:
        for done, artifact in enumerate(artifacts, 1):
            report: SessionReport | None
            if artifact.session_id is None:
                report = SessionReport(
                    id=artifact.location,
                    status="corrupt",
                    message=f"cannot read {artifact.location}: its name does not name a session in this layout",
                )
            else:
                report = None
                with contextlib.suppress(SessionNotFoundError):  # deleted since the scan: not an error
                    report = await examine(coordinator, artifact.session_id)
            if report is None:
                progress.update(done)
                continue
            if report.location is None:
                report.location = artifact.location
                report.size, report.mtime_ms = file_stat(artifact.location)
            reports.append(report)
            progress.update(done)
    finally:
        progress.done()
    reports.sort(key=lambda r: (r.header.created_at if r.header is not None else 0, r.id), reverse=True)
    return reports
