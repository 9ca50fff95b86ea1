"""The writer half of the activity index: announce a session before writing it, retire it when done.

The activity index (``activity.py``) is a cache that lets a listing skip the ``stat`` of sessions nobody wrote to
since it last looked. What makes that safe is this journal, ``<root>/.dsh-activity.log``: before an instance's first
write to a session it appends ``+`` for it, and after its last (the writer lease's release, or ``aclose``) ``-``. A
listing stats every session with a ``+`` it has not seen retired, and every session named after the point it last
read, so a writer that crashes mid-session (no ``-``) keeps its session looked at, never hidden.

The journal is never synced: only a machine crash can lose its tail, and the index is refused after a reboot (the
boot id). Its first line names the file: a random instance id, written when the file is created (a staging file
linked into place, so no record ever precedes it), which a journal truncated in place loses and a journal recreated
(even with the same inode number) changes. Every line carries its CRC32, so a changed byte is never read as a
record; a listing that finds any of this wrong scans instead (``activity.py``). A record is one ``write`` of one
short line on an ``O_APPEND`` descriptor, outside every durable step: it is written before the write it announces,
never inside the fsync path. If the journal cannot be written, the
index is removed instead (the next listing rebuilds it from the logs), and the write it announces goes ahead.

Blocking code for worker threads.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import zlib

__all__ = ["INDEX_NAME", "JOURNAL_NAME", "ActivityJournal", "checked", "journal_header", "sealed_line", "session_rel"]

#: The index (a snapshot a listing writes) and the journal (records writers append), both in the root.
INDEX_NAME = ".dsh-activity.idx"
JOURNAL_NAME = ".dsh-activity.log"

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_JOURNAL_MAGIC = b"dsh-activity-journal\t2\t"


def sealed_line(payload: bytes) -> bytes:
    """``payload`` (no tab-CRC suffix, no newline) as one line of the journal or the index: ``payload<TAB>crc\n``."""
    return payload + b"\t%08x\n" % zlib.crc32(payload)


def checked(line: bytes | memoryview) -> bytes | None:
    """The payload of one line (without its newline) whose CRC32 holds, else ``None``."""
    line = bytes(line)
    if len(line) < 9 or line[-9:-8] != b"\t":
        return None
    payload = line[:-9]
    return payload if line[-8:] == b"%08x" % zlib.crc32(payload) else None


def journal_header(line: bytes) -> str | None:
    """The instance id a journal's first line (without its newline) names, ``None`` if it is not our header."""
    payload = checked(line)
    if payload is None or not payload.startswith(_JOURNAL_MAGIC):
        return None
    ident = payload[len(_JOURNAL_MAGIC) :]
    return ident.decode("ascii") if len(ident) == 32 and ident.isalnum() else None


def session_rel(root: str, transcript: str) -> str:
    """``<project>/<segment>``: the session directory of ``transcript``, relative to ``root``."""
    session_dir = os.path.dirname(transcript)
    return os.path.basename(os.path.dirname(session_dir)) + "/" + os.path.basename(session_dir)


class ActivityJournal:
    """One backend instance's announcements (thread-safe; every method swallows storage errors)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.path = os.path.join(root, JOURNAL_NAME)
        self._host = socket.gethostname().replace("\t", " ").replace("\n", " ")
        # rel -> [records written, the lock inode last named]
        self._open: dict[str, list[int]] = {}
        # transcript -> its rel, while announced and not retired: a write announced already costs one look-up.
        self._rels: dict[str, str] = {}
        self._lock = threading.Lock()

    def announce(self, transcript: str, lock_ino: int = 0) -> None:
        """Before the first write of this instance to the session of ``transcript`` (until it is retired), and
        when it takes the session's writer lease (``lock_ino``: a listing knows that lock as this writer's)."""
        rel = self._rels.get(transcript)
        if rel is not None and not lock_ino and rel in self._open:
            return  # every durable step of an announced session: nothing changed, nothing to write
        rel = session_rel(self.root, transcript)
        with self._lock:
            self._rels[transcript] = rel
            known = self._open.get(rel)
            if known is not None and (not lock_ino or lock_ino == known[1]):
                return
            if known is None:
                self._open[rel] = [1, lock_ino]
            else:
                known[0] += 1
                known[1] = lock_ino
        if not self._append(f"+\t{rel}\t{os.getpid()}\t{self._host}\t{lock_ino}", announce=True):
            with self._lock:
                self._open.pop(rel, None)  # announced again before the next write
                self._rels.pop(transcript, None)

    def retire(self, transcript: str) -> None:
        """After the last write of this instance to the session of ``transcript`` (its lease is released)."""
        rel = session_rel(self.root, transcript)
        with self._lock:
            self._rels.pop(transcript, None)
            known = self._open.pop(rel, None)
        if known is not None:
            self._append(*[f"-\t{rel}\t{os.getpid()}"] * known[0], announce=False)

    def retire_all(self) -> None:
        with self._lock:
            known, self._open = self._open, {}
            self._rels = {}
        if known:
            pid = os.getpid()
            lines = [f"-\t{rel}\t{pid}" for rel, (n, _ino) in sorted(known.items()) for _ in range(n)]
            self._append(*lines, announce=False)

    def _journal_fd(self) -> int:
        """The journal for appending; created first (its header line in place before any record) if missing."""
        flags = os.O_WRONLY | os.O_APPEND | _O_CLOEXEC | _O_NOFOLLOW
        try:
            return os.open(self.path, flags)
        except FileNotFoundError:
            pass
        tmp = f"{self.path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC | _O_NOFOLLOW, 0o600)
        try:
            try:
                os.write(fd, sealed_line(_JOURNAL_MAGIC + secrets.token_hex(16).encode()))
            finally:
                os.close(fd)
            with contextlib.suppress(FileExistsError):  # another writer created it first: append to theirs
                os.link(tmp, self.path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return os.open(self.path, flags)

    def _append(self, *lines: str, announce: bool) -> bool:
        data = b"".join(sealed_line(line.encode("utf-8", "surrogateescape")) for line in lines)
        try:
            fd = self._journal_fd()
            try:
                os.write(fd, data)  # one short line: one write, appended whole
                return True
            finally:
                os.close(fd)
        except FileNotFoundError:
            # No root yet: nothing to index, and the session this first write creates changes its project
            # directory, which every listing checks. (The root is never created here: a refused write leaves none.)
            return False
        except OSError:
            pass
        if announce:
            # A writer the journal does not name must not be hidden by the index: drop the index, a listing
            # rebuilds it from the logs. (A lost retirement is harmless: the session is only looked at longer.)
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.root, INDEX_NAME))
        return False
