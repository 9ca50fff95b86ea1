"""The activity index: a first "recent" page without a ``stat`` per session, never trusted over the logs.

``<root>/.dsh-activity.idx`` is a snapshot a listing writes: every session's last seen ``stat`` (mtime, size,
inode) and the last activity its log said then (``last_activity.py``: the time of its last event, the listing's
key), sorted newest first (with the sessions changed since in a short unsorted delta in front, so a rewrite never
re-sorts 100,000 lines), the inodes of the sessions' lock files, each project directory's ``stat``, the sessions
writers had announced and not retired (``activity_journal.py`` writes the journal, ``activity_writers.py`` reads it
back and looks at the kernel's locks), and how far into the journal it has read. A listing takes the snapshot as a
guess and proves it before trusting it:

* sessions the journal names after the snapshot's point, and sessions announced but not retired (a live writer,
  or one that crashed), are stat'ed, every time;
* a project directory whose ``stat`` changed (a session created, removed or copied in by anyone) is read again,
  and its new or replaced entries stat'ed; so is the root (a new project directory). A directory changed within
  :data:`RACY_NS` of when it was last read is always read again (coarse timestamps);
* a session whose lock file a writer the journal does not name holds (the kernel's lock table, Linux: a live 0.2
  writer) sends the listing to a full scan, which then looks at that session while the writer lives;
* every row returned is stat'ed: a row whose ``stat`` differs from the snapshot's is moved to its real place, and
  one that should already have been returned sends the listing to a full scan.

Every line of the snapshot and of the journal carries its CRC32 and the snapshot's header its line count, so a
changed byte or a cut (even at a line boundary) is damage; the journal's header names its instance, so a journal
recreated (even with the same inode number) or truncated in place is another journal. A missing, damaged or foreign
snapshot, one from another boot (the journal is never synced, so only a reboot can
lose its tail), a replaced journal, or no boot id at all: a full scan answers, and rewrites the snapshot. What the
index cannot see is a transcript changed in place, between two listings, by a program that keeps no journal and
holds no lock by then (a 0.2 writer that came and went): a listing with no limit (always a scan) has it in place,
the index has it after its next rebuild, and its row, whenever it is returned, carries its real ``stat``.

Blocking code for worker threads. Every write here is a cache write: not synced, and a failure is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .activity_journal import INDEX_NAME, checked, sealed_line
from .activity_writers import Opens

__all__ = [
    "RACY_NS",
    "Entry",
    "IndexFormatError",
    "IndexState",
    "Snapshot",
    "boot_id",
    "load",
    "write",
    "write_delta",
]

Checkpoint = Callable[[], None]
_VERSION = 2
#: A directory whose mtime is this close to when it was read may change without its mtime moving (coarse clocks).
RACY_NS = 2_000_000_000
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    try:
        with open(_BOOT_ID, encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class Entry:
    """One session as last seen: its transcript's ``stat``, its last activity (milliseconds, read from the log:
    ``last_activity.py``) and its directory's inode."""

    mtime_ns: int
    size: int
    ino: int
    activity: int
    dir_ino: int
    project: str
    name: str

    @property
    def rel(self) -> str:
        return self.project + "/" + self.name

    def matches(self, st: os.stat_result) -> bool:
        return st.st_mtime_ns == self.mtime_ns and st.st_size == self.size and st.st_ino == self.ino


@dataclass
class IndexState:
    """What a snapshot says besides its entries."""

    compression: str
    boot: str
    journal: tuple[int, int, int]  # (dev, ino, offset read)
    root: tuple[int, int, int]  # (mtime_ns, ino, read at ns)
    projects: dict[str, tuple[int, int, int]]  # name -> (mtime_ns, ino, read at ns)
    opens: Opens = field(default_factory=dict)
    #: The journal's instance id (its header line) and the (length, CRC32) of its line that ends at the offset
    #: read: a journal replaced, recreated or truncated in place no longer has them there.
    journal_id: str = ""
    journal_tail: tuple[int, int] = (0, 0)
    #: The journal's mtime when it was read: changed with nothing after the offset, its last records were cut.
    journal_mtime: int = 0


