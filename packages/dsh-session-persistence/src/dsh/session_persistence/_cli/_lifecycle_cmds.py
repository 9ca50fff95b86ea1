"""The commands that delete or rewrite: ``rm``, ``prune``, ``compact`` and ``re-encrypt``.

Each one checks everything it can before it changes anything: ``rm a b`` with an unknown ``b`` deletes nothing,
``prune`` with a nonsense duration touches nothing, and deletions carry the revision seen when they were chosen,
so a session written to in between is skipped instead of deleted. Without a terminal ``rm`` needs ``--yes`` and
``prune`` only reports (a dry run) unless given ``--yes``. ``compact`` and ``re-encrypt`` take one id, several, or
``--all`` (rotating a store's key is one command): with more than one session each is rewritten on its own, one
that cannot be (live, needing repair, damaged, no key) is reported and skipped, and the exit code says so.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from .._backends.listing import SessionListing
from .._model.errors import (
    SessionChangedError,
    SessionDecryptError,
    SessionKeyError,
    SessionLiveError,
    SessionLockedError,
    SessionNotFoundError,
    SessionPersistenceError,
)
from ._context import Stack
from ._errors import EXIT_DAMAGED, EXIT_DECLINED, EXIT_KEY, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError
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
    """Rewrite closed sessions' logs as one batch each (same events), atomically: one ``ID``, several, or ``--all``."""
    return await _rewrite(args, stack, io, _Verb("compact", "compacted", "compacting", ""))


async def cmd_reencrypt(args: argparse.Namespace, stack: Stack, io: Io) -> int:
    """Re-seal closed sessions under the current key: compaction by a backend given keys (the rewritten log is
    written as a new encrypted log, every event sealed under the provider's current key), atomically, under the
    writer lease. A plaintext session is encrypted. Without keys it is refused: it would write plaintext.
    ``--all`` rotates a whole store's key in one command."""
    if not stack.keyed:
        raise CliError(
            "re-encrypt needs the keys: --key-env NAME or --key-file PATH (the first key is the one it seals under); "
            "nothing was written",
            EXIT_USAGE,
        )
    verb = _Verb("re-encrypt", "re-encrypted", "re-encrypting", " under the current key")
    return await _rewrite(args, stack, io, verb)


@dataclass(frozen=True)
class _Verb:
    command: str
    done: str
    doing: str
    how: str


async def _rewrite(args: argparse.Namespace, stack: Stack, io: Io, verb: _Verb) -> int:
    ids: list[str] = list(dict.fromkeys(args.ids))
    if args.all == bool(ids):
        raise CliError(f"{verb.command} takes session ids or --all (one of the two)", EXIT_USAGE)
    if len(ids) == 1:  # one session: its own errors, as before --all existed
        return await _rewrite_one(args.json, ids[0], stack, io, verb)
    if args.all:
        ids = [header.id for header in await stack.coordinator.list()]
    else:  # every named id must exist before anything is rewritten, as for rm
        for session_id in ids:
            if await stack.backend.read_stored_revision(session_id) is None:
                raise CliError(f'session "{session_id}" not found; nothing was rewritten', EXIT_NOT_FOUND)
    return await _rewrite_many(args.json, ids, stack, io, verb)


async def _rewrite_many(as_json: bool, ids: list[str], stack: Stack, io: Io, verb: _Verb) -> int:
    """Each session in turn; a session that cannot be rewritten (live, needing repair, damaged, no key) is reported
    and skipped, and the exit code says the run was incomplete (7 when only keys were missing, else 1)."""
    done: list[dict[str, Any]] = []
    skipped: list[tuple[str, str, bool]] = []  # (id, reason, a key problem)
    progress = Progress(io.err, f"{verb.doing} sessions", len(ids))
    try:
        for count, session_id in enumerate(ids, 1):
            try:
                result = await _rewrite_session(session_id, stack)
            except (SessionKeyError, SessionDecryptError) as exc:
                skipped.append((session_id, str(exc), True))
                line = f"skipped {session_id}: {exc}"
            except SessionPersistenceError as exc:
                skipped.append((session_id, str(exc), False))
                line = f"skipped {session_id}: {exc}"
            else:
                done.append(result)
                line = _done_line(result, verb)
            if not as_json:
                progress.done()  # the result line replaces the indicator; the next update redraws it
                io.out.write(line + "\n")
                io.out.flush()
            progress.update(count)
    finally:
        progress.done()
    if as_json:
        write_json(
            io.out,
            {
                "root": stack.root,
                "backend": stack.backend_name,
                "rewritten": done,
                "skipped": [{"id": sid, "reason": reason} for sid, reason, _key in skipped],
            },
        )
    else:
        io.out.write(f"{verb.command}: {len(done)} {verb.done}, {len(skipped)} skipped\n")
    if not skipped:
        return EXIT_OK
    return EXIT_KEY if all(key for _sid, _reason, key in skipped) else EXIT_DAMAGED


async def _rewrite_one(as_json: bool, session_id: str, stack: Stack, io: Io, verb: _Verb) -> int:
    result = await _rewrite_session(session_id, stack)
    if as_json:
        write_json(io.out, result)
    else:
        io.out.write(_done_line(result, verb) + "\n")
    return EXIT_OK


async def _rewrite_session(session_id: str, stack: Stack) -> dict[str, Any]:
    revision = await stack.backend.read_stored_revision(session_id)
    if revision is None:
        raise SessionNotFoundError(session_id)
    stored = await stack.backend.load_stored(session_id)
    located = None if stored is None else stack.coordinator.locate(stored.meta)
    location = None if located is None else located.path
    before, _ = file_stat(location)
    result = await stack.coordinator.compact(session_id)
    after, _ = file_stat(location)
    return {"id": result.session_id, "events": result.event_count, "bytesBefore": before, "bytesAfter": after}


def _done_line(result: dict[str, Any], verb: _Verb) -> str:
    before, after = result["bytesBefore"], result["bytesAfter"]
    sizes = f", {human_size(before)} -> {human_size(after)}" if before is not None else ""
    return f"{verb.done} {result['id']}: {result['events']} events in one batch{verb.how}{sizes}"
