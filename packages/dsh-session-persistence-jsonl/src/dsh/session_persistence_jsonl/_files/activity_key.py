"""The one "last activity" of a listed session: its log's own, read once per change of the transcript.

Column, order, ``since`` and ``prune`` all use the time :func:`stat_activity` answers: the time of the log's last
committed event (``last_activity.py``), which the activity index caches with the transcript's ``stat`` (a cached
time is used only while the ``stat`` is the one it was read with). A copy, a restore or a ``touch`` changes the
file's mtime, never this time. Where the log cannot say (a sealed log listed without its key, a damaged last batch)
the file's mtime stands in: the only activity readable then.

Blocking code for worker threads.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .._format.frames import Compression
from .._format.last_activity import last_event_time
from ..encryption import KeyProvider
from .activity import Entry
from .fs import open_read

__all__ = ["ActivityReader"]


class ActivityReader:
    """Reads sessions' last activity for one listing (``cached``: the index's entries by ``rel``, if any)."""

    def __init__(
        self, compression: Compression, cap: int, keys: KeyProvider | None, cached: dict[str, Entry] | None = None
    ) -> None:
        self.compression = compression
        self.cap = cap
        self.keys = keys
        self.cached = cached or {}
        #: Finds one cached entry (the index's, for the few sessions a proved page stats itself).
        self.lookup: Callable[[str], Entry | None] | None = None

    def stat_activity(self, path: str, rel: str) -> tuple[os.stat_result, int]:
        """The transcript's ``stat`` and its last activity in milliseconds; ``FileNotFoundError`` if it is gone."""
        try:
            fd = open_read(path)
        except (FileNotFoundError, NotADirectoryError):
            raise
        except OSError:
            # Not readable here (a symlinked transcript, refused when its header is read): listed by its stat only.
            st = os.stat(path)
            return st, st.st_mtime_ns // 1_000_000
        try:
            st = os.fstat(fd)
            known = self.cached.get(rel) if self.lookup is None else self.lookup(rel)
            if known is not None and known.matches(st):
                return st, known.activity
            ms = last_event_time(fd, st.st_size, self.compression, path, self.cap, self.keys)
        finally:
            os.close(fd)
        return st, ms if ms is not None else st.st_mtime_ns // 1_000_000
