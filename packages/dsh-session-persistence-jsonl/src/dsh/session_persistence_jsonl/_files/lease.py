"""The JSONL writer lease: a kernel lock on the session directory, and ``session.lock`` beside the transcript.

Two locks, taken together under a short exclusive ``flock`` of the session directory (the *guard*, which 0.2
writers take the same way, held for a few system calls only):

* **The anchor**, which decides among 0.3 writers: an open-file-description (OFD) ``fcntl`` read lock on the
  session directory itself, held for the lease's lifetime. A file beside the transcript can be deleted or
  replaced while it is locked, and a lock on it then protects nothing: a second writer creates a fresh file,
  locks that, and writes (issue 25: 12 of 12 runs). The directory cannot be removed while the session lives in
  it, so a lock on it cannot be taken away that way. A directory cannot be opened for writing, so the anchor
  is a *read* lock, and read locks do not exclude each other by themselves: a writer asks the kernel, under
  the guard, whether anyone holds one (``F_OFD_GETLK`` for a write lock) and takes its own only if nobody
  does. The guard makes that test-and-take atomic among writers, so two writers can never both hold the
  anchor. It is an OFD lock, not ``flock``, because 0.2 writers take the guard with a *blocking*
  ``flock(LOCK_EX)`` on the same directory: an ``flock`` held for the lease's lifetime would hang them, while
  OFD and ``flock`` locks never conflict on Linux. An OFD lock belongs to its open file description, so a
  second backend instance in this process is refused too, and the kernel drops it when the holder closes it
  or dies (SIGKILL included): there is never a stale lock to clean up.
* **``session.lock``**, ``flock(LOCK_EX | LOCK_NB)`` on a descriptor of its own, exactly as 0.2 takes it, so a
  0.2 writer and a 0.3 writer of one session refuse each other (a 0.2 writer knows nothing of the anchor).
  The holder writes its pid and host name into the file so that a refused writer can name it; that text is
  informative only (the locks, not the text, decide), so failing to write it never fails the lease.

A *0.2* writer looks only at ``session.lock``, so while that file is deleted or replaced one can still get in.
The holder narrows that to the moment between the deletion and its own next write: before every write it checks
(one ``fstat``) that its lock file still has a name, and if not it locks a fresh one under the guard
(:meth:`JsonlWriterLease.keep`); if a 0.2 writer locked the path first, the write is refused with
``SessionLockedError`` instead of two writers writing. Stop 0.2 writers before anyone touches lock files.

Blocking code for a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import stat
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable

from dsh.session_persistence.backend import SessionLockedError, SessionStorageError, UnsupportedOperationError

__all__ = ["LOCK_FILENAME", "JsonlWriterLease", "acquire_lease", "probe_holder", "read_holder"]

#: The lock file's name inside the session directory, next to the transcript.
LOCK_FILENAME = "session.lock"

_log = logging.getLogger("dsh.session_persistence_jsonl")

_FILE_MODE = 0o600
_DIR_MODE = 0o700
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_HOLDER_MAX = 4096

# The anchor's lock calls (Linux 3.15+); where they are missing the lease is the lock file alone, as in 0.2.
_OFD_GETLK: int | None = getattr(fcntl, "F_OFD_GETLK", None)
_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)
# ``struct flock``: l_type, l_whence, l_start, l_len, l_pid (native layout), padded for the kernel's copy.
_FLOCK = "@hhqqi"
_FLOCK_PAD = b"\0" * 16


def _flock_arg(kind: int) -> bytes:
    # The whole directory (start 0, length 0 = to the end); l_pid must be 0 for OFD locks.
    return struct.pack(_FLOCK, kind, os.SEEK_SET, 0, 0, 0) + _FLOCK_PAD


def _anchor_held(dir_fd: int) -> bool:
    """Whether any other open file description holds the anchor of the directory ``dir_fd`` is open on."""
    assert _OFD_GETLK is not None
    answer = fcntl.fcntl(dir_fd, _OFD_GETLK, _flock_arg(fcntl.F_WRLCK))
    kind: int = struct.unpack_from(_FLOCK, answer)[0]
    return kind != fcntl.F_UNLCK


#: This process's anchors by directory (dev, ino): the kernel lists OFD locks without their process (pid -1), so
#: the probe subtracts these to tell another writer from this process's own lease. The lock also orders the probe
#: against this process taking or dropping an anchor.
_own_anchors: Counter[tuple[int, int]] = Counter()
_own_lock = threading.Lock()


def _ident(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


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


def _lock_table() -> list[list[str]]:
    try:
        with open(_PROC_LOCKS, encoding="ascii", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError as exc:
        raise UnsupportedOperationError(f"cannot read {_PROC_LOCKS} to see who holds a writer lease") from exc
    # Waiters (``->``) hold nothing.
    return [f for f in (line.split() for line in lines) if len(f) >= 6 and f[1] != "->"]


def _table_ident(field: str) -> tuple[int, int, int] | None:
    try:
        major, minor, inode = field.split(":")
        return (int(major, 16), int(minor, 16), int(inode))
    except ValueError:
        return None


def _kernel_ident(st: os.stat_result) -> tuple[int, int, int]:
    return (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)


def _held_elsewhere(file_st: os.stat_result | None, dir_st: os.stat_result) -> tuple[bool, bool]:
    """(another writer holds the lease, the lock file at the path is the one locked): an exclusive ``flock`` on
    the lock file held by another process, or more anchors on the directory than this process holds."""
    want_file = _kernel_ident(file_st) if file_st is not None else None
    want_dir = _kernel_ident(dir_st)
    with _own_lock:
        rows = _lock_table()
        own = _own_anchors[_ident(dir_st)]
    file_locked = file_elsewhere = False
    anchors = 0
    for fields in rows:
        where = _table_ident(fields[5])
        if fields[1] == "FLOCK" and fields[3] == "WRITE" and where is not None and where == want_file:
            file_locked = True
            # This process's own lease (e.g. the CLI's repair) is not another writer.
            file_elsewhere = file_elsewhere or fields[4] != str(os.getpid())
        elif fields[1] == "OFDLCK" and fields[3] == "READ" and where == want_dir:
            anchors += 1
    return (file_elsewhere or anchors > own, file_locked)


def probe_holder(session_dir: str) -> str | None:
    """Who holds the writer lease of the session kept in ``session_dir`` (its description, ``""`` if it names
    none), ``None`` when nobody does; never locks, creates or writes anything (a writer starting meanwhile is never
    refused because of this look). ``UnsupportedOperationError`` where the kernel's lock table cannot be read."""
    path = os.path.join(session_dir, LOCK_FILENAME)
    try:
        dir_fd = os.open(session_dir, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC | _O_NOFOLLOW)
    except FileNotFoundError:
        return None  # never leased (or the session directory is gone)
    except OSError as exc:
        raise SessionStorageError.from_os_error("reading the writer lease", exc, session_dir) from exc
    try:
        try:
            fd: int | None = os.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
        except FileNotFoundError:
            fd = None  # deleted under a holder, or never leased: the anchor tells
        except OSError as exc:
            raise SessionStorageError.from_os_error("reading the writer lease", exc, path) from exc
        try:
            held, named = _held_elsewhere(os.fstat(fd) if fd is not None else None, os.fstat(dir_fd))
            if not held:
                return None
            # Only a locked lock file's text names the holder (a replaced one names whoever wrote it).
            return (read_holder(fd) if fd is not None and named else None) or ""
        finally:
            if fd is not None:
                os.close(fd)
    finally:
        os.close(dir_fd)


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
    """A held JSONL writer lease: the locked descriptors, closed (and so unlocked) by :meth:`release`."""

    def __init__(
        self, fd: int, path: str, holder: str, anchor: int | None = None, session_id: str = "", inode: int = 0
    ) -> None:
        self._fd: int | None = fd
        self._anchor = anchor
        self._session_id = session_id
        #: The lock file's inode when the lease was taken (the activity index knows this writer's lock by it).
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
        """Run the release callbacks, then close the descriptors, which releases the locks (idempotent)."""
        with self._lock:
            fd, self._fd = self._fd, None
            anchor, self._anchor = self._anchor, None
            callbacks, self._on_release = self._on_release, []
        for callback in callbacks:
            callback()
        if fd is not None:
            os.close(fd)
        if anchor is not None:
            _drop_anchor(anchor)

    def keep(self) -> None:
        """Before a write under this lease: put ``session.lock`` back if it was deleted or replaced (its inode has
        no name left), locked by this lease again, so that a 0.2 writer, which sees only that file, is refused
        again. :class:`SessionLockedError` (and nothing written) if a 0.2 writer locked the path meanwhile.

        One ``fstat`` while the file is in place. 0.3 writers need none of this: the anchor refuses them.
        """
        with self._lock:
            fd, anchor = self._fd, self._anchor
            if fd is None or anchor is None or os.fstat(fd).st_nlink > 0:
                return
            self._fd = _relock(anchor, self.path, self._session_id)
            os.close(fd)

    @property
    def anchored(self) -> bool:
        """Whether this lease holds the session directory's anchor (Linux) besides ``session.lock``."""
        return self._anchor is not None

    async def release(self) -> None:
        """Release the lease (closing descriptors never blocks, so no worker thread is needed)."""
        self.release_sync()

    def __repr__(self) -> str:
        state = "released" if self._fd is None else "held"
        return f"<JsonlWriterLease {self.path!r} {state}>"


