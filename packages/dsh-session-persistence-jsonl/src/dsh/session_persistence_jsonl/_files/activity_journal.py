"""The writer half of the activity index: announce a session before writing it, retire it when done.

The activity index (``activity.py``) is a cache that lets a listing skip the ``stat`` of sessions nobody wrote to
since it last looked. What makes that safe is this journal, ``<root>/.dsh-activity.log``: before an instance's first
write to a session it appends ``+`` for it, and after its last (the writer lease's release, or ``aclose``) ``-``. A
listing stats every session with a ``+`` it has not seen retired, and every session named after the point it last
read, so a writer that crashes mid-session (no ``-``) keeps its session looked at, never hidden.

The journal is never synced: only a machine crash can lose its tail, and the index is refused after a reboot (the
boot id). A record is one ``write`` of one short line on an ``O_APPEND`` descriptor, outside every durable step:
it is written before the write it announces, never inside the fsync path. If the journal cannot be written, the
index is removed instead (the next listing rebuilds it from the logs), and the write it announces goes ahead.

Blocking code for worker threads.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading

__all__ = ["INDEX_NAME", "JOURNAL_NAME", "ActivityJournal", "session_rel"]

#: The index (a snapshot a listing writes) and the journal (records writers append), both in the root.
INDEX_NAME = ".dsh-activity.idx"
JOURNAL_NAME = ".dsh-activity.log"

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


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
        self._lock = threading.Lock()

    def announce(self, transcript: str, lock_ino: int = 0) -> None:
        """Before the first write of this instance to the session of ``transcript`` (until it is retired), and
        when it takes the session's writer lease (``lock_ino``: a listing knows that lock as this writer's)."""
        rel = session_rel(self.root, transcript)
        with self._lock:
            known = self._open.get(rel)
            if known is not None and (not lock_ino or lock_ino == known[1]):
                return
            if known is None:
                self._open[rel] = [1, lock_ino]
            else:
                known[0] += 1
                known[1] = lock_ino
        if not self._append(f"+\t{rel}\t{os.getpid()}\t{self._host}\t{lock_ino}\n", announce=True):
            with self._lock:
                self._open.pop(rel, None)  # announced again before the next write

    def retire(self, transcript: str) -> None:
        """After the last write of this instance to the session of ``transcript`` (its lease is released)."""
        rel = session_rel(self.root, transcript)
        with self._lock:
            known = self._open.pop(rel, None)
        if known is not None:
            self._append(f"-\t{rel}\t{os.getpid()}\n" * known[0], announce=False)

    def retire_all(self) -> None:
        with self._lock:
            known, self._open = self._open, {}
        if known:
            pid = os.getpid()
            self._append("".join(f"-\t{rel}\t{pid}\n" * n for rel, (n, _ino) in sorted(known.items())), announce=False)

    def _append(self, line: str, *, announce: bool) -> bool:
        data = line.encode("utf-8", "surrogateescape")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW, 0o600)
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
