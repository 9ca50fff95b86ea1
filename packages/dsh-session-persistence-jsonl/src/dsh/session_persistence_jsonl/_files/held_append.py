"""One append descriptor per leased transcript, kept open while this backend holds the session's writer lease.

Opening, stat-ing and closing the transcript for every durable batch cost three system calls per commit. While
the writer lease is held nobody else may write the file, so the descriptor is kept and reused. It is used only
while the file at the path is still the one it was opened on, with the length it last left it at (the caller's
``stat`` of the path, which the seq guard takes anyway, decides): a file replaced (upgrade, rewrite, compaction),
cut (repair) or deleted behind it is reopened or fails exactly as a fresh open would. Released with the lease,
before the lock itself, so no write can follow the lease's release.

Blocking code for a worker thread.
"""

from __future__ import annotations

import contextlib
import os
import threading

from .fs import append_durable, append_held, open_append

__all__ = ["HeldAppender"]


class HeldAppender:
    """The kept descriptor of one transcript; after :meth:`close` every append opens the file afresh."""

    __slots__ = ("_closed", "_fd", "_ident", "_lock", "_size")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._ident: tuple[int, int] = (-1, -1)
        self._size = -1
        self._closed = False

    def append(self, path: str, st: os.stat_result, data: bytes) -> None:
        """Durably append ``data`` to ``path``, whose current ``os.stat`` is ``st`` (rollback on failure)."""
        with self._lock:
            if self._closed:
                append_durable(path, data)
                return
            fd = self._fd
            if fd is None or self._ident != (st.st_dev, st.st_ino) or self._size != st.st_size:
                self._drop()
                fd = open_append(path)
                try:
                    fst = os.fstat(fd)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd, self._ident, self._size = fd, (fst.st_dev, fst.st_ino), fst.st_size
            before = self._size
            try:
                append_held(fd, path, before, data)
            except BaseException:
                # Whatever the file holds now, the next append starts from a fresh open and stat.
                self._drop()
                raise
            self._size = before + len(data)

    def _drop(self) -> None:
        fd, self._fd = self._fd, None
        self._size = -1
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        """Close the descriptor (idempotent); waits for an append in flight on it."""
        with self._lock:
            self._closed = True
            self._drop()