def _take_anchor(dir_fd: int, dir_st: os.stat_result) -> None:
    assert _OFD_SETLK is not None
    with _own_lock:
        fcntl.fcntl(dir_fd, _OFD_SETLK, _flock_arg(fcntl.F_RDLCK))
        _own_anchors[_ident(dir_st)] += 1


def _uncount(dir_st: os.stat_result) -> None:
    key = _ident(dir_st)
    _own_anchors[key] -= 1
    if _own_anchors[key] <= 0:
        del _own_anchors[key]


def _forget_anchor(dir_st: os.stat_result) -> None:
    with _own_lock:
        _uncount(dir_st)


def _drop_anchor(dir_fd: int) -> None:
    # Uncounted and unlocked in one step, as the probe sees it.
    with _own_lock:
        try:
            _uncount(os.fstat(dir_fd))
        finally:
            os.close(dir_fd)


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
        while True:
            _ensure_dirs(root, session_dir)
            dir_fd = os.open(session_dir, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC | _O_NOFOLLOW)
            try:
                # The guard: held for a few system calls only (never while waiting for the other writer).
                fcntl.flock(dir_fd, fcntl.LOCK_EX)
                lease = _acquire_guarded(dir_fd, session_dir, path, session_id)
            except BaseException:
                os.close(dir_fd)  # releases the guard
                raise
            if lease is None:
                os.close(dir_fd)  # the directory was removed meanwhile (a deletion): start again
                continue
            try:
                if lease.anchored:
                    # The guard goes; the anchor, an OFD lock on the same descriptor, stays (they never interact).
                    fcntl.flock(dir_fd, fcntl.LOCK_UN)
                else:
                    os.close(dir_fd)
            except BaseException:
                lease.release_sync()
                raise
            return lease
    except OSError as exc:
        raise SessionStorageError.from_os_error("taking the writer lease", exc, path) from exc


