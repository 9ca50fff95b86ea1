"""Listing through the activity index (``activity.py``): the proved first page, and the scan that rebuilds it.

Blocking code for worker threads.
"""

from __future__ import annotations

import contextlib
import copy
import heapq
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator

from dsh.session_persistence.backend import (
    ListQuery,
    SessionHeader,
    SessionListing,
    SessionPersistenceCorruptionError,
)

from .._format.frames import Compression
from . import activity, activity_writers
from .activity import RACY_NS, Entry, IndexState, Snapshot
from .activity_journal import JOURNAL_NAME
from .activity_key import ActivityReader
from .fs import revision_of
from .layout import TRANSCRIPT_STEM, child_dirs, decode_segment, project_dir_name, suffix_for
from .lease import LOCK_FILENAME

__all__ = ["Candidate", "cached_entries", "indexed_page", "rebuild"]

Checkpoint = Callable[[], None]
#: ``(-activity_ms, session_id, path, stat)``: a tuple sorts in the "recent" order without a key function.
Candidate = tuple[int, str, str, os.stat_result]
ReadHeader = Callable[[str, Compression, Candidate, int, Checkpoint], SessionHeader | None]
#: A listing rewrites the snapshot once it had to stat this many sessions, or read this much journal, itself.
REWRITE_FRESH = 256
REWRITE_JOURNAL_BYTES = 1 << 20
#: A proved page looks up the cached activity of at most this many sessions it stats itself (else reads logs).
FRESH_LOOKUPS = 32
#: Sessions changed since the sorted body was written are kept in front of it, unsorted, up to this many.
DELTA_MAX = 4096


def _session_id(name: str) -> str:
    return name if "~" not in name else decode_segment(name)


def _sort_key(entry: Entry) -> tuple[int, str]:
    return (-entry.activity, _session_id(entry.name))


def cached_entries(root: str, compression: Compression) -> dict[str, Entry]:
    """The index's entries by ``rel`` (any boot: a cached activity is used only while its ``stat`` matches), or
    none when the snapshot is missing or any of its lines fails its check."""
    snap = activity.load(root, compression, None)
    if snap is None:
        return {}
    try:
        return {e.rel: e for e in snap.all_entries()}
    except activity.IndexFormatError:
        return {}


def _duplicate(session_id: str, first: str, second: str) -> SessionPersistenceCorruptionError:
    return SessionPersistenceCorruptionError(
        f'duplicate JSONL session id "{session_id}" appears in multiple project directories: {first}, {second}'
    )


# --------------------------------------------------------------------------------------------------------------
# The full scan


