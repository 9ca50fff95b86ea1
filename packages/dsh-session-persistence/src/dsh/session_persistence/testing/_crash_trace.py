"""Read a recorded system-call trace and rebuild every file-system state a power loss may leave.

The trace (written by the LD_PRELOAD shim's recording mode) lists, in order, every write (with its data and
offset), ftruncate, file fsync, directory fsync, creating open, link, rename and unlink under the recorded
paths. The model is the strict POSIX one, in the spirit of Jepsen's LazyFS: a file's bytes are durable only
up to its last fsync, a directory entry (a create, link, rename or unlink) only once its directory was
fsynced. At every crash point (after each traced call) the states generated are:

* ``synced``: every byte and entry not fsynced is lost;
* ``all``: everything reached the disk;
* ``names``: file contents as synced, a prefix of the un-synced directory operations applied;
* ``prefix``: the un-synced writes applied in order up to a cut inside one of them;
* ``drop-page``: every un-synced write landed except one 4 KiB page (the page keeps its old bytes, or
  zeros past the old end), and ``only-page``: only one page of them landed (later blocks reordered first);
* ``zero-tail``: the file sizes reached the disk but none of the written bytes did (zeros), and
  ``zero-sectors``: the same from a later sector (512-byte) boundary of the written range on (a disk loses
  whole sectors, never half of one);
* ``garbage-tail``: the same with random bytes instead of zeros.

Identical states are generated once per crash point (by content); callers that compare states across points
must key them by what was acknowledged at each point.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CrashState", "TraceRecord", "crash_states", "read_trace"]

PAGE = 4096
SECTOR = 512


@dataclass(frozen=True)
class TraceRecord:
    """One traced call: ``op`` is ``W`` write, ``T`` ftruncate, ``S`` file fsync, ``D`` directory fsync,
    ``C`` creating open (``arg`` 1 with ``O_TRUNC``), ``L`` link, ``R`` rename, ``U`` unlink."""

    op: str
    ino: int
    arg: int
    path: str
    path2: str
    data: bytes


def read_trace(path: str | os.PathLike[str]) -> list[TraceRecord]:
    """Parse a trace file written by the shim (a missing file is an empty trace)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    out: list[TraceRecord] = []
    pos = 0
    while pos < len(raw):
        end = raw.index(b"\n", pos)
        op, ino, arg, length, plen, p2len = raw[pos:end].decode().split(" ")
        pos = end + 1
        first, second, size = int(plen), int(p2len), int(length)
        path_text = raw[pos : pos + first].decode("utf-8", "surrogateescape")
        pos += first
        path2 = raw[pos : pos + second].decode("utf-8", "surrogateescape")
        pos += second
        data = raw[pos : pos + size]
        pos += size
        out.append(TraceRecord(op, int(ino), int(arg), path_text, path2, data))
    return out


@dataclass(frozen=True)
class CrashState:
    """The files a crash after ``point`` traced calls may leave: absolute path -> content."""

    point: int
    kind: str
    files: dict[str, bytes]

    def digest(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self.files):
            h.update(name.encode("utf-8", "surrogateescape") + b"\0")
            h.update(hashlib.sha256(self.files[name]).digest())
        return h.hexdigest()


@dataclass(eq=False)
class _Inode:
    durable: bytearray = field(default_factory=bytearray)
    current: bytearray = field(default_factory=bytearray)
    pending: list[tuple[str, int, bytes]] = field(default_factory=list)  # ("W", offset, data) | ("T", size, b"")


def _apply(content: bytearray, op: str, arg: int, data: bytes) -> None:
    if op == "T":
        del content[arg:]
        content.extend(bytes(max(0, arg - len(content))))
        return
    end = arg + len(data)
    if len(content) < end:
        content.extend(bytes(end - len(content)))
    content[arg:end] = data


@dataclass
class _Names:
    durable: dict[str, _Inode] = field(default_factory=dict)
    current: dict[str, _Inode] = field(default_factory=dict)
    pending: list[tuple[str, str, str, _Inode | None]] = field(default_factory=list)  # (dir, op, path, inode)


def _apply_name(names: dict[str, _Inode], op: str, path: str, inode: _Inode | None) -> None:
    if op == "unlink":
        names.pop(path, None)
    else:
        assert inode is not None
        names[path] = inode


