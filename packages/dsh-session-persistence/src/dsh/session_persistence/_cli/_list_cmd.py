"""``list``: a page of sessions, most recent activity first, with a title and a turn count.

With a backend that pages (``SupportsListPage``) only the sessions of the page are read; ``--limit`` and
``--cursor`` walk a large root a page at a time. A backend without paging falls back to reading every session.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Sequence
from typing import Any

from .._backends.listing import SessionListing, SupportsListPage
from .._backends.protocol import StoredArtifact, SupportsArtifactScan
from .._model.errors import SessionNotFoundError
from .._model.events import SessionEvent, TextBlock
from ._context import Stack
from ._errors import EXIT_OK, EXIT_USAGE, CliError
from ._examine import SessionReport, examine, report_json, walk
from ._io import Io
from ._output import Progress, human_size, iso_time, local_time, table, write_json
from ._when import parse_since

__all__ = ["cmd_list", "session_summary"]

TITLE_WIDTH = 60
CHUNK_TYPE = "assistant/chunk"


def _title(events: Sequence[SessionEvent]) -> str | None:
    for event in events:
        if event.type == "user/message":
            content = getattr(event.data, "content", ())
            texts = [block.text for block in content if isinstance(block, TextBlock)]
            text = " ".join(" ".join(texts).split())
            if text:
                return text
    return None


def user_turns(events: Sequence[SessionEvent]) -> int:
    """TURNS: the turns a user started. A turn counts when it holds a user message (a continuation or a turn the
    model opened does not); user messages outside any turn count once per gap between turns (the Agents SDK
    integration stores a run's input there and one turn per model response, so two runs are two turns)."""
    count = 0
    counted = False  # a user message already counted since the last turn boundary
    for event in events:
        if event.type in ("turn/start", "turn/end"):
            counted = False
        elif event.type == "user/message" and not counted:
            count += 1
            counted = True
    return count


def session_summary(report: SessionReport) -> dict[str, Any]:
    """Turns, streamed chunks and the first user message of a readable session (``None`` when unreadable)."""
    if report.inspection is None:
        return {"turns": None, "chunks": None, "title": None}
    stored = report.events[: report.stored_events or 0]
    return {
        "turns": user_turns(stored),
        "chunks": sum(1 for e in stored if e.type == CHUNK_TYPE),
        "title": _title(stored),
    }


def _cwd_filter(args: argparse.Namespace) -> str | None:
    # Pure string work (no I/O): `--cwd .` means the directory the operator is in.
    return None if args.cwd is None else os.path.normpath(os.path.join(os.getcwd(), os.path.expanduser(args.cwd)))


def _logged_activity(report: SessionReport, listed_at: int) -> int:
    """The time of the last stored event, from the log itself (``lastEventAt``), else what the listing knows."""
    if report.stored_events:
        return report.events[report.stored_events - 1].time
    return listed_at


def _short(text: str | None) -> str:
    if not text:
        return "-"
    return text if len(text) <= TITLE_WIDTH else text[: TITLE_WIDTH - 1] + "…"


async def _paged(args: argparse.Namespace, stack: Stack, io: Io) -> tuple[list[tuple[SessionReport, int]], str | None]:
    since = None if args.since is None else parse_since(args.since)
    cwd = _cwd_filter(args)
    page = await stack.coordinator.list_page(
        limit=args.limit, cursor=args.cursor, order=args.order, cwd=cwd, parent=args.parent, since=since
    )
    progress = Progress(io.err, "reading sessions", len(page.entries))
    out: list[tuple[SessionReport, int]] = []
    try:
        for done, row in enumerate(page.entries, 1):
            report = await _examine_row(stack, row)
            if report is not None:
                out.append((report, row.updated_at))
            progress.update(done)
    finally:
        progress.done()
    return out, page.next_cursor


async def _examine_row(stack: Stack, row: SessionListing) -> SessionReport | None:
    with contextlib.suppress(SessionNotFoundError):  # deleted since the listing: not an error
        return await examine(stack.coordinator, row.header.id, row.header)
    return None


async def _unpaged(args: argparse.Namespace, stack: Stack, io: Io) -> list[tuple[SessionReport, int]]:
    if args.cursor is not None or args.since is not None or args.order != "recent":
        raise CliError(
            f'the "{stack.backend_name}" backend cannot page or order by activity (--cursor, --since, --order)',
            EXIT_USAGE,
        )
    reports = await walk(stack.coordinator, io, "reading sessions")
    cwd = _cwd_filter(args)
    kept = [
        r
        for r in reports
        if (cwd is None or (r.header is not None and r.header.cwd == cwd))
        and (args.parent is None or (r.header is not None and r.header.parent_session == args.parent))
    ]
    rows = [(r, r.last_activity_ms or 0) for r in kept]
    return rows if args.limit is None else rows[: args.limit]


def _filtered(args: argparse.Namespace) -> bool:
    return args.cwd is not None or args.parent is not None or args.since is not None


async def _unreadable(
    args: argparse.Namespace, stack: Stack, rows: list[tuple[SessionReport, int]], complete: bool
) -> list[StoredArtifact]:
    """Stored artifacts no listing can show because they cannot be read (their header is unreadable).

    Reported on the first page whatever the filters and the limit (a filter cannot be applied to a session whose
    header cannot be read, and a page must not hide that the store holds one); later pages (``--cursor``) do not
    repeat it.
    """
    backend = stack.backend
    if args.cursor is not None or not isinstance(backend, SupportsArtifactScan):
        return []
    if complete and not _filtered(args):
        listed = {report.id for report, _ in rows}
    else:  # the page shows some sessions only: compare with every readable header
        listed = {header.id for header in await stack.coordinator.list()}
    return [a for a in await backend.list_artifacts() if a.session_id not in listed]


def _filter_text(args: argparse.Namespace) -> str:
    given = (("--cwd", _cwd_filter(args)), ("--parent", args.parent), ("--since", args.since))
    return " ".join(f"{flag} {value}" for flag, value in given if value is not None)


async def cmd_list(args: argparse.Namespace, stack: Stack, io: Io) -> int:
    """Sessions, most recent activity first: id, last activity, turns, events, size, status, cwd, title."""
    if isinstance(stack.backend, SupportsListPage):
        rows, next_cursor = await _paged(args, stack, io)
    else:
        rows, next_cursor = await _unpaged(args, stack, io), None
    unreadable = await _unreadable(args, stack, rows, next_cursor is None)
    if unreadable:
        names = ", ".join(a.session_id or a.location for a in unreadable)
        unfiltered = " (no filter can be applied to them)" if _filtered(args) else ""
        io.err.write(
            f"dsh-sessions: warning: {len(unreadable)} stored session(s) cannot be read and are not listed"
            f"{unfiltered} (run `dsh-sessions verify`): {names}\n"
        )
    if args.json:
        sessions = []
        for report, updated_at in rows:
            document = report_json(report)
            document.update(session_summary(report))
            document["updatedAt"] = updated_at
            document["lastEventAt"] = _logged_activity(report, updated_at)
            document["updated"] = iso_time(updated_at)
            sessions.append(document)
        write_json(
            io.out,
            {
                "root": stack.root,
                "backend": stack.backend_name,
                "sessions": sessions,
                "nextCursor": next_cursor,
                "unreadable": [{"id": a.session_id, "location": a.location} for a in unreadable],
            },
        )
        return EXIT_OK
    if not rows:
        readable = "readable " if unreadable else ""
        if _filtered(args):
            io.out.write(f"no {readable}sessions match {_filter_text(args)} under {stack.root}\n")
        elif args.cursor is not None:
            io.out.write(f"no more sessions after that cursor under {stack.root}\n")
        else:
            io.out.write(f"no {readable}sessions under {stack.root} (backend {stack.backend_name})\n")
        return EXIT_OK
    table_rows = []
    for report, updated_at in rows:
        summary = session_summary(report)
        header = report.header
        cwd = header.cwd if header is not None and isinstance(header.cwd, str) else "-"
        # The number --json gives as "events" (and verify and compact print): every stored event, streamed chunks
        # included (--json's "chunks" says how many of them are chunks).
        events = "?" if report.stored_events is None else str(report.stored_events)
        turns = "?" if summary["turns"] is None else str(summary["turns"])
        table_rows.append(
            [
                report.id,
                # The listing's own activity: the time the rows are ordered, filtered (--since) and pruned by (a
                # backend reads it from the log itself, never from a file's mtime that a copy or a touch changes).
                local_time(updated_at),
                turns,
                events,
                human_size(report.size),
                f"live ({report.holder or 'unnamed writer'})" if report.status == "live" else report.status,
                cwd,
                _short(summary["title"]),
            ]
        )
    table(io.out, ["ID", "LAST ACTIVITY", "TURNS", "EVENTS", "SIZE", "STATUS", "CWD", "TITLE"], table_rows)
    if next_cursor is not None:
        io.out.write(f"more sessions: add --cursor {next_cursor}\n")
    return EXIT_OK