def rebuild(root: str, compression: Compression, checkpoint: Checkpoint, reader: ActivityReader) -> list[Candidate]:
    """Every session with its ``stat`` and last activity, and a fresh snapshot of them for the next listing."""
    suffix = "/" + TRANSCRIPT_STEM + suffix_for(compression)
    boot = activity.boot_id()
    journal = activity_writers.journal_identity(root)
    now = time.time_ns()
    try:
        root_st = os.stat(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    if not reader.cached:
        reader.cached = cached_entries(root, compression)
    locks = activity_writers.held_locks(root_st.st_dev)  # before the journal: a writer that locks later announces later
    read = activity_writers.read_journal(root, 0) if journal is not None else None
    if read is None and journal is not None and journal[1]:
        # Not our records: start a new journal (writers create it again); live writers are found by their locks.
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(root, JOURNAL_NAME))
    if read is None:
        read = activity_writers.JournalRead([], 0, (0, 0), "", (0, 0))
    opens: activity_writers.Opens = {}
    activity_writers.fold_journal(opens, read.records)
    activity_writers.prune_dead(opens)
    projects: dict[str, tuple[int, int, int]] = {}
    entries: list[Entry] = []
    out: list[Candidate] = []
    seen: dict[str, str] = {}
    lock_inodes: dict[int, str] = {}
    for project in child_dirs(root):
        checkpoint()
        try:
            pst = os.stat(project.path)  # before its entries: a change after this moves its mtime
        except FileNotFoundError:
            continue
        projects[project.name] = (pst.st_mtime_ns, pst.st_ino, now)
        for entry in child_dirs(project.path):
            path = entry.path + suffix
            try:
                session_id = _session_id(entry.name)
                st, ms = reader.stat_activity(path, project.name + "/" + entry.name)
            except (FileNotFoundError, NotADirectoryError, ValueError):
                continue
            if session_id in seen:
                raise _duplicate(session_id, seen[session_id], path)
            seen[session_id] = path
            entries.append(Entry(st.st_mtime_ns, st.st_size, st.st_ino, ms, entry.inode(), project.name, entry.name))
            out.append((-ms, session_id, path, st))
            lock_ino = _lock_inode(entry.path)
            if lock_ino:
                lock_inodes[lock_ino] = project.name + "/" + entry.name
    if locks:
        # A session locked by a writer the journal does not name (a 0.2 writer) is looked at while it lives.
        host = socket.gethostname()
        for ino, pid in activity_writers.unknown_locks(locks, opens).items():
            rel = lock_inodes.get(ino)
            if rel is not None:
                opens.setdefault(rel, []).append([pid, host, ino])
    if boot is not None and journal is not None:
        state = IndexState(
            compression,
            boot,
            (*read.dev_ino, read.offset),
            (root_st.st_mtime_ns, root_st.st_ino, now),
            projects,
            opens,
            read.journal_id,
            read.tail,
            read.mtime_ns,
        )
        activity.write(root, state, entries, _sort_key, set(lock_inodes))
    return out


def _lock_inode(session_dir: str) -> int:
    try:
        return os.lstat(os.path.join(session_dir, LOCK_FILENAME)).st_ino
    except OSError:
        return 0


# --------------------------------------------------------------------------------------------------------------
# The proved page


def _projects_now(root: str, state: IndexState, now: int) -> tuple[dict[str, tuple[int, int, int]], set[str]]:
    """Project directories as they are, and the ones to read again (new, changed, or changed too recently)."""
    root_st = os.stat(root)
    rec = state.root
    if (root_st.st_mtime_ns, root_st.st_ino) != rec[:2] or rec[0] >= rec[2] - RACY_NS:
        names = [entry.name for entry in child_dirs(root)]
    else:
        names = list(state.projects)
    out: dict[str, tuple[int, int, int]] = {}
    changed: set[str] = set()
    for name in names:
        try:
            pst = os.lstat(os.path.join(root, name))
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(pst.st_mode):
            continue
        old = state.projects.get(name)
        if old is None or old[:2] != (pst.st_mtime_ns, pst.st_ino) or old[0] >= old[2] - RACY_NS:
            changed.add(name)
            out[name] = (pst.st_mtime_ns, pst.st_ino, now)
        else:
            out[name] = old
    return out, changed


class _Stale(Exception):
    """The snapshot cannot be proved: a full scan answers."""


def indexed_page(
    root: str,
    compression: Compression,
    query: ListQuery,
    cap: int,
    checkpoint: Checkpoint,
    read_header: ReadHeader,
    reader: ActivityReader,
) -> list[SessionListing] | None:
    """A "recent" page through the snapshot, proved as ``activity.py`` says; ``None``: scan instead."""
    boot = activity.boot_id()
    if boot is None or query.order != "recent" or query.limit is None:
        return None
    snap = activity.load(root, compression, boot)
    journal = activity_writers.journal_identity(root)
    if snap is None or journal is None:
        return None
    try:
        return _page(root, compression, query, cap, checkpoint, read_header, reader, snap, journal, boot)
    except (_Stale, FileNotFoundError, NotADirectoryError, activity.IndexFormatError, ValueError):
        return None
    finally:
        reader.lookup = None  # the scan that follows a refused snapshot must not look into it


