"""Lifecycle primitives over a JSONL root: paged listing by directory entries, durable delete, compaction.

Blocking code for worker threads. The ``"recent"`` listing orders sessions by their last activity, the time of
their log's last event (``activity_key.py``: read from the log's last batch, cached by the activity index while
the transcript's ``stat`` is unchanged; never the file's mtime, which a copy or a ``touch`` changes), and reads
headers only for the rows of the page (plus the rows a header filter rejects); the ``"created"`` order needs every
header, because the creation time lives only in the header. ``since`` and every row's ``updated_at`` (which
``prune`` follows) are that same activity. Sessions whose transcript is missing, empty, header-less or damaged
are left out, as ``list`` leaves them out (``dsh-sessions verify`` reports them).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
from collections.abc import Callable, Iterator

from dsh.session_persistence.backend import (
    ListQuery,
    SessionChangedError,
    SessionHeader,
    SessionListing,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    StoredArtifact,
)

from .._format.frames import Compression
from .._format.records import NotAHeaderError
from ..encryption import KeyProvider
from .activity_key import ActivityReader
from .activity_list import cached_entries, indexed_page, rebuild
from .discovery import check_identity, find_transcript, read_listed
from .fs import fsync_dir, is_file, replace_durable, revision_of
from .layout import RAW_SUFFIX, TRANSCRIPT_STEM, ZSTD_SUFFIX, child_dirs, decode_segment, project_key, suffix_for
from .lease import acquire_lease

__all__ = ["compact_transcript", "delete_transcript", "list_artifacts", "list_rows"]

Checkpoint = Callable[[], None]


#: ``(-activity_ms, session_id, path, stat)``: a tuple sorts in the "recent" order without a key function.
_Candidate = tuple[int, str, str, os.stat_result]


def _session_id(name: str) -> str:
    # Only "~" starts an escape, and every other character of an encoded name stands for itself: most ids
    # need no decoding at all (decoding costs microseconds per name, a 100,000-session root pays it in full).
    return name if "~" not in name else decode_segment(name)


def _candidates(
    root: str, compression: Compression, query: ListQuery, checkpoint: Checkpoint, reader: ActivityReader
) -> list[_Candidate]:
    """Every session directory with a transcript, with its stat and last activity (read unless the index has it).

    The activity filters (``since``, and the keyset position in the "recent" order) apply here, before any
    header is read.
    """
    suffix = "/" + TRANSCRIPT_STEM + suffix_for(compression)
    cwd = query.cwd
    # Every session with a given cwd lives in that cwd's project directory (the key is lossy: the header decides).
    projects = [os.path.join(root, project_key(cwd))] if cwd is not None else [entry.path for entry in child_dirs(root)]
    since = query.since
    after = query.after if query.order == "recent" else None
    out: list[_Candidate] = []
    seen: dict[str, str] = {}
    for project in projects:
        checkpoint()
        for entry in child_dirs(project):
            path = entry.path + suffix
            try:
                session_id = _session_id(entry.name)
                st, ms = reader.stat_activity(path, os.path.basename(project) + "/" + entry.name)
            except (FileNotFoundError, NotADirectoryError, ValueError):
                continue
            if session_id in seen:
                raise SessionPersistenceCorruptionError(
                    f'duplicate JSONL session id "{session_id}" appears in multiple project directories: '
                    f"{seen[session_id]}, {path}"
                )
            seen[session_id] = path
            if since is not None and ms < since:
                continue
            if after is not None and (ms > after.key or (ms == after.key and session_id <= after.session_id)):
                continue
            out.append((-ms, session_id, path, st))
    return out


def _wanted(cand: _Candidate, root: str, query: ListQuery) -> bool:
    """The filters :func:`_candidates` applies while it scans, applied to a full scan's candidate."""
    ms, session_id = -cand[0], cand[1]
    if query.cwd is not None and os.path.dirname(os.path.dirname(cand[2])) != os.path.join(
        root, project_key(query.cwd)
    ):
        return False
    if query.since is not None and ms < query.since:
        return False
    after = query.after if query.order == "recent" else None
    return after is None or not (ms > after.key or (ms == after.key and session_id <= after.session_id))


def _in_order(cands: list[_Candidate], first: int) -> Iterator[_Candidate]:
    """Candidates in the "recent" order; the first ``first`` found by a partial selection, not a full sort."""
    if first < len(cands) // 4:
        head = heapq.nsmallest(first, cands)
        yield from head
        if len(head) < len(cands):
            # Rarely needed (unreadable or filtered-out headers on the page): sort the rest once.
            cut = head[-1] if head else None
            rest = sorted(c for c in cands if cut is None or c > cut)
            yield from rest
        return
    cands.sort()
    yield from cands


def _read_header(
    root: str, compression: Compression, cand: _Candidate, cap: int, checkpoint: Checkpoint
) -> SessionHeader | None:
    _neg, session_id, path, _st = cand
    try:
        listed = read_listed(path, compression, cap, checkpoint)
        if listed is None:
            return None
        check_identity(root, compression, path, listed.header, session_id)
    except (FileNotFoundError, NotAHeaderError, SessionPersistenceError):
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        return None  # a symlinked transcript is refused, never followed: left out here, reported by verify
    return listed.header


