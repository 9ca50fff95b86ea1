"""The read commands: ``list``, ``show``, ``export``, ``stats`` and ``plugins``. None of them writes anything."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from .._host.host import Host
from .._model.events import InterruptedReason
from .._wire.codec import encode_event
from ._context import KeySource, Stack
from ._errors import EXIT_DAMAGED, EXIT_KEY, EXIT_OK, CliError, key_hint
from ._examine import KEY_STATUSES, SessionReport, closer_plan, examine, report_json, walk
from ._io import Io
from ._output import human_size, local_time, table, write_json
from ._salvage import salvage_events
from ._transcript import render_transcript, resume_facts, resume_lines, transcript_entries

__all__ = ["cmd_export", "cmd_list", "cmd_plugins", "cmd_show", "cmd_stats", "require_readable"]


def require_readable(report: SessionReport, keys: KeySource | None = None) -> None:
    """Raise the ``EXIT_DAMAGED`` error for a corrupt or refused session (``EXIT_KEY``: no key opens it).

    ``keys``: the key source the command was given, so a missing key is not answered with "give the keys"."""
    if not report.recoverable:
        message = report.message or f'session "{report.id}" cannot be read'
        if report.status == "no_key":
            message += key_hint(keys)
        raise CliError(message, EXIT_KEY if report.status in KEY_STATUSES else EXIT_DAMAGED) from report.error


async def cmd_list(args: argparse.Namespace, stack: Stack, io: Io) -> int:
    """Every session, newest first: id, created, cwd, events, size, last activity, status."""
    reports = await walk(stack.coordinator, io, "reading sessions")
    if args.json:
        write_json(
            io.out, {"root": stack.root, "backend": stack.backend_name, "sessions": [report_json(r) for r in reports]}
        )
        return EXIT_OK
    if not reports:
        io.out.write(f"no sessions under {stack.root} (backend {stack.backend_name})\n")
        return EXIT_OK
    rows = []
    for r in reports:
        header = r.header
        cwd = header.cwd if header is not None and isinstance(header.cwd, str) else "-"
        created = local_time(header.created_at) if header is not None else "-"
        events = "?" if r.stored_events is None else str(r.stored_events)
        rows.append([r.id, created, cwd, events, human_size(r.size), local_time(r.last_activity_ms), r.status])
    table(io.out, ["ID", "CREATED", "CWD", "EVENTS", "SIZE", "LAST ACTIVITY", "STATUS"], rows)
    return EXIT_OK


async def cmd_show(args: argparse.Namespace, stack: Stack, io: Io) -> int:
    """A readable transcript of one session (read-only: pending repairs are shown, not written)."""
    report = await examine(stack.coordinator, args.id)
    require_readable(report, stack.keys)
    assert report.inspection is not None
    entries = transcript_entries(report.events, report.stored_events)
    if args.json:
        document = report_json(report)
        document["inheritedEventCount"] = report.inspection.inherited_event_count
        document["entries"] = entries
        document["resume"] = resume_facts(report.events)
        write_json(io.out, document)
        return EXIT_OK
    out = io.out
    header = report.inspection.meta
    out.write(f"session {report.id}\n")
    where = f"  {report.location} ({human_size(report.size)})" if report.location else ""
    out.write(f"  backend   {stack.backend_name}{where}\n")
    out.write(f"  created   {local_time(header.created_at)}\n")
    if isinstance(header.cwd, str):
        out.write(f"  cwd       {header.cwd}\n")
    if header.parent_session:
        out.write(f"  parent    {header.parent_session} ({report.inspection.inherited_event_count} inherited events)\n")
    pending = f" (+{len(report.closers)} pending repair closers)" if report.closers else ""
    out.write(f"  events    {report.stored_events} stored{pending}\n")
    out.write(f"  status    {report.status}\n")
    for line in closer_plan(report):
        out.write(f"            a load would {line}\n")
    for line in resume_lines(report.events):
        out.write(f"  resume    {line}\n")
    if report.closers or report.torn is not None:
        out.write(f"            (read-only view: `dsh-sessions repair {report.id}` commits this)\n")
    render_transcript(out, entries)
    return EXIT_OK


async def cmd_export(args: argparse.Namespace, stack: Stack, io: Io) -> int:
    """The decoded log, one JSON event per line: exactly what ``inspect`` returns (closers included).

    With ``--salvage`` a damaged log yields the events before its first damage instead of an error.
    """
    if getattr(args, "salvage", False):
        events = await salvage_events(stack.coordinator, args.id, io, backend_name=stack.backend_name)
    else:
        events = list((await stack.coordinator.inspect(args.id)).events)
    lines = b"".join(encode_event(event) + b"\n" for event in events)
    buffer = getattr(io.out, "buffer", None)
    if buffer is not None:
        io.out.flush()
        buffer.write(lines)
        buffer.flush()
    else:
        io.out.write(lines.decode("utf-8"))
    return EXIT_OK


async def cmd_stats(args: argparse.Namespace, stack: Stack, io: Io) -> int:
    """Counts, bytes and the compression ratio over every session."""
    reports = await walk(stack.coordinator, io, "measuring sessions")
    statuses: Counter[str] = Counter(r.status for r in reports)
    types: Counter[str] = Counter()
    repaired: Counter[str] = Counter()
    turns = interrupted = pending = 0
    stored_bytes = 0
    decoded_bytes: int | None = 0 if stack.coordinator.supports_raw_artifacts else None
    for r in reports:
        stored = r.events[: r.stored_events or 0]
        pending += len(r.closers)
        for event in stored:
            types[event.type] += 1
            data: Any = event.data
            if event.type == "turn/start":
                turns += 1
            elif event.type == "turn/end" and isinstance(data.reason, InterruptedReason):
                interrupted += 1
            elif event.type == "tool/result":
                code = getattr(data.error, "code", None)
                if code in ("TOOL_OUTCOME_UNKNOWN", "TOOL_NOT_STARTED"):
                    repaired[code] += 1
        stored_bytes += r.size or 0
        if decoded_bytes is not None and r.recoverable:
            raw = await stack.coordinator.read_raw(r.id)
            if raw is not None:
                decoded_bytes += len(raw.content.encode("utf-8"))
    ratio = round(decoded_bytes / stored_bytes, 2) if decoded_bytes and stored_bytes else None
    document = {
        "root": stack.root,
        "backend": stack.backend_name,
        "sessions": len(reports),
        "statuses": dict(sorted(statuses.items())),
        "events": sum(types.values()),
        "eventTypes": dict(sorted(types.items())),
        "turns": turns,
        "interruptedTurns": interrupted,
        "toolCalls": types["tool/call"],
        "repairedResults": dict(sorted(repaired.items())),
        "pendingClosers": pending,
        "storedBytes": stored_bytes,
        "decodedBytes": decoded_bytes,
        "compressionRatio": ratio,
    }
    if args.json:
        write_json(io.out, document)
        return EXIT_OK
    out = io.out
    out.write(f"root          {stack.root} (backend {stack.backend_name})\n")
    states = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "none"
    out.write(f"sessions      {len(reports)} ({states})\n")
    out.write(f"events        {document['events']} stored, {pending} pending repair closers\n")
    out.write(f"turns         {turns} ({interrupted} ended interrupted by crash repair)\n")
    repaired_text = ", ".join(f"{n} {c}" for c, n in sorted(repaired.items())) or "none"
    out.write(f"tool calls    {types['tool/call']} (repaired results: {repaired_text})\n")
    out.write(f"stored        {human_size(stored_bytes)} on disk\n")
    if decoded_bytes is not None:
        shown = f"{ratio}x" if ratio is not None else "-"
        out.write(f"decoded       {human_size(decoded_bytes)} of JSONL (compression ratio {shown})\n")
    if types:
        out.write("by type\n")
        table(out, ["  TYPE", "COUNT"], [[f"  {t}", n] for t, n in sorted(types.items())])
    return EXIT_OK


def plugin_rows(host: Host) -> list[dict[str, Any]]:
    """Every registered plugin with its distribution, hooks and backends."""
    dists = {id(plugin): dist for plugin, dist in host.list_plugin_distinfo()}
    backends: dict[str, list[str]] = {}
    for plugin_name, provided in host.backends_by_plugin().items():
        if isinstance(provided, Exception):
            names = [f"<error: {provided}>"]
        else:
            names = [str(getattr(cls, "NAME", "?")) for cls in provided]
        backends.setdefault(plugin_name, []).extend(names)
    rows = []
    for name, plugin in host.list_name_plugin():
        if plugin is None:
            continue
        dist = dists.get(id(plugin))
        rows.append(
            {
                "name": name,
                "module": getattr(plugin, "__name__", type(plugin).__qualname__),
                "distribution": None if dist is None else dist.project_name,
                "version": None if dist is None else dist.version,
                "hooks": sorted(caller.name for caller in host.get_hookcallers(plugin) or ()),
                "backends": backends.get(name, []),
            }
        )
    return rows


async def cmd_plugins(args: argparse.Namespace, host: Host, io: Io) -> int:
    """The loaded ``dsh.session`` plugins, their distributions and hooks."""
    rows = plugin_rows(host)
    if args.json:
        write_json(io.out, {"plugins": rows})
        return EXIT_OK
    if not rows:
        io.out.write("no dsh.session plugins installed\n")
        return EXIT_OK
    for row in rows:
        dist = f"{row['distribution']} {row['version']}" if row["distribution"] else "(registered in-process)"
        io.out.write(f"{row['name']}\n")
        io.out.write(f"  distribution  {dist}\n")
        io.out.write(f"  module        {row['module']}\n")
        io.out.write(f"  hooks         {', '.join(row['hooks']) or '-'}\n")
        if row["backends"]:
            io.out.write(f"  backends      {', '.join(row['backends'])}\n")
    return EXIT_OK
