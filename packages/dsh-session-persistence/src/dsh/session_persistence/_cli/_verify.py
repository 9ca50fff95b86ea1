"""``verify`` (read-only integrity check, exit code) and ``repair`` (the cold load that commits crash repair)."""

from __future__ import annotations

import argparse
import shlex
from collections import Counter
from typing import Protocol, runtime_checkable

from .._backends.protocol import SupportsArtifactScan
from .._coordinator.service import core_of
from .._model.errors import SessionLockedError
from ._context import Stack
from ._discard import DiscardsDamagedTail, discard_damaged_tail
from ._errors import EXIT_DAMAGED, EXIT_DECLINED, EXIT_KEY, EXIT_OK, EXIT_USAGE, CliError
from ._examine import KEY_STATUSES, SessionReport, closer_plan, examine, file_stat, report_json, verify_walk
from ._io import Io
from ._output import write_json
from ._transcript import resume_facts, resume_lines

__all__ = ["cmd_repair", "cmd_verify"]

_LABELS = {
    "ok": "ok",
    "interrupted": "recoverable",
    "torn": "recoverable",
    "corrupt": "CORRUPT",
    "unsupported": "UNSUPPORTED",
    "live": "live",
    "no_key": "NO KEY",
    "auth_failed": "AUTH FAILED",
}


@runtime_checkable
class ReportsIndexState(Protocol):
    """A backend with a listing cache of its own (the JSONL activity index) that can say whether it trusts it."""

    async def index_state(self) -> str: ...


async def _index_state(stack: Stack) -> str | None:
    backend = stack.backend
    return await backend.index_state() if isinstance(backend, ReportsIndexState) else None


def _describe(report: SessionReport) -> str:
    if report.status == "live":
        return (
            f"being written by {report.holder or 'another process'} ({report.stored_events} events so far); "
            "its open turn is work in progress, not a crash"
        )
    if report.status == "ok":
        return "; ".join([f"{report.stored_events} events, balanced", *resume_lines(report.events)])
    if report.recoverable:
        what = "torn tail" if report.torn is not None else "interrupted turn"
        return f"{what}: a load (or `dsh-sessions repair {report.id}`) will " + "; ".join(closer_plan(report))
    return report.message or report.status


def _with_resume(report: SessionReport) -> dict[str, object]:
    out = report_json(report)
    if report.recoverable:
        out["resume"] = resume_facts(report.events)
    return out


async def cmd_verify(args: argparse.Namespace, stack: Stack, io: Io) -> int:
    """Check one or every session without modifying anything; exit 1 if any is corrupt or refused, else 7 if any
    is encrypted under a key this run was not given (or fails authentication)."""
    if args.id is not None:
        reports = [await examine(stack.coordinator, args.id)]
    else:
        reports = await verify_walk(stack.coordinator, io)
    bad = [r for r in reports if not r.recoverable]
    # Damage outranks a missing key: a script that supplies the key must still learn that something is broken.
    code = EXIT_DAMAGED if any(r.status not in KEY_STATUSES for r in bad) else EXIT_KEY if bad else EXIT_OK
    summary = Counter(r.status for r in reports)
    # A cache, reported for what it is: its state never changes the exit code (listings never trust a bad one).
    index = await _index_state(stack) if args.id is None else None
    if args.json:
        write_json(
            io.out,
            {
                "root": stack.root,
                "backend": stack.backend_name,
                "ok": not bad,
                "sessions": [_with_resume(r) for r in reports],
                "summary": dict(sorted(summary.items())),
                **({"activityIndex": index} if index is not None else {}),
            },
        )
        return code
    if not reports:
        io.out.write(f"no sessions under {stack.root} (backend {stack.backend_name})\n")
        return code
    for r in reports:
        io.out.write(f"{_LABELS.get(r.status, r.status):<12} {r.id}: {_describe(r)}\n")
    recoverable = sum(1 for r in reports if r.recoverable and r.status not in ("ok", "live"))
    parts = [f"{summary['ok']} ok", f"{recoverable} recoverable"]
    if summary["live"]:
        parts.append(f"{summary['live']} being written")
    parts += [f"{n} {s}" for s, n in sorted(summary.items()) if s in ("corrupt", "unsupported", *KEY_STATUSES)]
    verdict = "FAILED" if bad else "passed"
    io.out.write(f"verify {verdict}: {len(reports)} session(s): {', '.join(parts)}\n")
    if index is not None:
        io.out.write(f"activity index: {index}\n")
    if any(r.status in KEY_STATUSES for r in bad):
        io.out.write("encrypted sessions need their keys: --key-env NAME or --key-file PATH (see docs/operations.md)\n")
    if any(r.status not in KEY_STATUSES for r in bad):
        io.out.write("nothing was written: damaged or unsupported logs are never modified (see docs/operations.md)\n")
    return code


def _confirm(io: Io, session_id: str) -> bool:
    try:
        interactive = io.inp.isatty()
    except (AttributeError, ValueError):
        interactive = False
    if not interactive:
        raise CliError(
            "refusing to repair without confirmation: stdin is not a terminal (pass --yes to repair anyway)",
            EXIT_USAGE,
        )
    io.err.write(f"Repair session {session_id}? [y/N] ")
    io.err.flush()
    answer = io.inp.readline().strip().lower()
    return answer in ("y", "yes")


