"""The commands that delete or rewrite: ``rm``, ``prune``, ``compact`` and ``re-encrypt``.

Each one checks everything it can before it changes anything: ``rm a b`` with an unknown ``b`` deletes nothing,
``prune`` with a nonsense duration touches nothing, and deletions carry the revision seen when they were chosen,
so a session written to in between is skipped instead of deleted. Without a terminal ``rm`` needs ``--yes`` and
``prune`` only reports (a dry run) unless given ``--yes``.
"""

from __future__ import annotations

import argparse
from typing import Any

from .._backends.listing import SessionListing
from .._model.errors import SessionChangedError, SessionLiveError, SessionLockedError, SessionNotFoundError
from ._context import Stack
from ._errors import EXIT_DAMAGED, EXIT_DECLINED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError
from ._examine import file_stat
from ._io import Io
from ._output import Progress, human_size, iso_time, local_time, write_json
from ._when import parse_duration

__all__ = ["cmd_compact", "cmd_prune", "cmd_reencrypt", "cmd_rm"]


def _interactive(io: Io) -> bool:
    try:
        return bool(io.inp.isatty())
    except (AttributeError, ValueError):
        return False


def _ask(io: Io, question: str) -> bool:
    io.err.write(f"{question} [y/N] ")
    io.err.flush()
    return io.inp.readline().strip().lower() in ("y", "yes")


async def cmd_rm(args: argparse.Namespace, stack: Stack, io: Io) -> int:
    """Delete the named sessions durably; every id is checked first, so a bad one deletes nothing."""
    ids = list(dict.fromkeys(args.ids))
    revisions: dict[str, str] = {}
    for session_id in ids:
        revision = await stack.backend.read_stored_revision(session_id)
        if revision is None:
            raise CliError(f'session "{session_id}" not found; nothing was deleted', EXIT_NOT_FOUND)
        revisions[session_id] = revision
    if not args.yes:
        if not _interactive(io):
            raise CliError(
                "refusing to delete without confirmation: stdin is not a terminal (pass --yes to delete)", EXIT_USAGE
            )
        if not _ask(io, f"Delete {len(ids)} session(s) ({', '.join(ids)}) for good?"):
            raise CliError("deletion declined; nothing was deleted", EXIT_DECLINED)
    deleted: list[str] = []
    for session_id in ids:
        try:
            await stack.coordinator.delete(session_id, expected_revision=revisions[session_id])
        except (SessionLiveError, SessionLockedError, SessionChangedError, SessionNotFoundError) as exc:
            done = f" (deleted: {', '.join(deleted)})" if deleted else " (nothing was deleted)"
            code = EXIT_NOT_FOUND if isinstance(exc, SessionNotFoundError) else EXIT_DAMAGED
            raise CliError(f"{exc}{done}", code) from exc
        deleted.append(session_id)
        if not args.json:
            io.out.write(f"deleted {session_id}\n")
    if args.json:
        write_json(io.out, {"root": stack.root, "backend": stack.backend_name, "deleted": deleted})
    return EXIT_OK


def _row_json(row: SessionListing) -> dict[str, Any]:
    return {"id": row.id, "updatedAt": row.updated_at, "updated": iso_time(row.updated_at)}