def _page(
    root: str,
    compression: Compression,
    query: ListQuery,
    cap: int,
    checkpoint: Checkpoint,
    read_header: ReadHeader,
    reader: ActivityReader,
    snap: Snapshot,
    journal: tuple[int, int, int],
    boot: str,
) -> list[SessionListing]:
    state = snap.state
    dev, ino, start = state.journal
    if ino and ((dev, ino) != journal[:2] or journal[2] < start):
        raise _Stale  # the journal was replaced or shrank: records may be missing
    locks = activity_writers.held_locks(os.stat(root).st_dev)
    if ino:
        read = activity_writers.read_journal(root, start, state.journal_id, state.journal_tail)
    else:
        read = activity_writers.read_journal(root, 0)  # none then: one created since is read whole
    if read is None or (ino and read.dev_ino != (dev, ino)):
        raise _Stale  # not the journal read last time (recreated, truncated in place) or a record in doubt
    if ino and read.offset == start and read.mtime_ns != state.journal_mtime:
        raise _Stale  # written since, yet nothing after the point: its last records were cut
    start = start if ino else 0
    records, offset = read.records, read.offset
    opens = copy.deepcopy(state.opens)
    touched = activity_writers.fold_journal(opens, records)
    unknown = activity_writers.unknown_locks(locks, opens) if locks else {}
    if unknown and not unknown.keys().isdisjoint(snap.lock_inodes()):
        raise _Stale  # a live writer the journal does not name holds one of these sessions
    # Every session announced and not retired is stat'ed, a writer that died since included (its last write may
    # be newer than anything the snapshot saw); only then is the dead one forgotten.
    fresh_rels = touched | set(opens)
    announced = len(opens)
    activity_writers.prune_dead(opens)
    now = time.time_ns()
    projects, changed = _projects_now(root, state, now)
    present: dict[str, set[str]] = {}
    for project in changed:
        checkpoint()
        known = snap.names_in(project)
        names = present[project] = set()
        for entry in child_dirs(os.path.join(root, project)):
            names.add(entry.name)
            if known.get(entry.name) != entry.inode():  # new, or replaced (copied over, recreated)
                fresh_rels.add(project + "/" + entry.name)
    suffix = "/" + TRANSCRIPT_STEM + suffix_for(compression)
    # A session stat'ed here whose file is as the snapshot saw it keeps its cached activity (a scan of the bytes
    # per session: only for a few); any other is read from its log.
    reader.lookup = snap.find if len(fresh_rels) <= FRESH_LOOKUPS else None
    fresh: dict[str, tuple[Entry, os.stat_result]] = {}
    for rel in fresh_rels:
        project, _, name = rel.partition("/")
        if project not in projects or (project in present and name not in present[project]):
            continue
        try:
            _session_id(name)
            st, ms = reader.stat_activity(os.path.join(root, rel) + suffix, rel)
            dir_ino = os.lstat(os.path.join(root, rel)).st_ino
        except (FileNotFoundError, NotADirectoryError, ValueError):
            continue  # gone, or not a session's name (index damage met here is no ValueError: it scans)
        fresh[rel] = (Entry(st.st_mtime_ns, st.st_size, st.st_ino, ms, dir_ino, project, name), st)

    delta = snap.delta()
    superseded = {e.rel for e in delta}

    def alive(e: Entry) -> bool:
        if e.project not in projects or e.rel in fresh_rels:
            return False
        names = present.get(e.project)
        return names is None or e.name in names

    def alive_in_body(e: Entry) -> bool:
        return e.rel not in superseded and alive(e)

    stream = heapq.merge(
        filter(alive_in_body, snap.stream()), sorted(filter(alive, delta), key=_sort_key), key=_sort_key
    )

    heap: list[tuple[int, str, str, os.stat_result]] = [
        (-e.activity, _session_id(e.name), e.rel, st) for e, st in fresh.values()
    ]
    heapq.heapify(heap)
    repaired: dict[str, tuple[Entry, os.stat_result]] = {}
    reader.lookup = None
    rows = _emit(root, compression, query, cap, checkpoint, read_header, reader, heap, stream, repaired, suffix)
    pruned = len(opens) != announced
    if changed or repaired or pruned or len(fresh_rels) > REWRITE_FRESH or offset - start > REWRITE_JOURNAL_BYTES:
        updated = {**fresh, **repaired}
        new_delta = [e for e in delta if alive(e) and e.rel not in updated]
        new_delta.extend(e for e, _st in updated.values())
        root_st = os.stat(root)
        new_root = (root_st.st_mtime_ns, root_st.st_ino, now) if root_st.st_mtime_ns != state.root[0] else state.root
        new_state = IndexState(
            compression,
            boot,
            (*read.dev_ino, offset),
            new_root,
            projects,
            opens,
            read.journal_id,
            read.tail,
            read.mtime_ns,
        )
        lock_inodes = snap.lock_inodes()
        lock_inodes.update(_lock_inode(os.path.join(root, rel)) for rel in fresh)
        lock_inodes.discard(0)
        if len(new_delta) <= DELTA_MAX:
            activity.write_delta(root, new_state, snap, new_delta, lock_inodes)
        else:  # fold the delta into a sorted body again
            newer = {e.rel for e in new_delta}
            kept = [e for e in snap.stream() if e.rel not in newer and alive_in_body(e)]
            activity.write(root, new_state, [*kept, *new_delta], _sort_key, lock_inodes)
    return rows


