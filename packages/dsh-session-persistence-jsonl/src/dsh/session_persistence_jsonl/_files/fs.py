"""Durable POSIX file steps: directories, first publication, append with rollback, truncate, replace (spec §3).

Every function here is blocking and runs inside one worker thread, so cancellation can never split a durable
step. Descriptors are unbuffered (``os.open``/``os.write``): buffered ``open(..., "ab")`` would blur the order of
write and fsync. Only ``FileNotFoundError`` ever means "absent"; every other OS error propagates, because a
blocked path must not look like a free id. No symlink is followed inside the layout: files are opened with
``O_NOFOLLOW`` and directories are checked with ``lstat`` (a symlinked directory raises ``ELOOP``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from dsh.session_persistence.backend import SessionStorageError, SessionWriteInDoubtError

__all__ = [
    "UnsyncedBytes",
    "UnsyncedError",
    "UnsyncedName",
    "append_durable",
    "append_held",
    "open_append",
    "ensure_dir_chain",
    "fsync_dir",
    "is_file",
    "open_read",
    "publish_exclusive",
    "read_head",
    "real_dir",
    "replace_durable",
    "revision_of",
    "stable_read",
    "truncate_durable",
]

DIR_MODE = 0o700
FILE_MODE = 0o600
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _symlink_refused(path: str) -> OSError:
    return OSError(errno.ELOOP, "symbolic link inside the session layout refused (links are never followed)", path)


def real_dir(path: str) -> bool:
    """Whether ``path`` is a real directory (``False`` if absent); a symlink or a file in its place raises."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise _symlink_refused(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    return True


def revision_of(st: os.stat_result) -> str:
    """Source-qualified stat identity: two roots never compare equal, any append or replacement changes it."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def is_file(path: str) -> bool:
    """Whether ``path`` exists (never following a symlink, which raises); only ENOENT counts as absent."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise _symlink_refused(path)
    return True


def open_read(path: str) -> int:
    """A read-only descriptor; a symlink in the last component raises ``ELOOP``."""
    return os.open(path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)


def read_head(path: str, size: int) -> bytes:
    """The first ``size`` bytes of a file (fewer if it is shorter)."""
    fd = open_read(path)
    try:
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Make a directory's entries durable (a new or removed name is not durable before this)."""
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mkdir_one(path: str, *, layout: bool = True) -> None:
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        # Tolerate only an existing directory; a file in the way must surface (EEXIST / ENOTDIR). Inside the
        # layout a symlinked directory is refused (writes would land outside the root); the root and its
        # ancestors are configuration and may be links.
        st = os.lstat(path)
        if layout and stat.S_ISLNK(st.st_mode):
            raise _symlink_refused(path) from None
        if not stat.S_ISDIR(st.st_mode if layout else os.stat(path).st_mode):
            raise
    fsync_dir(os.path.dirname(path) or os.sep)


def ensure_dir_chain(root: str, *children: str) -> str:
    """Create ``root`` (with any missing ancestors) and then each child, one by one, mode 0o700.

    ``os.makedirs`` applies the mode only to the leaf, so each level is created explicitly, and its parent is
    fsynced even when it already existed (a previous crash may have left the entry undurable).
    """
    missing: list[str] = []
    probe = root
    while True:
        try:
            os.stat(probe)
            break
        except FileNotFoundError:
            missing.append(probe)
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
    for path in reversed(missing):
        _mkdir_one(path, layout=False)
    if not missing:
        # The root itself may be a symlink (it is configuration, not layout); it must lead to a directory.
        if not stat.S_ISDIR(os.stat(root).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), root)
        fsync_dir(os.path.dirname(root) or os.sep)
    path = root
    for child in children:
        path = os.path.join(path, child)
        _mkdir_one(path)
    return path


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written == len(data):
        return  # the usual case: a regular file takes a batch in one write
    view = memoryview(data)[written:]
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _staging_name(final_path: str) -> str:
    return f"{final_path}.{secrets.token_hex(6)}.tmp"


def _write_staging(final_path: str, data: bytes) -> str:
    tmp = _staging_name(final_path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, FILE_MODE)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    return tmp


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