async def cmd_prune(args: argparse.Namespace, stack: Stack, io: Io) -> int:
    """Retention: delete sessions idle longer than --older-than, keeping the --keep-last most recent."""
    older_than = None if args.older_than is None else parse_duration(args.older_than, "--older-than")
    if args.keep_last is not None and args.keep_last < 0:
        raise CliError(f"--keep-last must be 0 or more, got {args.keep_last}", EXIT_USAGE)
    if older_than is None and args.keep_last is None:
        raise CliError("prune needs --older-than DURATION, --keep-last N or both", EXIT_USAGE)
    report = await stack.coordinator.prune(older_than=older_than, keep_last=args.keep_last, dry_run=True)
    chosen = list(report.selected)
    if args.dry_run:
        delete, why = False, "dry run"
    elif args.yes:
        delete, why = True, ""
    elif not _interactive(io):
        delete, why = False, "dry run: stdin is not a terminal, pass --yes to delete"
    elif not chosen:
        delete, why = False, ""
    else:
        _show(io, chosen, "would delete")
        delete = _ask(io, f"Delete these {len(chosen)} session(s) for good?")
        if not delete:
            raise CliError("prune declined; nothing was deleted", EXIT_DECLINED)
        why = ""
    deleted: list[str] = []
    skipped: list[tuple[str, str]] = []
    if delete:
        progress = Progress(io.err, "deleting sessions", len(chosen))
        try:
            for done, row in enumerate(chosen, 1):
                try:
                    await stack.coordinator.delete(row.id, expected_revision=row.revision)
                except SessionChangedError:
                    skipped.append((row.id, "changed since it was listed"))
                except SessionNotFoundError:
                    skipped.append((row.id, "already gone"))
                except (SessionLiveError, SessionLockedError) as exc:
                    skipped.append((row.id, str(exc)))
                else:
                    deleted.append(row.id)
                progress.update(done)
        finally:
            progress.done()
    if args.json:
        write_json(
            io.out,
            {
                "root": stack.root,
                "backend": stack.backend_name,
                "dryRun": not delete,
                "selected": [_row_json(row) for row in chosen],
                "deleted": deleted,
                "skipped": [{"id": sid, "reason": reason} for sid, reason in skipped],
                "kept": report.kept,
            },
        )
        return EXIT_OK
    if not delete:
        _show(io, chosen, "would delete")
        note = f" ({why})" if why else ""
        io.out.write(f"prune{note}: {len(chosen)} session(s) selected, {report.kept} kept, nothing deleted\n")
        return EXIT_OK
    for sid in deleted:
        io.out.write(f"deleted {sid}\n")
    for sid, reason in skipped:
        io.out.write(f"skipped {sid}: {reason}\n")
    io.out.write(f"prune: {len(deleted)} deleted, {len(skipped)} skipped, {report.kept} kept\n")
    return EXIT_OK


def _show(io: Io, rows: list[SessionListing], verb: str) -> None:
    for row in rows:
        io.out.write(f"{verb} {row.id} (last activity {local_time(row.updated_at)})\n")


async def cmd_compact(args: argparse.Namespace, stack: Stack, io: Io) -> int:
    """Rewrite a closed session's log as one batch (same events), atomically."""
    return await _compact(args, stack, io, "compacted", "")


async def cmd_reencrypt(args: argparse.Namespace, stack: Stack, io: Io) -> int:
    """Re-seal a closed session under the current key: compaction by a backend given keys (the rewritten log is
    written as a new encrypted log, every event sealed under the provider's current key), atomically, under the
    writer lease. A plaintext session is encrypted. Without keys it is refused: it would write plaintext."""
    if not stack.keyed:
        raise CliError(
            "re-encrypt needs the keys: --key-env NAME or --key-file PATH (the first key is the one it seals under); "
            "nothing was written",
            EXIT_USAGE,
        )
    return await _compact(args, stack, io, "re-encrypted", " under the current key")


async def _compact(args: argparse.Namespace, stack: Stack, io: Io, verb: str, how: str) -> int:
    revision = await stack.backend.read_stored_revision(args.id)
    if revision is None:
        raise SessionNotFoundError(args.id)
    stored = await stack.backend.load_stored(args.id)
    located = None if stored is None else stack.coordinator.locate(stored.meta)
    location = None if located is None else located.path
    before, _ = file_stat(location)
    result = await stack.coordinator.compact(args.id)
    after, _ = file_stat(location)
    if args.json:
        write_json(
            io.out,
            {"id": result.session_id, "events": result.event_count, "bytesBefore": before, "bytesAfter": after},
        )
        return EXIT_OK
    sizes = f", {human_size(before)} -> {human_size(after)}" if before is not None else ""
    io.out.write(f"{verb} {result.session_id}: {result.event_count} events in one batch{how}{sizes}\n")
    return EXIT_OK
