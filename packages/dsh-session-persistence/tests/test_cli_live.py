"""A session another process is writing (a real second process holding the JSONL writer lease) is shown as live,
with its holder, by `list` and `verify`, never as interrupted or recoverable; and the look takes no lock, writes
nothing, and does not refuse that writer. Once the writer is gone (SIGKILL), the same session is interrupted again.
"""

from __future__ import annotations

import functools
import io
import json
import multiprocessing
import os
import signal
from pathlib import Path

from dsh.session_persistence._cli import _main
from dsh.session_persistence._cli._io import Io
from dsh.session_persistence.backend import event_to_builtins
from dsh.session_persistence.testing import step_start, turn_start, user_message
from dsh.session_persistence.testing._writer_child import write_and_hold
from dsh.session_persistence_jsonl import JsonlBackend

LIMIT = 120  # seconds: a bound on waits for the child, never a timing assertion


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = _main.run(list(argv), Io(out=out, err=err, inp=io.StringIO()))
    return code, out.getvalue(), err.getvalue()


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_session_being_written_is_live_with_its_holder(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    receiving, sending = ctx.Pipe(duplex=False)
    header = {"version": 0, "id": "busy", "createdAt": 1000, "isSeeded": False, "cwd": "/w"}
    events = [event_to_builtins(e) for e in (turn_start(0, 1), user_message(1, "go"), step_start(2, 1, 1))]
    writer = ctx.Process(
        target=write_and_hold,
        args=(functools.partial(JsonlBackend, root), "busy", header, events, start, results, receiving),
        daemon=True,
    )
    try:
        writer.start()
        receiving.close()
        start.set()
        outcome = results.get(True, LIMIT)
        assert outcome == ("ok", writer.pid), outcome
        holder = f"pid {writer.pid}"
        before = snapshot(root)

        code, out, err = cli("--root", str(root), "list")
        assert code == 0, err
        row = out.splitlines()[1]
        assert row.startswith("busy") and f"live ({holder} on " in row and "interrupted" not in row
        code, out, err = cli("--root", str(root), "list", "--json")
        (doc,) = json.loads(out)["sessions"]
        assert doc["status"] == "live" and doc["holder"].startswith(holder)

        code, out, err = cli("--root", str(root), "verify")
        assert code == 0, (out, err)
        assert (
            out.startswith("live") and f"being written by {holder}" in out and "recoverable" not in out.split("\n")[0]
        )
        assert "1 being written" in out
        code, out, err = cli("--root", str(root), "verify", "busy", "--json")
        assert json.loads(out)["sessions"][0]["status"] == "live"

        assert snapshot(root) == before  # the look wrote nothing, the lock file included
        assert writer.is_alive()
    finally:
        sending.close()
        if writer.is_alive():
            os.kill(writer.pid, signal.SIGKILL)  # type: ignore[arg-type]
        writer.join(LIMIT)
    # The kernel dropped the lease with the process: the open turn is now a crash to repair.
    code, out, err = cli("--root", str(root), "verify")
    assert code == 0 and out.startswith("recoverable"), out
    code, out, err = cli("--root", str(root), "list")
    assert "interrupted" in out.splitlines()[1] and "live" not in out