@contextlib.contextmanager
def _naming(path: str) -> Iterator[None]:
    """An ``OSError`` raised inside names ``path`` (fsync and write errors carry no file name of their own)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = path
        raise


@dataclass(frozen=True)
class UnsyncedBytes:
    """Bytes written to a file whose every sync since failed: the page cache holding them proves nothing (Linux
    may mark such pages clean after a failed ``fsync``), so only writing them again and a successful sync does."""

    path: str
    ident: tuple[int, int]
    offset: int
    data: bytes

    def settle(self) -> None:
        """Write the bytes again at their offset and sync; a file replaced or cut short since is not ours."""
        try:
            fd = os.open(self.path, os.O_WRONLY | _O_CLOEXEC | _O_NOFOLLOW)  # never O_APPEND: pwrite must seek
        except FileNotFoundError:
            return
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != self.ident or not self.offset <= st.st_size <= self.offset + len(self.data):
                return  # replaced or rewritten since (under a lease): the read-back judges what it holds
            _pwrite_all(fd, self.data, self.offset)
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class UnsyncedName:
    """A name linked or renamed into ``directory`` whose directory sync failed: not durable until one succeeds."""

    directory: str

    def settle(self) -> None:
        fsync_dir(self.directory)


class UnsyncedError(SessionWriteInDoubtError):
    """A write whose sync failed and could not be made good: ``pending`` must settle before the session's stored
    state is evidence of anything (the backend settles it before its next read or write of the session)."""

    def __init__(self, message: str, pending: UnsyncedBytes | UnsyncedName, errno: int | None, path: str) -> None:
        super().__init__(message, errno=errno, path=path)
        self.pending = pending


def _unsynced(
    action: str, path: str, exc: OSError, detail: str, pending: UnsyncedBytes | UnsyncedName
) -> UnsyncedError:
    text = exc.strerror or str(exc) or type(exc).__name__
    return UnsyncedError(
        f'{action} "{path}" is in doubt: {detail} ({text}); it is not acknowledged until a sync succeeds',
        pending,
        exc.errno,
        path,
    )


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _make_good(fd: int, path: str, before: int, data: bytes, exc: OSError, rollback_exc: OSError) -> None:
    """After a failed append whose rollback failed too: write the batch again at ``before`` and sync, so that a
    successful sync covers its bytes (then it is durable, and acknowledged), else raise :class:`UnsyncedError`."""
    st = os.fstat(fd)
    pending = UnsyncedBytes(path, (st.st_dev, st.st_ino), before, data)
    try:
        pending.settle()
    except OSError as again:
        what = rollback_exc.strerror or str(rollback_exc)
        raise _unsynced(
            "append to",
            path,
            exc,
            f"the append failed, rolling it back failed ({what}) and writing it again failed "
            f"({again.strerror or again})",
            pending,
        ) from exc


def _publish_exclusive(final_path: str, data: bytes) -> None:
    """The body of :func:`publish_exclusive` (its OS errors get the path attached there)."""
    tmp = _write_staging(final_path, data)
    try:
        os.link(tmp, final_path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    directory = os.path.dirname(final_path)
    try:
        fsync_dir(directory)
    except OSError as exc:
        detail = "the log was linked but its directory fsync failed"
        raise _unsynced("publishing", final_path, exc, detail, UnsyncedName(directory)) from exc
    finally:
        # The log is already published; a leftover staging name is harmless.
        _unlink_quietly(tmp)


def _check_unchanged(path: str, expected_revision: str | None) -> None:
    if expected_revision is not None and revision_of(os.lstat(path)) != expected_revision:
        raise SessionStorageError(f'refusing to replace "{path}": it changed since it was read', path=path)


def _replace_durable(final_path: str, data: bytes, expected_revision: str | None = None) -> None:
    """The body of :func:`replace_durable` (its OS errors get the path attached there)."""
    tmp = _write_staging(final_path, data)
    try:
        _check_unchanged(final_path, expected_revision)
        os.replace(tmp, final_path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    directory = os.path.dirname(final_path)
    try:
        fsync_dir(directory)
    except OSError as exc:
        detail = "the new log was renamed into place but not fsynced"
        raise _unsynced("replacing", final_path, exc, detail, UnsyncedName(directory)) from exc


def _truncate_to(path: str, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | _O_CLOEXEC | _O_NOFOLLOW)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _append_durable(path: str, data: bytes) -> None:
    """The body of :func:`append_durable` (its OS errors get the path attached there)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | _O_CLOEXEC | _O_NOFOLLOW)
    try:
        before = os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        raise
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except OSError as exc:
        try:
            try:
                _truncate_to(path, before)
            except OSError as rollback_exc:
                _make_good(fd, path, before, data, exc, rollback_exc)
                return
        finally:
            os.close(fd)
        raise
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)