def _emit(
    root: str,
    compression: Compression,
    query: ListQuery,
    cap: int,
    checkpoint: Checkpoint,
    read_header: ReadHeader,
    reader: ActivityReader,
    heap: list[tuple[int, str, str, os.stat_result]],
    stream: Iterator[Entry],
    repaired: dict[str, tuple[Entry, os.stat_result]],
    suffix: str,
) -> list[SessionListing]:
    """Merge the stat'ed sessions with the snapshot's order, stat'ing each snapshot entry before it is used."""
    limit = query.limit
    assert limit is not None
    wanted = project_dir_name(query.cwd) if query.cwd is not None else None
    head: Entry | None = next(stream, None)
    rows: list[SessionListing] = []
    emitted: dict[str, str] = {}
    last: tuple[int, str] | None = None
    while len(rows) < limit:
        head_key = _sort_key(head) if head is not None else None
        if heap and (head_key is None or heap[0][:2] <= head_key):
            neg, session_id, rel, st = heapq.heappop(heap)
        elif head is not None and head_key is not None:
            entry, head = head, next(stream, None)
            path = os.path.join(root, entry.rel) + suffix
            try:
                st = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if not entry.matches(st):
                try:
                    st, ms = reader.stat_activity(path, entry.rel)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                key = (-ms, head_key[1])
                if last is not None and key < last:
                    raise _Stale  # it belonged before a row already chosen: the snapshot lied
                repaired[entry.rel] = (
                    Entry(st.st_mtime_ns, st.st_size, st.st_ino, ms, entry.dir_ino, entry.project, entry.name),
                    st,
                )
                heapq.heappush(heap, (key[0], key[1], entry.rel, st))
                continue
            neg, session_id, rel = head_key[0], head_key[1], entry.rel
        else:
            break
        last = (neg, session_id)
        ms = -neg
        if query.since is not None and ms < query.since:
            break
        project = rel.partition("/")[0]
        if wanted is not None and project != wanted:
            continue
        after = query.after
        if after is not None and (ms > after.key or (ms == after.key and session_id <= after.session_id)):
            continue
        checkpoint()
        path = os.path.join(root, rel) + suffix
        if session_id in emitted and emitted[session_id] != path:
            raise _duplicate(session_id, emitted[session_id], path)
        header = read_header(root, compression, (neg, session_id, path, st), cap, checkpoint)
        if header is None or not query.matches_header(header):
            continue
        emitted[session_id] = path
        rows.append(SessionListing(header, ms, revision_of(st)))
    return rows
