"""The SDK's compaction through DshSession under a real SIGKILL: the history is the old one or the compacted one,
never a mix, and a fresh store reads it back (on asyncio and trio).

The child (``openai_agents_compact_child.py``) runs a turn through the SDK's Runner with
``OpenAIResponsesCompactionSession`` over a ``DshSession`` on JSONL and is killed at four points reached by marker,
never by sleeping: inside the compaction request, paused inside the compaction batch's write and inside its fsync
(the LD_PRELOAD shim), and after the run returned. Then the power-loss states of the compaction batch: the log cut,
or zero-filled, at offsets inside that batch (every offset under DSH_LONG=1) loads as the old history (a zeroed
tail that left the record's content intact may load it whole; the core may refuse some zeroed tails as damage).
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh.session_openai_agents import COMPACTION_EVENT, DshSession
from dsh.session_persistence import SessionPersistenceCorruptionError, open_sessions
from dsh.session_persistence.events import OpaqueEvent
from dsh.session_persistence.testing import shim_environment, shim_or_skip
from openai_agents_compact_child import HISTORY, QUESTION, REPLY, SESSION_ID, SUMMARY, transcript

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shim needs Linux")]

CHILD = Path(__file__).resolve().parent / "openai_agents_compact_child.py"
LONG = os.environ.get("DSH_LONG") == "1"
OLD = [*HISTORY, {"role": "user", "content": QUESTION}, REPLY.model_dump(exclude_unset=True)]
NEW = [*HISTORY, SUMMARY]  # the suffix the model saw, from its user message on, became the summary
READY_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shim_or_skip(tmp_path_factory.mktemp("shim"))


class Child:
    def __init__(self, mode: str, root: Path, shim: Path) -> None:
        self.release = root.parent / "release"
        env = shim_environment(shim, base={**os.environ, "OPENAI_AGENTS_DISABLE_TRACING": "1"})
        argv = [sys.executable, str(CHILD), mode, str(root), str(self.release)]
        self.stderr = root.parent / "child.stderr"
        with self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env)
        self.size: int | None = None
        self._buffer = b""

    def line(self) -> str:
        # Unbuffered reads: a buffered readline could swallow the next line where select no longer sees it.
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], READY_TIMEOUT_S)
            assert ready, "the child never reached its kill point"
            chunk = os.read(fd, 4096)
            assert chunk, self.stderr.read_text(encoding="utf-8", errors="replace")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode().strip()

    def wait_ready(self) -> None:
        self.size = json.loads(self.line())["size"]
        assert self.line() == "ready"

    def wait_paused(self) -> None:
        self.size = json.loads(self.line())["size"]
        paused = Path(f"{self.release}.paused")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not paused.exists():  # readiness is the shim's marker file, polled
            assert self.proc.poll() is None, self.stderr.read_text(encoding="utf-8", errors="replace")
            assert time.monotonic() < deadline, "the shim never paused the compaction batch"
            time.sleep(0.01)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=60)
        assert self.proc.returncode == -signal.SIGKILL


async def _reload(root: Path) -> tuple[list[Any], int]:
    async with open_sessions(root) as sessions, DshSession(sessions, SESSION_ID) as session:
        items = await session.get_items()
        events = sessions.store.get(SESSION_ID).events  # type: ignore[union-attr]
        return items, len([e for e in events if type(e) is OpaqueEvent and e.type == COMPACTION_EVENT])


def copy(root: Path, to: Path) -> Path:
    shutil.copytree(root, to)
    return to


def reload(root: Path, backend: str) -> tuple[list[Any], int]:
    return anyio.run(_reload, root, backend=backend)


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory, shim: Path) -> Callable[[str], tuple[Path, int]]:
    """``killed(mode)``: the root a child killed at ``mode`` left, untouched (reload copies of it), and its log size
    before compaction. One child per mode and module: importing the SDK dominates a child's run."""
    done: dict[str, tuple[Path, int]] = {}

    def run(mode: str) -> tuple[Path, int]:
        if mode not in done:
            root = tmp_path_factory.mktemp(mode) / "sessions"
            child = Child(mode, root, shim)
            try:
                if mode in ("write", "sync"):
                    child.wait_paused()
                else:
                    child.wait_ready()
            finally:
                child.kill()
            assert child.size is not None
            done[mode] = (root, child.size)
        return done[mode]

    return run


# Quick mode: the kill before the batch's write and the kill after it (before its fsync); DSH_LONG=1 adds the kill
# inside the compaction request and the kill after the run returned.
MODES = [("write", OLD), ("sync", NEW)] + ([("in-compact", OLD), ("done", NEW)] if LONG else [])


@pytest.mark.parametrize(("mode", "expected"), MODES)
def test_sigkill_during_compaction_leaves_the_old_or_the_compacted_history(
    killed: Callable[[str], tuple[Path, int]], tmp_path: Path, mode: str, expected: list[Any]
) -> None:
    root = copy(killed(mode)[0], tmp_path / "copy")
    # sync: the batch was written, not yet synced; the page cache outlives the process, so the record is there.
    for backend in ("asyncio", "trio"):
        items, records = reload(root, backend)
        assert items == expected
        assert records == (1 if expected is NEW else 0)


def _states(size: int, full: int) -> list[int]:
    if LONG:
        return list(range(size, full))
    rng = random.Random(full)
    return sorted({size, size + 1, (size + full) // 2, full - 1, *rng.sample(range(size, full), 4)})


def test_a_torn_compaction_batch_loads_as_the_old_history(
    killed: Callable[[str], tuple[Path, int]], tmp_path: Path
) -> None:
    root, size = killed("sync")  # the compaction batch is whole in the file: its bytes are the states' source
    full = transcript(str(root)).read_bytes()
    assert size < len(full)
    refused = 0
    for n, cut in enumerate(_states(size, len(full))):
        for kind, content in (("cut", full[:cut]), ("zeros", full[:cut] + bytes(len(full) - cut))):
            state = tmp_path / f"{kind}-{cut}"
            copy(root, state)
            transcript(str(state)).write_bytes(content)
            # Quick mode alternates the backend per state; the long mode reloads each state on both.
            for backend in ("asyncio", "trio") if LONG else (("asyncio", "trio")[n % 2],):
                try:
                    items = reload(state, backend)[0]
                except SessionPersistenceCorruptionError:
                    # The core refuses zeros that start inside a batch's declaration as damage (its tear rules, not
                    # this package's): a refusal, never a mix.
                    assert kind == "zeros", (kind, cut, backend)
                    refused += 1
                    continue
                # A cut batch is gone; a zeroed tail is the old history, or the whole record when the zeroed bytes did
                # not carry content (zstd's trailing checksum); never a mix of the two.
                assert items == OLD or (kind == "zeros" and items == NEW), (kind, cut, backend)
            shutil.rmtree(state)
    assert refused < len(_states(size, len(full))) * (2 if LONG else 1)  # most zeroed tails load