async def _take_lease(stack: Stack, report: SessionReport) -> None:
    """Repair is a writer: it holds the session's writer lease, and a live writer makes it fail, named."""
    if report.header is None:
        return
    try:
        await core_of(stack.coordinator).hold_writer_lease(report.header)
    except SessionLockedError as exc:
        raise CliError(f"cannot repair: {exc}; stop that writer first (nothing was written)", EXIT_DAMAGED) from exc


async def _empty_transcript(stack: Stack, report: SessionReport) -> str | None:
    """The path of the session's transcript when it is empty (0 bytes: nothing in it was ever acknowledged)."""
    location = report.location or await _artifact_location(stack, report.id)
    size, _ = file_stat(location)
    return location if size == 0 else None


def _rm_hint(session_id: str, location: str) -> str:
    return (
        f"the transcript {location} is empty: it holds no event to repair or keep; delete it with "
        f"`dsh-sessions rm {session_id}` (or `rm {shlex.quote(location)}`)"
    )


async def _refusal_hint(stack: Stack, report: SessionReport) -> str:
    """The next step for a session repair refuses, only one that works: ``rm`` for an empty transcript,
    ``--discard-damaged-tail`` only when the backend finds a damaged final batch to cut."""
    empty = await _empty_transcript(stack, report)
    if empty is not None:
        return "; " + _rm_hint(report.id, empty)
    if report.status == "corrupt" and isinstance(stack.backend, DiscardsDamagedTail):
        try:
            tail = await stack.backend.find_damaged_tail(report.id)  # read-only
        except Exception:  # the damage is not confined to the final batch: no step cuts it
            tail = None
        if tail is not None:
            return (
                f"; only its final batch is damaged: `dsh-sessions repair --discard-damaged-tail {report.id}` "
                "discards it after showing what is lost"
            )
    return ""


async def _artifact_location(stack: Stack, session_id: str) -> str | None:
    """Where an unreadable session is stored (its header cannot say), when the backend can enumerate artifacts."""
    if not isinstance(stack.backend, SupportsArtifactScan):
        return None
    for artifact in await stack.backend.list_artifacts():
        if artifact.session_id == session_id:
            return artifact.location
    return None


def _write_result(io: Io, session_id: str, discarded: str | None, plan: list[str], events: int | None) -> None:
    """``repair --json``: what was discarded (already done), the plan a load committed (none: nothing repaired)."""
    document = {"id": session_id, "discarded": discarded, "plan": plan, "repaired": bool(plan), "events": events}
    write_json(io.out, document)


async def cmd_repair(args: argparse.Namespace, stack: Stack, io: Io) -> int:
    """Say what a cold load will commit, confirm, then load (which commits the repair)."""
    report = await examine(stack.coordinator, args.id)
    discarded = None
    if not report.recoverable and getattr(args, "discard_damaged_tail", False) and report.status == "corrupt":
        empty = await _empty_transcript(stack, report)
        if empty is not None:  # no batch to discard: say what works instead
            raise CliError(f"cannot discard: {_rm_hint(report.id, empty)} (nothing was written)", EXIT_DAMAGED)
        discarded = await discard_damaged_tail(
            stack.backend, io, args.id, backend_name=stack.backend_name, yes=args.yes, json=args.json, confirm=_confirm
        )
        report = await examine(stack.coordinator, args.id)
    if report.status in KEY_STATUSES:
        raise CliError(f"cannot repair: {report.message} (nothing was written)", EXIT_KEY)
    if not report.recoverable:
        raise CliError(
            f"cannot repair: {report.message} (crash repair only closes interrupted turns and cuts torn tails; "
            f"damaged committed data is never rewritten{await _refusal_hint(stack, report)})",
            EXIT_DAMAGED,
        )
    plan = closer_plan(report)
    if not plan:
        await _take_lease(stack, report)
        if args.json:
            _write_result(io, report.id, discarded, plan, report.stored_events)
        else:
            done = "nothing more to repair" if discarded is not None else "nothing to repair"
            io.out.write(f"{done}: session {report.id} is balanced and has no torn tail\n")
        return EXIT_OK
    if not args.json:
        # What is already done (a discarded tail, printed by that step) is not part of what the load will do.
        io.out.write(f"session {report.id}: a cold load will:\n")
        for line in plan:
            io.out.write(f"  - {line}\n")
        io.out.flush()
    if not args.yes and discarded is None and not _confirm(io, report.id):
        raise CliError("repair declined; nothing was written", EXIT_DECLINED)
    await _take_lease(stack, report)
    view = await stack.coordinator.load(args.id)
    after = await examine(stack.coordinator, args.id)
    if after.status != "ok":  # pragma: no cover - the coordinator re-reads after committing
        raise CliError(f"repair did not settle session {args.id}: now {after.status}", EXIT_DAMAGED)
    if args.json:
        _write_result(io, report.id, discarded, plan, len(view.events))
    else:
        io.out.write(f"repaired: session {report.id} now has {len(view.events)} events, balanced\n")
    return EXIT_OK