def list_rows(
    root: str,
    compression: Compression,
    query: ListQuery,
    cap: int,
    checkpoint: Checkpoint,
    keys: KeyProvider | None = None,
) -> list[SessionListing]:
    """Answer a listing query over ``root`` (see the module docstring for what each order costs); ``keys`` let
    the activity of sealed logs be read from their last batch."""
    reader = ActivityReader(compression, cap, keys)
    if query.order == "recent" and query.limit is not None:
        page = indexed_page(root, compression, query, cap, checkpoint, _read_header, reader)
        if page is not None:
            return page
        # The activity index is missing or could not be proved: scan every session (and rebuild it).
        cands = [c for c in rebuild(root, compression, checkpoint, reader) if _wanted(c, root, query)]
    else:
        reader.cached = cached_entries(root, compression)
        cands = _candidates(root, compression, query, checkpoint, reader)
    if query.order == "recent":
        rows: list[SessionListing] = []
        limit = query.limit
        for cand in _in_order(cands, len(cands) if limit is None else limit + 4):
            if limit is not None and len(rows) >= limit:
                break
            checkpoint()
            header = _read_header(root, compression, cand, cap, checkpoint)
            if header is None or not query.matches_header(header):
                continue
            rows.append(SessionListing(header, -cand[0], revision_of(cand[3])))
        return rows
    every: list[SessionListing] = []
    for cand in cands:
        checkpoint()
        header = _read_header(root, compression, cand, cap, checkpoint)
        if header is not None:
            every.append(SessionListing(header, -cand[0], revision_of(cand[3])))
    kept = sorted((row for row in every if query.matches(row)), key=query.order_key)
    return kept if query.limit is None else kept[: query.limit]


def delete_transcript(
    root: str, compression: Compression, session_id: str, expected_revision: str | None, checkpoint: Checkpoint
) -> None:
    """Unlink the transcript (one atomic step), make the removal durable, then tidy the empty directories."""
    path = find_transcript(root, session_id, compression, checkpoint)
    if path is None:
        raise SessionNotFoundError(session_id)
    session_dir = os.path.dirname(path)
    # Under the session's writer lease: a live writer in any process refuses the deletion (naming itself).
    lease = acquire_lease(root, session_dir, session_id)
    try:
        if expected_revision is not None and revision_of(os.stat(path)) != expected_revision:
            raise SessionChangedError(session_id)
        try:
            os.unlink(path)
        except FileNotFoundError:
            raise SessionNotFoundError(session_id) from None
        fsync_dir(session_dir)
        # The lock file goes while still locked: a writer that opened it meanwhile finds the inode gone
        # from the path and retries on a fresh one, so it can never lock a file nobody else can see.
        with contextlib.suppress(OSError):
            os.unlink(lease.path)
    finally:
        lease.release_sync()
    # The session directory goes too when nothing else lives in it; a leftover is harmless (lists as nothing).
    with contextlib.suppress(OSError):
        os.rmdir(session_dir)
        fsync_dir(os.path.dirname(session_dir))


def compact_transcript(path: str, session_id: str, data: bytes, expected_revision: str) -> None:
    """Replace the transcript with ``data`` (header + one batch) iff its revision is still ``expected_revision``.

    The new file keeps the old modification time: compaction is not activity, so it must not make an idle
    session look recent to ``list`` or spare it from ``prune``.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SessionNotFoundError(session_id) from None
    if revision_of(st) != expected_revision:
        raise SessionChangedError(session_id)
    replace_durable(path, data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # the restored time is metadata like any other: make it durable too
    finally:
        os.close(fd)


def list_artifacts(root: str, compression: Compression, checkpoint: Checkpoint) -> list[StoredArtifact]:
    """Every transcript file under ``root`` by name (any size, any content), sorted by path; nothing is opened.

    Flat-layout transcripts directly in a project directory are listed too (with ``session_id`` ``None``):
    they are artifacts this backend refuses to read.
    """
    name = TRANSCRIPT_STEM + suffix_for(compression)
    flat = (RAW_SUFFIX, ZSTD_SUFFIX)
    out: list[StoredArtifact] = []
    for project in sorted(entry.path for entry in child_dirs(root)):
        checkpoint()
        try:
            with os.scandir(project) as entries:
                children = sorted(entries, key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in children:
            try:
                session_id: str | None = decode_segment(entry.name)
            except ValueError:
                session_id = None
            if entry.is_dir(follow_symlinks=False):
                path = os.path.join(entry.path, name)
                try:
                    if not is_file(path):
                        continue
                except OSError as exc:
                    if exc.errno != errno.ELOOP:
                        raise
                    # A symlinked transcript: listed, so its refusal is reported for it alone.
                out.append(StoredArtifact(session_id, path))
            elif entry.is_symlink() and not entry.name.endswith(flat):
                # A symlinked session directory is never followed; listed, so it is reported, never silently gone.
                out.append(StoredArtifact(session_id, entry.path))
            elif entry.name.endswith(flat):
                out.append(StoredArtifact(None, entry.path))
    return out
