"""The writers a listing must look at: the activity journal read back, and the kernel's locks no writer announced.

The reading half of ``activity_journal.py`` (which writers append to): :func:`read_journal` returns the complete
records after a point, refusing any doubt about which journal it is; :func:`fold_journal` applies them to the
sessions announced and not retired (:data:`Opens`); :func:`prune_dead` forgets this host's writers whose process is
gone. :func:`held_locks` reads the kernel's lock table (Linux) and :func:`unknown_locks` keeps the locks no
announced writer named: a writer that keeps no journal (a live 0.2 writer). The snapshot these feed is
``activity.py``.

Blocking code for worker threads.
"""

from __future__ import annotations

import os
import socket
import stat
import zlib
from dataclasses import dataclass

from .activity_journal import JOURNAL_NAME, checked, journal_header

__all__ = [
    "JournalRead",
    "Opens",
    "fold_journal",
    "held_locks",
    "journal_identity",
    "prune_dead",
    "read_journal",
    "unknown_locks",
]

#: ``rel -> [[pid, host, lock_ino], ...]``: announced, not retired.
Opens = dict[str, list[list[object]]]

_PROC_LOCKS = "/proc/locks"


def journal_identity(root: str) -> tuple[int, int, int] | None:
    """``(dev, ino, size)`` of the journal, ``(0, 0, 0)`` when there is none, ``None`` if it is not a file."""
    try:
        st = os.lstat(os.path.join(root, JOURNAL_NAME))
    except FileNotFoundError:
        return (0, 0, 0)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size) if stat.S_ISREG(st.st_mode) else None


@dataclass(frozen=True)
class JournalRead:
    """What a listing read of the journal: its complete records from the offset asked for, and where it stands."""

    records: list[list[str]]
    offset: int  # after the last complete record read
    dev_ino: tuple[int, int]  # (0, 0): there is no journal
    journal_id: str
    tail: tuple[int, int]  # (length, CRC32) of the line that ends at ``offset``
    mtime_ns: int = 0  # the journal's mtime, taken before it was read


def _tail_of(line: bytes) -> tuple[int, int]:
    return (len(line), zlib.crc32(line))


def read_journal(root: str, start: int, journal_id: str = "", tail: tuple[int, int] = (0, 0)) -> JournalRead | None:
    """The complete records after ``start`` (a record still being written is left for later); ``start`` 0 reads
    the journal from its header. ``None`` on any doubt: another journal than ``journal_id`` (replaced, recreated,
    truncated in place: its header is gone or names another instance), a line before ``start`` that is not the one
    read then (``tail``), a line failing its CRC or not one of ours. The index is then rebuilt by a full scan."""
    try:
        fd = os.open(os.path.join(root, JOURNAL_NAME), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return JournalRead([], 0, (0, 0), "", (0, 0)) if start == 0 else None
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        head = os.pread(fd, 4096, 0)
        nl = head.find(b"\n")
        ident = journal_header(head[:nl]) if nl > 0 else None
        if ident is None or (start and ident != journal_id):
            return None
        if start == 0:
            start, tail = nl + 1, _tail_of(head[: nl + 1])
        elif tail[0] <= 0 or tail[0] > start or st.st_size < start:
            return None  # shrunk below what was read: truncated in place
        elif _tail_of(os.pread(fd, tail[0], start - tail[0])) != tail:
            return None
        data = b""
        while chunk := os.pread(fd, 1 << 20, start + len(data)):
            data += chunk
    except OSError:
        return None
    finally:
        os.close(fd)
    cut = data.rfind(b"\n") + 1
    records: list[list[str]] = []
    lines = data[:cut].split(b"\n")[:-1]
    for line in lines:
        payload = checked(line)
        if payload is None:
            return None
        fields = payload.decode("utf-8", "surrogateescape").split("\t")
        if not ((fields[0] == "+" and len(fields) == 5) or (fields[0] == "-" and len(fields) == 3)):
            return None
        if not fields[2].isdigit() or (fields[0] == "+" and not fields[4].isdigit()):
            return None
        records.append(fields)
    if lines:
        tail = _tail_of(lines[-1] + b"\n")
    return JournalRead(records, start + cut, (st.st_dev, st.st_ino), ident, tail, st.st_mtime_ns)


def fold_journal(opens: Opens, records: list[list[str]]) -> set[str]:
    """Apply ``records`` to ``opens`` (in place); the sessions they name."""
    touched: set[str] = set()
    for fields in records:
        rel, pid = fields[1], int(fields[2])
        touched.add(rel)
        if fields[0] == "+":
            opens.setdefault(rel, []).append([pid, fields[3], int(fields[4])])
        else:
            writers = opens.get(rel, [])
            for i, writer in enumerate(writers):
                if writer[0] == pid:
                    del writers[i]
                    break
            if not writers:
                opens.pop(rel, None)
    return touched


def prune_dead(opens: Opens) -> None:
    """Forget announcements of writers on this host whose process is gone (their writes are over; the session is
    stat'ed this time anyway). Another host's writer, or a reused pid, keeps its session looked at: safe."""
    host = socket.gethostname()
    for rel in list(opens):
        alive = []
        for writer in opens[rel]:
            pid = writer[0]
            if writer[1] == host and isinstance(pid, int) and pid != os.getpid() and not _pid_alive(pid):
                continue
            alive.append(writer)
        if alive:
            opens[rel] = alive
        else:
            del opens[rel]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def held_locks(dev: int) -> dict[int, int] | None:
    """``inode -> pid`` of every exclusive ``flock`` on device ``dev`` (Linux), ``None`` where unknown."""
    try:
        with open(_PROC_LOCKS, encoding="ascii", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    out: dict[int, int] = {}
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[3] != "WRITE":
            continue
        where = fields[5]
        major, _, rest = where.partition(":")
        minor, _, inode = rest.partition(":")
        try:
            if (int(major, 16), int(minor, 16)) == (os.major(dev), os.minor(dev)):
                out[int(inode)] = int(fields[4])
        except ValueError:
            continue
    return out


def unknown_locks(locks: dict[int, int], opens: Opens) -> dict[int, int]:
    """The held locks no announced writer named as its own."""
    known = {int(w[2]) for writers in opens.values() for w in writers if isinstance(w[2], int)}
    return {ino: pid for ino, pid in locks.items() if ino not in known}
