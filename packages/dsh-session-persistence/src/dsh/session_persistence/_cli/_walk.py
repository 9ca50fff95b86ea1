"""Walking every stored session with a progress indicator, and per-session summaries shared by the commands."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from .._model.errors import SessionNotFoundError
from .._model.header import header_to_builtins
from ._context import Stack
from ._examine import SessionReport, examine
from ._io import Io
from ._output import Progress, iso_time

__all__ = ["closer_plan", "report_json", "walk"]


@runtime_checkable
class ListsDamaged(Protocol):
    """A backend that reports sessions whose header cannot be listed (each on its own, never failing ``list``)."""

    async def list_damaged(self) -> Sequence[Any]: ...


async def _damaged(stack: Stack) -> list[SessionReport]:
    if not isinstance(stack.backend, ListsDamaged):
        return []
    return [
        SessionReport(id=d.session_id or d.path, status="corrupt", message=d.message, location=d.path)
        for d in await stack.backend.list_damaged()
    ]


async def walk(stack: Stack, io: Io, label: str) -> list[SessionReport]:
    """Examine every listed session (read-only), newest first by creation time; unlistable ones count as damaged."""
    headers = await stack.coordinator.list()
    progress = Progress(io.err, label, len(headers))
    reports: list[SessionReport] = []
    try:
        for done, header in enumerate(headers, 1):
            with contextlib.suppress(SessionNotFoundError):  # deleted since the listing: not an error
                reports.append(await examine(stack, header.id, header))
            progress.update(done)
    finally:
        progress.done()
    reports.extend(await _damaged(stack))
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