def _truncate_durable(path: str, size: int, expected_size: int) -> None:
    """The body of :func:`truncate_durable` (its OS errors get the path attached there)."""
    fd = os.open(path, os.O_WRONLY | _O_CLOEXEC | _O_NOFOLLOW)
    try:
        current = os.fstat(fd).st_size
        if current != expected_size:
            raise SessionStorageError(
                f'refusing to truncate "{path}": its size changed from {expected_size} to {current} '
                "since the torn tail was read",
                path=path,
            )
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_all(fd: int, size: int) -> bytes:
    parts: list[bytes] = []
    pos = 0
    while True:
        chunk = os.pread(fd, max(size - pos, 0) + 65536, pos)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        pos += len(chunk)


def stable_read(path: str) -> tuple[bytes, str]:
    """Read the whole file between two equal stats (a concurrent append is never mistaken for a torn tail)."""
    while True:
        fd = open_read(path)
        try:
            st = os.fstat(fd)
            before = revision_of(st)
            data = _read_all(fd, st.st_size)
            after = revision_of(os.fstat(fd))
        finally:
            os.close(fd)
        # The name must still be this file: a replacement between open and now would pair old bytes and a new file.
        if before == after == revision_of(os.lstat(path)):
            return data, after


def publish_exclusive(final_path: str, data: bytes) -> None:
    """Publish a complete new file: staging file (exclusive, 0o600) + fsync + ``link`` + directory fsync.

    ``link`` never replaces: a lost race raises ``FileExistsError`` and the winner's file stays untouched
    (``rename`` would silently replace a committed log). Readers see no file or the complete one. A failed
    directory fsync after the link is in doubt (the log is visible but maybe not durable): :class:`UnsyncedError`,
    whose ``pending`` name must be synced before the log is evidence of anything.
    """
    with _naming(final_path):
        _publish_exclusive(final_path, data)


def replace_durable(final_path: str, data: bytes, expected_revision: str | None = None) -> None:
    """Atomically replace an existing file: staging file + fsync + ``os.replace`` + directory fsync.

    ``expected_revision`` (a :func:`revision_of` string) refuses the replacement when the file changed since it
    was read. A failed directory fsync after the rename is in doubt.
    """
    with _naming(final_path):
        _replace_durable(final_path, data, expected_revision)


def append_durable(path: str, data: bytes) -> None:
    """Append + fsync; on any failure truncate back to the prior length, so no partial bytes survive.

    Opened without ``O_CREAT``: a deleted log fails instead of silently becoming a header-less file. The
    original ``OSError`` propagates after a clean rollback (nothing of the batch is stored). If the rollback
    fails too, the page cache may hold the batch, which proves nothing after a failed sync: the batch is written
    again at the same offset and synced (then it is durable and this returns), else :class:`UnsyncedError`.
    """
    with _naming(path):
        _append_durable(path, data)


def truncate_durable(path: str, size: int, expected_size: int) -> None:
    """Cut a torn tail: refuse if the file changed since it was read, else ftruncate + fsync."""
    with _naming(path):
        _truncate_durable(path, size, expected_size)


def open_append(path: str) -> int:
    """A write-only ``O_APPEND`` descriptor on an existing file (never created, never through a symlink)."""
    with _naming(path):
        return os.open(path, os.O_WRONLY | os.O_APPEND | _O_CLOEXEC | _O_NOFOLLOW)


def _append_held(fd: int, path: str, before: int, data: bytes) -> None:
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except OSError as exc:
        try:
            os.ftruncate(fd, before)
            os.fsync(fd)
        except OSError as rollback_exc:
            _make_good(fd, path, before, data, exc, rollback_exc)
            return
        raise


def append_held(fd: int, path: str, before: int, data: bytes) -> None:
    """:func:`append_durable` on a descriptor the caller keeps open (from :func:`open_append`), whose file is
    ``before`` bytes long: append + fsync; on failure ``ftruncate`` the same descriptor back to ``before``
    (so the rollback cannot hit another file at that path), and if that fails too the batch is in doubt."""
    try:
        _append_held(fd, path, before, data)
    except OSError as exc:  # as _naming does, without a context manager per durable batch
        if exc.filename is None:
            exc.filename = path
        raise
