"""What a held JSONL writer lease keeps for the garbage collector (issue #34: GC at 1,000 sessions).

A live session holds its writer lease for its whole life, so what the lease keeps sits in the oldest generation and
every full collection traverses it: at 1,000 sessions each tracked object is a thousand. The count is exact (an object
graph, not a time): the tracked objects made for the lease that the lease keeps alive.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from dsh.session_persistence.testing import meta, tracked_reachable
from dsh.session_persistence_jsonl import JsonlBackend

pytestmark = pytest.mark.anyio

#: The lease, its lock, its release-callback list, the one release callback and the held appender with its lock. A
#: closure as the release callback would be 6 more (function, cell tuple, five cells).
TRACKED_PER_LEASE = 6


async def test_a_held_writer_lease_keeps_an_exact_number_of_tracked_objects(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path / "root")
    warm = await backend.acquire_writer_lease(meta("warm", "/w"))  # every lazy structure of the backend is built
    header = meta("leased", "/w")
    enabled = gc.isenabled()
    gc.disable()  # a collection would untrack what holds only atoms: the count is exact
    try:
        snapshot = gc.get_objects()  # kept alive to the end: no id of it is reused meanwhile
        old = {id(o) for o in snapshot} | {id(snapshot)}
        lease = await backend.acquire_writer_lease(header)
        kept = tracked_reachable(lease, old)
        del snapshot
    finally:
        if enabled:
            gc.enable()
    await lease.release()
    await warm.release()
    await backend.aclose()
    names = sorted(type(o).__name__ for o in kept)
    assert len(kept) == TRACKED_PER_LEASE, names
