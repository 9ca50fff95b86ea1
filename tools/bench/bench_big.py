"""The 1,000,000-event session of ``tools/bench --big`` (issue #16, section 9): bounded-memory reads.

A module of the ``tools/bench`` package (``python tools/bench`` runs ``__main__.py``). Every
figure is measured in a fresh child process (``--_big-child MODE ROOT SESSION_ID``) so that peak RSS and the bytes
read belong to that one read alone:

* ``stream``: ``PersistenceCoordinator.iter_events`` over the whole session: peak RSS of the process.
* ``whole``: ``read_from(id, 0)`` of the whole session (everything in memory at once), for comparison.
* ``tail``: ``read_from`` of the last 100 events: bytes the process read (``/proc/self/io`` ``rchar``).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from typing import Any

import anyio
from bench_common import ENTRY, Report, _fmt
from bench_load import write_session_file
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


def big_session_section(report: Report, scratch: str, events: int = 1_000_000) -> None:
    """9. A 1,000,000-event session: peak RSS of ``iter_events`` over all of it (target < 64 MB) and the bytes
    ``read_from`` of its last 100 events reads (target < 1 MB), each in a fresh process."""
    f = report.figures
    root = os.path.join(scratch, "big")
    print(f"\n9. big session: {events:,} events, each read in a fresh process", flush=True)
    path, total, raw = write_session_file(root, "big-session", 0, target_events=events)
    out: dict[str, Any] = {"events": total, "raw_json_bytes": raw, "file_bytes": os.path.getsize(path)}
    for mode in ("stream", "whole", "tail"):
        cmd = [sys.executable, ENTRY, "--_big-child", mode, root, "big-session", str(total)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    shutil.rmtree(root, ignore_errors=True)
    f["big"] = out
    mb = 1024 * 1024
    report.row(
        "big session: events / file MB / raw JSON MB", f"{total:,} / {out['file_bytes'] / mb:.1f} / {raw / mb:.0f}"
    )
    report.row("iter_events over all: peak RSS MB (target < 64)", f"{out['stream']['peak_rss'] / mb:.1f}")
    report.row("iter_events over all: s", f"{out['stream']['seconds']:.2f}")
    report.row(
        "read_from(0) (all in memory): peak RSS MB / s",
        f"{out['whole']['peak_rss'] / mb:.1f} / {out['whole']['seconds']:.2f}",
    )
    tail = out["tail"]["bytes_read"]
    report.row("read_from last 100: bytes read (target < 1 MB)", _fmt(tail))
    report.row("read_from last 100: s", f"{out['tail']['seconds']:.3f}")
