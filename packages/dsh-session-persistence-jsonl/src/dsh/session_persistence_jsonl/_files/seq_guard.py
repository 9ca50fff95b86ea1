"""What the append-side seq check needs to know cheaply: the next seq of each transcript this backend saw.

The coordinator keeps its own cursor, but a backend is also called by tools and other writers; a batch at the
wrong seq must be refused as :class:`SeqMismatchError` before anything is written, never appended (a duplicate
or a gap would make the whole log unreadable). Decoding the file on every append would be far too slow, so
the backend remembers, per transcript, the next seq together with the file identity and size it saw after
its own reads and writes; when the file is unchanged the check costs one ``stat``, otherwise the caller decodes
the file once. The rule itself is the backend face's one :func:`check_contiguous`.
"""

from __future__ import annotations

import os
import threading

__all__ = ["NextSeqCache"]

_Key = tuple[int, int, int]


def _key(st: os.stat_result) -> _Key:
    return (st.st_dev, st.st_ino, st.st_size)


class NextSeqCache:
    """Transcript path -> (file identity and size, next seq), as last seen by this backend instance."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, tuple[_Key, int]] = {}

    def lookup(self, path: str, st: os.stat_result) -> int | None:
        """The next seq of ``path`` if the file is exactly as last seen, else ``None``."""
        with self._lock:
            entry = self._known.get(path)
        if entry is None or entry[0] != _key(st):
            return None
        return entry[1]

    def remember(self, path: str, st: os.stat_result | _Key, next_seq: int) -> None:
        """Record that ``path`` with this identity and size holds ``next_seq`` events."""
        key = _key(st) if isinstance(st, os.stat_result) else st
        with self._lock:
            self._known[path] = (key, next_seq)

    def forget(self, path: str) -> None:
        """Drop what is known about ``path`` (after a rewrite or repair)."""
        with self._lock:
            self._known.pop(path, None)