@dataclass
class Snapshot:
    state: IndexState
    data: bytes
    locks: int  # offset of the line of the sessions' lock file inodes
    delta_at: int  # offset of the first delta line: entries newer than the sorted body's, which they supersede
    body: int  # offset of the first line of the sorted body

    def lock_inodes(self) -> set[int]:
        """The inodes of the sessions' lock files (a lock on any other file is no session's writer)."""
        line = checked(self.data[self.locks : self.delta_at - 1])
        if line is None:
            raise IndexFormatError("bad index line")
        try:
            return set(map(int, line.split()))
        except ValueError as exc:
            raise IndexFormatError("bad index line") from exc

    def delta(self) -> list[Entry]:
        return [_parse(line) for line in self.data[self.delta_at : self.body].split(b"\n")[:-1]]

    def all_entries(self) -> list[Entry]:
        delta = self.delta()
        newer = {e.rel for e in delta}
        return [*delta, *(e for e in self.stream() if e.rel not in newer)]

    def names_in(self, project: str) -> dict[str, int]:
        """``name -> directory inode`` of the project's sessions, found by a scan of the bytes (nothing parsed
        but the project's own lines, each checked against its CRC)."""
        data, needle = self.data, b"\t" + project.encode("ascii") + b"\t"
        out: dict[str, int] = {}
        pos = self.body
        while (at := data.find(needle, pos)) >= 0:
            end = data.index(b"\n", at)
            entry = _parse(data[data.rindex(b"\n", 0, at) + 1 : end])
            if entry.project == project:  # else the needle matched another field (a name equal to the project)
                out[entry.name] = entry.dir_ino
            pos = end + 1
        out.update((e.name, e.dir_ino) for e in self.delta() if e.project == project)
        return out

    def find(self, rel: str) -> Entry | None:
        """The entry of ``rel`` (the delta's, which supersedes the body's), found by a scan of the bytes."""
        project, _, name = rel.partition("/")
        needle = f"\t{project}\t{name}\t".encode("utf-8", "surrogateescape")
        data, pos = self.data, self.delta_at
        while (at := data.find(needle, pos)) >= 0:
            end = data.index(b"\n", at)
            entry = _parse(data[data.rindex(b"\n", 0, at) + 1 : end])
            if entry.rel == rel:
                return entry
            pos = end + 1
        return None

    def stream(self) -> Iterator[Entry]:
        """Entries newest first, parsed (and checked) as they are consumed."""
        data, pos, end = self.data, self.body, len(self.data)
        while pos < end:
            nl = data.find(b"\n", pos)
            if nl < 0:
                return
            yield _parse(data[pos:nl])
            pos = nl + 1

    def entries(self) -> list[Entry]:
        return list(self.stream())


class IndexFormatError(Exception):
    """A snapshot line in doubt (its CRC fails, or it is not an entry): the listing scans instead.

    Not a ``ValueError`` on purpose: listings skip a session whose name is not one (a ``ValueError``), and a damaged
    line met while one session is looked at (its cached activity, ``Snapshot.find``) must not skip that session."""


def _parse(line: bytes) -> Entry:
    payload = checked(line)
    if payload is None:
        raise IndexFormatError("bad index line")  # a changed byte: the listing scans instead
    try:
        mtime, size, ino, activity, dino, project, name = payload.split(b"\t")
        return Entry(
            int(mtime),
            int(size),
            int(ino),
            int(activity),
            int(dino),
            project.decode("ascii"),
            name.decode("utf-8", "surrogateescape"),
        )
    except ValueError as exc:
        raise IndexFormatError("bad index line") from exc


def _ints(value: object, count: int) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) != count or not all(type(v) is int for v in value):
        raise IndexFormatError("bad index header")
    return tuple(value)


