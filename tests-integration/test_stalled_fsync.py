"""A slow fsync of one session never holds another session's barrier (issue #34).

A real process, a real JSONL root, and an fsync stalled below Python (the LD_PRELOAD shim pauses the call until a
file appears): while session ``slow``'s barrier is stuck in its fsync, 20 other sessions of the same coordinator
append and pass their barriers; then the stall ends and ``slow``'s barrier returns, its event durable. 0.3's writer
lanes (a session hashed to a fixed thread) held every session that shared the stalled lane for as long as the stall.
asyncio and trio.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
from dsh.session_persistence.testing import shim_environment, shim_or_skip
from dsh.session_persistence_jsonl import JsonlBackend

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shim needs Linux"),
]

CHILD = Path(__file__).with_name("stall_child.py")


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shim_or_skip(tmp_path_factory.mktemp("shim"))


async def test_a_stalled_fsync_holds_only_its_own_session(tmp_path: Path, shim: Path, anyio_backend: object) -> None:
    loop = anyio_backend if isinstance(anyio_backend, str) else anyio_backend[0]  # type: ignore[index]
    root = tmp_path / "root"
    release = tmp_path / "release"
    env = shim_environment(shim, base=dict(os.environ))
    done = subprocess.run(  # noqa: ASYNC221 - the test waits for nothing else meanwhile
        [sys.executable, str(CHILD), loop, str(root), str(release)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,  # a hang guard: the child bounds its own waits at 60 s
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["peers durable while slow is stalled", "slow durable"]
    # Everything each barrier acknowledged is on disk, the stalled session's event included.
    host = Host()
    SessionStore(host)
    async with PersistenceCoordinator(host, JsonlBackend(str(root))) as coordinator:  # type: ignore[arg-type]
        for session_id in ("slow", "peer-7"):
            view = await coordinator.inspect(session_id)  # the open turn is shown closed: the child left it open
            assert [event.type for event in view.events][:2] == ["turn/start", "step/start"]