class _Model:
    def __init__(self) -> None:
        self.by_ino: dict[int, _Inode] = {}
        self.names = _Names()

    def inode(self, ino: int) -> _Inode:
        found = self.by_ino.get(ino)
        if found is None:
            found = self.by_ino[ino] = _Inode()
        return found

    def name_op(self, directory: str, op: str, path: str, inode: _Inode | None) -> None:
        _apply_name(self.names.current, op, path, inode)
        self.names.pending.append((directory, op, path, inode))

    def step(self, record: TraceRecord) -> None:
        op = record.op
        if op == "C":
            if record.path not in self.names.current:
                inode = self.by_ino[record.ino] = _Inode()  # a new file (an inode number may be reused)
                self.name_op(os.path.dirname(record.path), "create", record.path, inode)
            if record.arg:
                self.content_op(self.names.current[record.path], "T", 0, b"")
        elif op in ("W", "T"):
            self.content_op(self.inode(record.ino), op, record.arg, record.data)
        elif op == "S":
            inode = self.inode(record.ino)
            inode.durable = bytearray(inode.current)
            inode.pending.clear()
        elif op == "D":
            keep = []
            for entry in self.names.pending:
                if entry[0] == record.path:
                    _apply_name(self.names.durable, entry[1], entry[2], entry[3])
                else:
                    keep.append(entry)
            self.names.pending = keep
        elif op in ("L", "R"):
            inode = self.names.current.get(record.path) or self.inode(record.ino)
            if op == "R":
                self.name_op(os.path.dirname(record.path), "unlink", record.path, None)
            self.name_op(os.path.dirname(record.path2), "link", record.path2, inode)
        elif op == "U":
            self.name_op(os.path.dirname(record.path), "unlink", record.path, None)

    @staticmethod
    def content_op(inode: _Inode, op: str, arg: int, data: bytes) -> None:
        _apply(inode.current, op, arg, data)
        inode.pending.append((op, arg, data))

    # ------------------------------------------------------------------------------------------------------
    # state generation at the current point

    def _files(self, names: dict[str, _Inode], contents: dict[_Inode, bytes]) -> dict[str, bytes]:
        return {path: contents.get(inode, bytes(inode.durable)) for path, inode in names.items()}

    def states(self, point: int, cuts: str, rng: random.Random) -> Iterator[CrashState]:
        names_now = dict(self.names.current)
        durable_names = dict(self.names.durable)
        yield CrashState(point, "synced", self._files(durable_names, {}))
        current = {inode: bytes(inode.current) for inode in set(names_now.values()) | set(durable_names.values())}
        yield CrashState(point, "all", self._files(names_now, current))
        partial = dict(durable_names)
        for _directory, op, path, inode in self.names.pending:
            _apply_name(partial, op, path, inode)
            yield CrashState(point, "names", self._files(dict(partial), {}))
        # In name order (never set order): the garbage bytes drawn from ``rng`` must not depend on hashing.
        reachable = dict.fromkeys([*names_now.values(), *durable_names.values()])
        dirty = [inode for inode in reachable if inode.pending]
        for inode in dirty:
            for namespace in (names_now, durable_names):
                if inode not in namespace.values():
                    continue
                for kind, content in _content_variants(inode, cuts, rng):
                    yield CrashState(point, kind, self._files(namespace, {inode: content}))


def _cut_points(size: int, cuts: str) -> list[int]:
    if size <= 1:
        return []
    if cuts == "all":
        return list(range(1, size))
    points = {1, size // 2, size - 1} | set(range(SECTOR, size, SECTOR))
    return sorted(p for p in points if 0 < p < size)


def _content_variants(inode: _Inode, cuts: str, rng: random.Random) -> Iterator[tuple[str, bytes]]:
    base = bytes(inode.durable)
    ops = inode.pending
    # prefix: ops[:i] applied whole, then (for a write) a cut inside op i
    for index, (op, arg, data) in enumerate(ops):
        before = bytearray(base)
        for earlier in ops[:index]:
            _apply(before, *earlier)
        if index:
            yield "prefix", bytes(before)
        if op != "W":
            continue
        for cut in _cut_points(len(data), cuts):
            content = bytearray(before)
            _apply(content, "W", arg, data[:cut])
            yield "prefix", bytes(content)
    full = bytearray(base)
    for pending in ops:
        _apply(full, *pending)
    written: set[int] = set()  # byte offsets whose final content comes from a pending write
    for op, arg, data in ops:
        if op == "W":
            written.update(range(arg, arg + len(data)))
    written = {o for o in written if o < len(full)}
    if not written:
        return
    pages = sorted({o // PAGE for o in written})

    def revert(content: bytearray, offsets: set[int], filler: bytes | None) -> None:
        for o in offsets:
            if filler is not None:
                content[o] = filler[o % len(filler)]
            else:
                content[o] = base[o] if o < len(base) else 0

    for page in pages:
        in_page = {o for o in written if o // PAGE == page}
        if len(pages) > 1:
            dropped = bytearray(full)
            revert(dropped, in_page, None)
            yield "drop-page", bytes(dropped)
            only = bytearray(full)
            revert(only, written - in_page, None)
            yield "only-page", bytes(only)
    ordered = sorted(written)
    # A disk writes whole sectors: the unsynced bytes are lost from a sector boundary on, never mid-sector.
    keeps = [0, *(index for index, offset in enumerate(ordered) if index and offset % SECTOR == 0)]
    for keep in keeps:
        lost = set(ordered[keep:])
        zero = bytearray(full)
        revert(zero, lost, b"\0")
        yield ("zero-sectors" if keep else "zero-tail"), bytes(zero)
        if keep in (0, keeps[len(keeps) // 2]):
            garbage = bytearray(full)
            revert(garbage, lost, bytes(rng.randrange(1, 256) for _ in range(251)))
            yield "garbage-tail", bytes(garbage)


def crash_states(records: list[TraceRecord], *, cuts: str = "sample", seed: int = 0) -> Iterator[CrashState]:
    """Every distinct state a crash after each traced call may leave (``cuts="all"``: cut every byte)."""
    rng = random.Random(seed)
    model = _Model()
    for point in range(len(records) + 1):
        if point:
            model.step(records[point - 1])
        seen: set[str] = set()
        for state in model.states(point, cuts, rng):
            digest = state.digest()
            if digest not in seen:
                seen.add(digest)
                yield state
