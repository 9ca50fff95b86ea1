"""What ``verify`` says about the activity index: a cache, so its state is reported, never an error of the store.

Every line of the snapshot is checked against its CRC32 and the snapshot's line count against its header, and the
journal it was read up to against its instance id and its last line read. A snapshot that fails any of it is never
trusted: listings answer by a full scan until the next one rewrites it.

Blocking code for worker threads.
"""

from __future__ import annotations

import os

from .._format.frames import Compression
from . import activity, activity_writers
from .activity_journal import INDEX_NAME

__all__ = ["index_state"]


def index_state(root: str, compression: Compression) -> str:
    """``"ok"``, ``"missing"``, or why listings do not trust it (each a full scan until it is rebuilt)."""
    if not os.path.lexists(os.path.join(root, INDEX_NAME)):
        return "missing (the next paged listing builds it)"
    boot = activity.boot_id()
    snap = activity.load(root, compression, None)
    if snap is None:
        return "damaged (a line fails its check, or lines are missing): listings scan until it is rebuilt"
    try:
        snap.lock_inodes()
        entries = snap.all_entries()
    except activity.IndexFormatError:
        return "damaged (a line fails its check): listings scan until it is rebuilt"
    if boot is None or snap.state.boot != boot:
        return f"stale (written before a reboot): listings scan until it is rebuilt ({len(entries)} sessions)"
    state = snap.state
    if state.journal[1]:
        read = activity_writers.read_journal(root, state.journal[2], state.journal_id, state.journal_tail)
        if read is None or read.dev_ino != state.journal[:2]:
            return "stale (its journal was replaced, truncated or damaged): listings scan until it is rebuilt"
    return f"ok ({len(entries)} sessions)"