def load(root: str, compression: str, boot: str | None) -> Snapshot | None:
    """The snapshot, or ``None`` when it is missing, damaged (a line failing its CRC, a line too few or too many),
    of another encoding or from another boot (``boot`` ``None``: any boot, for a cache of what logs said)."""
    try:
        with open(os.path.join(root, INDEX_NAME), "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    nl = data.find(b"\n")
    try:
        payload = checked(data[:nl]) if nl > 0 else None
        head = json.loads(payload) if payload is not None else None
        if not isinstance(head, dict) or head.get("v") != _VERSION or not data.endswith(b"\n"):
            return None
        if head.get("compression") != compression or (boot is not None and head.get("boot") != boot):
            return None
        count, delta = head.get("count"), head.get("delta", 0)
        if type(count) is not int or type(delta) is not int or not 0 <= delta <= count:
            return None
        if data.count(b"\n") != 2 + count:
            return None  # a cut (even at a line boundary) or a line lost or added
        projects = head["projects"]
        opens = head["opens"]
        journal_id, tail, journal_mtime = head["jid"], head["jtail"], head["jmtime"]
        if not isinstance(projects, dict) or not isinstance(opens, dict) or not isinstance(journal_id, str):
            return None
        if type(journal_mtime) is not int:
            return None
        state = IndexState(
            compression,
            str(head.get("boot")),
            _ints(head["journal"], 3),  # type: ignore[arg-type]
            _ints(head["root"], 3),  # type: ignore[arg-type]
            {str(k): _ints(v, 3) for k, v in projects.items()},  # type: ignore[misc]
            {str(k): [list(_ints_any(w)) for w in v] for k, v in opens.items()},
            journal_id,
            _ints(tail, 2),  # type: ignore[arg-type]
            journal_mtime,
        )
        second = data.index(b"\n", nl + 1)
        if checked(data[nl + 1 : second]) is None:
            return None
        body = second + 1
        for _ in range(delta):
            body = data.index(b"\n", body) + 1
    except (IndexFormatError, ValueError, KeyError, TypeError):
        return None
    return Snapshot(state, data, nl + 1, second + 1, body)


def _ints_any(value: object) -> list[object]:
    if not isinstance(value, list) or len(value) != 3 or type(value[0]) is not int or type(value[2]) is not int:
        raise IndexFormatError("bad open record")
    return [value[0], str(value[1]), value[2]]


def _line(e: Entry) -> bytes:
    payload = f"{e.mtime_ns}\t{e.size}\t{e.ino}\t{e.activity}\t{e.dir_ino}\t{e.project}\t{e.name}"
    return sealed_line(payload.encode("utf-8", "surrogateescape"))


def _holdable(entries: list[Entry]) -> bool:
    return not any("\t" in e.name or "\n" in e.name or "\t" in e.project or "\n" in e.project for e in entries)


def write_delta(root: str, state: IndexState, snap: Snapshot, delta: list[Entry], lock_inodes: set[int]) -> None:
    """The snapshot with ``delta`` in front of its sorted body, which is copied as it is (nothing re-sorted)."""
    if _holdable(delta):
        body = snap.data[snap.body :]
        count = len(delta) + body.count(b"\n")
        _replace(root, _head(state, len(delta), count), lock_inodes, b"".join(map(_line, delta)), body)


def write(
    root: str,
    state: IndexState,
    entries: list[Entry],
    sort_key: Callable[[Entry], tuple[int, str]],
    lock_inodes: set[int],
) -> None:
    """Replace the snapshot (a cache: not synced; a failure leaves the old one, which is proved before use)."""
    if _holdable(entries):  # else names this line format cannot hold: no index, every listing scans
        body = b"".join(map(_line, sorted(entries, key=sort_key)))
        _replace(root, _head(state, 0, len(entries)), lock_inodes, b"", body)


def _head(state: IndexState, delta: int, count: int) -> dict[str, object]:
    return {
        "v": _VERSION,
        "compression": state.compression,
        "boot": state.boot,
        "journal": list(state.journal),
        "jid": state.journal_id,
        "jtail": list(state.journal_tail),
        "jmtime": state.journal_mtime,
        "root": list(state.root),
        "projects": {k: list(v) for k, v in state.projects.items()},
        "opens": state.opens,
        "delta": delta,
        "count": count,
    }


def _replace(root: str, head: dict[str, object], lock_inodes: set[int], delta: bytes, body: bytes) -> None:
    tmp = os.path.join(root, f"{INDEX_NAME}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            locks = " ".join(map(str, sorted(lock_inodes))).encode()
            data = sealed_line(json.dumps(head, separators=(",", ":")).encode()) + sealed_line(locks) + delta + body
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(root, INDEX_NAME))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
