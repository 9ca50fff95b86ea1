"""The 1,000,000-event session of ``tools/bench --big`` (issue #16): bounded-memory reads.

Kept beside the script because ``tools/bench`` is a self-contained tool: it imports this module by path. Every
figure is measured in a fresh child process (``--_big-child MODE ROOT SESSION_ID``) so that peak RSS and the bytes
read belong to that one read alone:

* ``stream``: ``PersistenceCoordinator.iter_events`` over the whole session: peak RSS of the process.
* ``whole``: ``read_from(id, 0)`` of the whole session (everything in memory at once), for comparison.
* ``tail``: ``read_from`` of the last 100 events: bytes the process read (``/proc/self/io`` ``rchar``).
"""

from __future__ import annotations

import json
import resource
import time
from typing import Any

import anyio
from dsh.session_persistence import Host, PersistenceCoordinator
from dsh.session_persistence_jsonl import JsonlBackend

__all__ = ["big_child"]


def _rchar() -> int | None:
    try:
        with open("/proc/self/io") as fh:
            for line in fh:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _peak_rss() -> int:
    # VmHWM: this address space's peak (ru_maxrss would include the parent's RSS at the fork, kept across exec).
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


async def _measure(mode: str, root: str, session_id: str, total: int) -> dict[str, Any]:
    async with PersistenceCoordinator(Host(), JsonlBackend(root)) as coordinator:
        base_rss = _peak_rss()
        read_before = _rchar()
        start = time.perf_counter()
        if mode == "stream":
            count = 0
            async for _event in coordinator.iter_events(session_id):
                count += 1
        elif mode == "whole":
            count = len((await coordinator.read_from(session_id, 0)).events)
        else:
            count = len((await coordinator.read_from(session_id, total - 100)).events)
        seconds = time.perf_counter() - start
        read_after = _rchar()
    return {
        "mode": mode,
        "events": count,
        "seconds": seconds,
        "peak_rss": _peak_rss(),
        "peak_rss_before": base_rss,
        "bytes_read": None if read_before is None or read_after is None else read_after - read_before,
    }


def big_child(mode: str, root: str, session_id: str, total: str) -> None:
    """Child entry: one read, its figures as one JSON line on stdout."""
    print(json.dumps(anyio.run(_measure, mode, root, session_id, int(total))))
