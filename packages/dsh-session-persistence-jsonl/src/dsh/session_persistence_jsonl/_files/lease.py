"""The JSONL writer lease: an exclusive kernel lock on ``session.lock`` in the session's directory.

``flock(LOCK_EX | LOCK_NB)`` on a descriptor of its own: the lock belongs to that open file description, so a
second writer is refused whether it is another process or another backend instance in this one, and the
kernel drops the lock when the holder closes it or dies (SIGKILL included): there is never a stale lock to
clean up. The holder writes its pid and host name into the file so that a refused writer can name it; that
text is informative only (the lock, not the text, decides). Taking the lease and writing (or reading) that text
happen under a short exclusive ``flock`` of the session directory itself, so a refused writer never reads the
file in the instant between the winner's lock and its write.

Blocking code for a worker thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Callable

from dsh.session_persistence.backend import SessionLockedError, SessionStorageError, UnsupportedOperationError

__all__ = ["LOCK_FILENAME", "JsonlWriterLease", "acquire_lease", "probe_holder", "read_holder"]

#: The lock file's name inside the session directory, next to the transcript.
LOCK_FILENAME = "session.lock"

_FILE_MODE = 0o600
_DIR_MODE = 0o700
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_HOLDER_MAX = 4096


def _describe(info: object) -> str | None:
    if not isinstance(info, dict):
        return None
    pid, host = info.get("pid"), info.get("host")
    if not isinstance(pid, int) or isinstance(pid, bool):
        return None
    return f"pid {pid} on {host}" if isinstance(host, str) and host else f"pid {pid}"


def read_holder(fd: int) -> str | None:
    """The holder a lock file names (``"pid 4242 on host-a"``), ``None`` if it names none readable."""
    try:
        raw = os.pread(fd, _HOLDER_MAX, 0)
        return _describe(json.loads(raw))
    except (OSError, ValueError):
        return None


#: The kernel's table of held locks (Linux): ``ID: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE START END``.
_PROC_LOCKS = "/proc/locks"


def _flock_held(st: os.stat_result) -> bool:
    """Whether the kernel lists an exclusive ``flock`` another process holds on the file ``st`` describes (waiters,
    ``->``, are not)."""
    try:
        with open(_PROC_LOCKS, encoding="ascii", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError as exc:
        raise UnsupportedOperationError(f"cannot read {_PROC_LOCKS} to see who holds a writer lease") from exc
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->" or fields[1] != "FLOCK" or fields[3] != "WRITE":
            continue
        try:
            if int(fields[4]) == os.getpid():
                continue  # this process's own lease (e.g. the CLI's repair): not another writer
            major, minor, inode = fields[5].split(":")
            if (int(major, 16), int(minor, 16), int(inode)) == want:
                return True
        except ValueError:
            continue
    return False


def probe_holder(session_dir: str) -> str | None:
    """Who holds the writer lease of the session kept in ``session_dir`` (its description, ``""`` if it names
    none), ``None`` when nobody does; never locks, creates or writes anything (a writer starting meanwhile is never
    refused because of this look). ``UnsupportedOperationError`` where the kernel's lock table cannot be read."""
    path = os.path.join(session_dir, LOCK_FILENAME)
    try:
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
    except FileNotFoundError:
        return None  # never leased (or the session directory is gone)
    except OSError as exc:
        raise SessionStorageError.from_os_error("reading the writer lease", exc, path) from exc
    try:
        if not _flock_held(os.fstat(fd)):
            return None
        return read_holder(fd) or ""
    finally:
        os.close(fd)


#: How long a refused writer waits for the holder's name to appear (a holder that locked the file but has not
#: written its name yet, for instance one that took the lease without the directory guard of an older build).
_HOLDER_WAIT_S = 0.2


def _await_holder(fd: int) -> str | None:
    """The holder named in the lock file, re-read for a short while if it names none yet."""
    deadline = time.monotonic() + _HOLDER_WAIT_S
    while True:
        holder = read_holder(fd)
        if holder is not None or time.monotonic() >= deadline:
            return holder
        time.sleep(0.002)


class JsonlWriterLease:
    """A held JSONL writer lease: the locked descriptor, closed (and so unlocked) by :meth:`release`."""

    def __init__(self, fd: int, path: str, holder: str, inode: int = 0) -> None:
        self._fd: int | None = fd
        #: The lock file's inode (the activity index knows this writer's lock by it).
        self.inode = inode
        self._lock = threading.Lock()
        self.path = path
        self._holder = holder
        self._on_release: list[Callable[[], None]] = []

    @property
    def holder(self) -> str:
        """This writer, as a refused one sees it (``"pid 4242 on host-a"``)."""
        return self._holder

    def on_release(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the lease is released, before the lock is dropped (it must not raise)."""
        self._on_release.append(callback)

    def release_sync(self) -> None:
        """Run the release callbacks, then close the descriptor, which releases the lock (idempotent)."""
        with self._lock:
            fd, self._fd = self._fd, None
            callbacks, self._on_release = self._on_release, []
        for callback in callbacks:
            callback()
        if fd is not None:
            os.close(fd)

    async def release(self) -> None:
        """Release the lease (closing one descriptor never blocks, so no worker thread is needed)."""
        self.release_sync()

    def __repr__(self) -> str:
        state = "released" if self._fd is None else "held"
        return f"<JsonlWriterLease {self.path!r} {state}>"


def _ensure_dirs(root: str, session_dir: str) -> None:
    """Create the missing directories from ``root`` down to ``session_dir`` (0700), never through a symlink."""
    missing: list[str] = []
    probe = session_dir
    while True:
        try:
            st = os.lstat(probe)
        except FileNotFoundError:
            missing.append(probe)
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
            continue
        if not stat.S_ISDIR(st.st_mode) and probe != root:
            raise NotADirectoryError(f'"{probe}" is not a directory')
        break
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, _DIR_MODE)


def acquire_lease(root: str, session_dir: str, session_id: str) -> JsonlWriterLease:
    """Take the exclusive writer lease of the session kept in ``session_dir``, or raise
    :class:`SessionLockedError` naming its holder at once (never waits)."""
    path = os.path.join(session_dir, LOCK_FILENAME)
    try:
        _ensure_dirs(root, session_dir)
        guard = os.open(session_dir, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC | _O_NOFOLLOW)
        try:
            # Held for a few system calls only (never while waiting for the other writer).
            fcntl.flock(guard, fcntl.LOCK_EX)
            return _acquire_locked(path, session_id)
        finally:
            os.close(guard)  # releases the guard
    except OSError as exc:
        raise SessionStorageError.from_os_error("taking the writer lease", exc, path) from exc


def _acquire_locked(path: str, session_id: str) -> JsonlWriterLease:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW, _FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _await_holder(fd)
            os.close(fd)
            raise SessionLockedError(session_id, holder) from None
        except BaseException:
            os.close(fd)
            raise
        # The locked inode must still be the one at the path (a removed session directory would
        # otherwise leave two writers locking two different files).
        try:
            current = os.stat(path, follow_symlinks=False)
            mine = os.fstat(fd)
        except FileNotFoundError:
            os.close(fd)
            continue
        if (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
            os.close(fd)
            continue
        host = socket.gethostname()
        pid = os.getpid()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": pid, "host": host}).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return JsonlWriterLease(fd, path, _describe({"pid": pid, "host": host}) or f"pid {pid}", mine.st_ino)
