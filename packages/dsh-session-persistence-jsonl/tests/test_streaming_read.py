"""Streaming reads (``iter_stored`` / ``PersistenceCoordinator.iter_events``) over real JSONL transcripts: the same
events as ``read_from`` from every position, a torn tail ends the stream, damage raises when reached, nothing is
left open, and a long log streams in bounded memory (measured in a fresh process: RSS, never time).

The tests damage and inspect transcripts with blocking file calls on purpose (the fixture, not the code under
test), hence the file-wide ASYNC230/ASYNC240 exemption.
"""

# ruff: noqa: ASYNC230, ASYNC240

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from dsh.session_persistence import Host, PersistenceCoordinator
from dsh.session_persistence.backend import (
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SupportsStreamingRead,
)
from dsh.session_persistence_jsonl import JsonlBackend

from ._formats import pairs
from ._sessions import storage, turn_batches

pytestmark = pytest.mark.anyio

ST = storage()


@pytest.fixture(params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def written(root: Path, compression: str, turns: int = 12) -> tuple[JsonlBackend, list[object]]:
    backend = JsonlBackend(root, compression=compression)  # type: ignore[arg-type]
    batches = turn_batches(turns)
    for i, batch in enumerate(batches):
        await backend.append_batch(ST, batch, i > 0)
    return backend, [e for b in batches for e in b]


async def test_the_backend_streams(tmp_path: Path, compression: str) -> None:
    backend, events = await written(tmp_path / "root", compression)
    assert isinstance(backend, SupportsStreamingRead)
    runs = [run async for run in backend.iter_stored(ST.meta.id, 0)]
    assert runs[0].meta.id == ST.meta.id and runs[0].events == []
    assert [e for run in runs for e in run.events] == events
    with pytest.raises(SessionNotFoundError):
        [run async for run in backend.iter_stored("absent", 0)]


async def test_iter_events_equals_read_from_everywhere(tmp_path: Path, compression: str) -> None:
    backend, events = await written(tmp_path / "root", compression)
    async with PersistenceCoordinator(Host(), backend) as coordinator:
        for from_seq in sorted({0, 1, 7, len(events) // 2, len(events) - 1, len(events), len(events) + 5}):
            streamed = [e async for e in coordinator.iter_events(ST.meta.id, from_seq)]
            suffix = await coordinator.read_from(ST.meta.id, from_seq)
            assert streamed == list(suffix.events) == events[from_seq:]
        with pytest.raises(SessionNotFoundError):
            [e async for e in coordinator.iter_events("absent")]
        with pytest.raises(TypeError, match="non-negative"):
            [e async for e in coordinator.iter_events(ST.meta.id, -1)]


async def test_a_torn_tail_ends_the_stream(tmp_path: Path, compression: str) -> None:
    backend, events = await written(tmp_path / "root", compression)
    path = Path(backend.locate(ST.meta).path)
    last = pairs(path.read_bytes(), compression)[-1]
    with open(path, "r+b") as fh:
        fh.truncate(last.end - 3)  # the last batch never completed
    count = len(events) - last.count
    async with PersistenceCoordinator(Host(), backend) as coordinator:
        assert [e async for e in coordinator.iter_events(ST.meta.id)] == events[:count]


async def test_damage_raises_when_the_stream_reaches_it(tmp_path: Path, compression: str) -> None:
    backend, events = await written(tmp_path / "root", compression)
    path = Path(backend.locate(ST.meta).path)
    third = pairs(path.read_bytes(), compression)[3]
    data = bytearray(path.read_bytes())
    data[third.end - 2] ^= 0x55  # inside the data of a complete batch: damage, not a torn tail
    path.write_bytes(bytes(data))
    got: list[object] = []

    async def consume(coordinator: PersistenceCoordinator) -> None:
        async for event in coordinator.iter_events(ST.meta.id):
            got.append(event)

    async with PersistenceCoordinator(Host(), backend) as coordinator:
        with pytest.raises(SessionPersistenceCorruptionError):
            await consume(coordinator)
    assert got == events[: len(got)]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to count descriptors")
async def test_leaving_the_stream_early_closes_the_transcript(tmp_path: Path, compression: str) -> None:
    backend, _events = await written(tmp_path / "root", compression)
    path = Path(backend.locate(ST.meta).path)
    ident = (path.stat().st_dev, path.stat().st_ino)

    def open_on_it() -> int:
        count = 0
        for name in os.listdir("/proc/self/fd"):
            try:
                st = os.stat(f"/proc/self/fd/{name}")
            except OSError:
                continue
            count += (st.st_dev, st.st_ino) == ident
        return count

    async with PersistenceCoordinator(Host(), backend) as coordinator:
        stream = coordinator.iter_events(ST.meta.id)
        async for _event in stream:
            assert open_on_it() == 1
            break
        await stream.aclose()  # type: ignore[attr-defined]
        assert open_on_it() == 0


_CHILD = textwrap.dedent(
    """
    import json, os, sys, threading, time
    import anyio
    from dsh.session_persistence import Host, PersistenceCoordinator
    from dsh.session_persistence_jsonl import JsonlBackend

    PAGE = os.sysconf("SC_PAGE_SIZE")

    def rss():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * PAGE

    async def main(root, mode):
        async with PersistenceCoordinator(Host(), JsonlBackend(root)) as coordinator:
            base = rss()
            peak = [base]
            done = threading.Event()

            def sample():
                while not done.is_set():
                    peak[0] = max(peak[0], rss())
                    time.sleep(0.002)

            sampler = threading.Thread(target=sample)
            sampler.start()
            try:
                if mode == "stream":
                    count = 0
                    async for _event in coordinator.iter_events("s1"):
                        count += 1
                else:
                    events = (await coordinator.read_from("s1", 0)).events
                    count = len(events)
                    peak[0] = max(peak[0], rss())
            finally:
                done.set()
                sampler.join()
        print(json.dumps({"count": count, "growth_kb": (peak[0] - base) // 1024}))

    anyio.run(main, sys.argv[1], sys.argv[2])
    """
)


def _child(root: Path, mode: str) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), mode], capture_output=True, text=True, check=False, timeout=600
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, int] = json.loads(done.stdout)
    return result


async def test_a_long_log_streams_in_bounded_memory(tmp_path: Path) -> None:
    """~79,000 events: reading them all into a list grows RSS by tens of MB; streaming them stays within a few
    runs' worth, whatever the length (the bound is generous, the ratio is what matters)."""
    root = tmp_path / "root"
    backend = JsonlBackend(root)
    batches = turn_batches(300, tokens=120)
    for i, batch in enumerate(batches):
        await backend.append_batch(ST, batch, i > 0)
    total = sum(map(len, batches))
    assert total > 75_000
    whole = _child(root, "whole")
    stream = _child(root, "stream")
    assert whole["count"] == stream["count"] == total
    assert stream["growth_kb"] < 16 * 1024, stream
    assert stream["growth_kb"] * 3 < whole["growth_kb"], (stream, whole)
