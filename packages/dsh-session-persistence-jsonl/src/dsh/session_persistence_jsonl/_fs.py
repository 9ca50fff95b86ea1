"""Durable POSIX file steps: directories, first publication, append with rollback, truncate, replace (spec §3).

Every function here is blocking and runs inside one worker thread, so cancellation can never split a durable
step. Descriptors are unbuffered (``os.open``/``os.write``): buffered ``open(..., "ab")`` would blur the order of
write and fsync. Only ``FileNotFoundError`` ever means "absent"; every other OS error propagates, because a
blocked path must not look like a free id.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import sys

if sys.version_info < (3, 11):  # pragma: no cover - exercised on 3.10 only
    from exceptiongroup import ExceptionGroup

__all__ = [
    "append_durable",
    "ensure_dir_chain",
    "fsync_dir",
    "is_file",
    "publish_exclusive",
    "replace_durable",
    "revision_of",
    "stable_read",
    "truncate_durable",
]

DIR_MODE = 0o700
FILE_MODE = 0o600
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def revision_of(st: os.stat_result) -> str:
    """Source-qualified stat identity: two roots never compare equal, any append or replacement changes it."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def is_file(path: str) -> bool:
    """Whether ``path`` exists (following symlinks); only ENOENT counts as absent (never ``os.path.exists``)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return False
    return True


def fsync_dir(path: str) -> None:
    """Make a directory's entries durable (a new or removed name is not durable before this)."""
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mkdir_one(path: str) -> None:
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        # Tolerate only an existing directory; a file in the way must surface (EEXIST / ENOTDIR).
        if not stat.S_ISDIR(os.stat(path).st_mode):
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
        _mkdir_one(path)
    _mkdir_one(root)
    path = root
    for child in children:
        path = os.path.join(path, child)
        _mkdir_one(path)
    return path


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
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


def publish_exclusive(final_path: str, data: bytes) -> None:
    """Publish a complete new file: staging file (exclusive, 0o600) + fsync + ``link`` + directory fsync.

    ``link`` never replaces: a lost race raises ``FileExistsError`` and the winner's file stays untouched
    (``rename`` would silently replace a committed log). Readers see no file or the complete one.
    """
    tmp = _write_staging(final_path, data)
    try:
        os.link(tmp, final_path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    try:
        fsync_dir(os.path.dirname(final_path))
    finally:
        # The log is already published; a leftover staging name is harmless.
        _unlink_quietly(tmp)


def replace_durable(final_path: str, data: bytes) -> None:
    """Atomically replace an existing file: staging file + fsync + ``os.replace`` + directory fsync."""
    tmp = _write_staging(final_path, data)
    try:
        os.replace(tmp, final_path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    fsync_dir(os.path.dirname(final_path))


def _truncate_to(path: str, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | _O_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def append_durable(path: str, data: bytes) -> None:
    """Append + fsync; on any failure truncate back to the prior length, so no partial bytes survive.

    Opened without ``O_CREAT``: a deleted log fails instead of silently becoming a header-less file. If the
    rollback fails too, both errors are raised together.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | _O_CLOEXEC)
    try:
        before = os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        raise
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except Exception as exc:
        os.close(fd)
        try:
            _truncate_to(path, before)
        except Exception as rollback_exc:
            raise ExceptionGroup(f'failed to roll back append to "{path}"', [exc, rollback_exc]) from None
        raise
    os.close(fd)


def truncate_durable(path: str, size: int, expected_size: int) -> None:
    """Cut a torn tail: refuse if the file changed since it was read, else ftruncate + fsync."""
    fd = os.open(path, os.O_WRONLY | _O_CLOEXEC)
    try:
        current = os.fstat(fd).st_size
        if current != expected_size:
            raise OSError(
                f'refusing to truncate "{path}": its size changed from {expected_size} to {current} '
                "since the torn tail was read"
            )
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def stable_read(path: str) -> tuple[bytes, str]:
    """Read the whole file between two equal stats (a concurrent append is never mistaken for a torn tail)."""
    while True:
        before = revision_of(os.stat(path))
        with open(path, "rb") as fh:
            data = fh.read()
        after = revision_of(os.stat(path))
        if before == after:
            return data, after
