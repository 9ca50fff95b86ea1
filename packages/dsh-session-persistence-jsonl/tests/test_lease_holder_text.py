"""The lock file's holder text is informative only: failing to write it never blocks the write (issue 25, item 4).

The fault is injected below Python (the LD_PRELOAD shim): every ``ftruncate`` or every ``pwrite`` of
``session.lock`` fails with EIO or ENOSPC, in a real process writing a real session through a coordinator. The
lease is still taken (a second backend instance is refused), the batch is written and acknowledged, and it is
stored when a fresh backend without the shim reads it back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh.session_persistence.backend import encode_event
from dsh.session_persistence.testing import FaultRule, shim_environment, shim_or_skip
from dsh.session_persistence_jsonl import JsonlBackend

SESSION_ID = "nameless"
LONG = os.environ.get("DSH_LONG") == "1"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the LD_PRELOAD shim needs Linux")

WRITER = textwrap.dedent(
    """
    import json, sys, anyio
    from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
    from dsh.session_persistence.backend import encode_event
    from dsh.session_persistence.testing import meta, simple_turn
    from dsh.session_persistence_jsonl import JsonlBackend

    async def main(root, report_path):
        host = Host()
        store = SessionStore(host)
        report = {}
        async with PersistenceCoordinator(host, JsonlBackend(root)) as persistence:
            session = store.create("nameless", meta=meta("nameless", "/w"))
            events = simple_turn(0, 1, "written without a name")
            for e in events:
                session.append_event(e)
            await store.flush(session)  # raises if the holder text's failure blocked the write
            report["acked"] = [encode_event(e).decode() for e in events]
            try:  # the lease is held all the same
                await JsonlBackend(root).acquire_writer_lease(meta("nameless", "/w"))
            except Exception as exc:
                report["second"] = [c.__name__ for c in type(exc).__mro__]
            store.dispose(session)
        with open(report_path, "w") as out:
            json.dump(report, out)

    anyio.run(main, *sys.argv[1:3], backend=sys.argv[3])
    """
)


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shim_or_skip(tmp_path_factory.mktemp("shim"))


def stored_wire(root: Path) -> list[str]:
    async def load() -> list[str]:
        stored = await JsonlBackend(root).load_stored(SESSION_ID)
        assert stored is not None
        return [encode_event(e).decode() for e in stored.events]

    return anyio.run(load)


#: Quick: the first of the two calls that write the text; long (``DSH_LONG=1``): the second too, on the other loop.
CASES = [("ftruncate", "EIO", "asyncio")] + ([("pwrite", "ENOSPC", "trio")] if LONG else [])


@pytest.mark.parametrize(("op", "errno", "backend"), CASES)
def test_a_failed_holder_text_never_blocks_the_write(
    shim: Path, tmp_path: Path, op: str, errno: str, backend: str
) -> None:
    root, report_path, log = tmp_path / "root", tmp_path / "report.json", tmp_path / "faults.log"
    rule = FaultRule(ops=(op,), path="session.lock", count=0, errno=errno)
    env = shim_environment(shim, rules=[rule], log=log)
    argv = [sys.executable, "-c", WRITER, str(root), str(report_path), backend]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert log.read_text().strip(), "the shim failed nothing"  # a control: the fault really happened
    assert "naming the holder" in proc.stderr  # said once, as a warning, not raised
    report: dict[str, Any] = json.loads(report_path.read_text())
    assert "SessionLockedError" in report["second"]
    assert stored_wire(root) == report["acked"]