def _acquire_guarded(dir_fd: int, session_dir: str, path: str, session_id: str) -> JsonlWriterLease | None:
    """Under the guard: the lease, ``None`` if the directory locked is no longer the one at the path."""
    try:
        dir_st = os.fstat(dir_fd)
        if _ident(os.lstat(session_dir)) != _ident(dir_st):
            return None
    except FileNotFoundError:
        return None
    anchored = _OFD_GETLK is not None and _OFD_SETLK is not None
    if anchored and _anchor_held(dir_fd):
        raise SessionLockedError(session_id, _named_holder(path)) from None
    fd = _lock_file_at(path, session_id, _await_holder)
    if fd is None:
        return None  # the directory went after the check above (a deletion finishing): start again
    try:
        inode = os.fstat(fd).st_ino
        if anchored:
            _take_anchor(dir_fd, dir_st)
        try:
            holder = _write_holder(fd, path)
        except BaseException:  # not an OSError (those are only logged): interrupted, give everything back
            if anchored:
                _forget_anchor(dir_st)  # the lock itself goes with the descriptor, which the caller closes
            raise
    except BaseException:
        os.close(fd)
        raise
    return JsonlWriterLease(fd, path, holder, dir_fd if anchored else None, session_id, inode)


def _relock(dir_fd: int, path: str, session_id: str) -> int:
    """Under the guard, lock the file at ``path`` (created if missing) for a holder of the anchor ``dir_fd``."""
    fcntl.flock(dir_fd, fcntl.LOCK_EX)  # the guard: 0.2 writers take the file under it too
    try:
        fd = _lock_file_at(path, session_id, read_holder)
        if fd is None:  # the session directory is gone under a live lease
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        try:
            _write_holder(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return fd
    finally:
        fcntl.flock(dir_fd, fcntl.LOCK_UN)


def _lock_file_at(path: str, session_id: str, name_holder: Callable[[int], str | None]) -> int | None:
    """The lock file at ``path`` (created if missing), locked exclusively without waiting: its descriptor once the
    locked inode is still the one at the path (a writer that skipped the guard, or a deletion, can replace it
    between the open and the lock: then the new one is tried); ``None`` if the directory is gone;
    :class:`SessionLockedError` naming ``name_holder(fd)`` if another writer holds it."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW, _FILE_MODE)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = name_holder(fd)
            os.close(fd)
            raise SessionLockedError(session_id, holder) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = _ident(os.stat(path, follow_symlinks=False)) == _ident(os.fstat(fd))
        except FileNotFoundError:
            same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            return fd
        os.close(fd)


def _named_holder(path: str) -> str | None:
    """The holder a refused writer names: the lock file's text, if that file is still the locked one."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
    except OSError:
        return None  # deleted under its holder: nameless
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return read_holder(fd)  # locked: the holder's own text
        except OSError:
            return None
        return None  # nobody locks this file: a replacement, whose text names nobody for sure
    finally:
        os.close(fd)  # drops the shared lock if it was taken


def _write_holder(fd: int, path: str) -> str:
    """Write this writer's name into the locked file and return it; best-effort (the text decides nothing)."""
    pid, host = os.getpid(), socket.gethostname()
    info = {"pid": pid, "host": host}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except OSError as exc:
        # The lease is held all the same; a refused writer just cannot name this one.
        _log.warning("writer lease held, but naming the holder in %s failed: %s", path, exc)
    return _describe(info) or f"pid {pid}"
