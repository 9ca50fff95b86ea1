"""``dsh-sessions repair`` is a writer: it takes the session's writer lease, so a live writer in another process
makes it fail (exit 1) naming that process, and nothing is written; once the writer is gone, repair works.

A real second process (spawned) holds the lease through its own coordinator; the JSONL lease is a real flock.
"""

from __future__ import annotations

import functools
import io
import multiprocessing
import os
import signal
from pathlib import Path

from dsh.session_persistence._cli import _main
from dsh.session_persistence._cli._io import Io
from dsh.session_persistence.backend import event_to_builtins
from dsh.session_persistence.testing import step_start, turn_start
from dsh.session_persistence.testing._writer_child import write_and_hold
from dsh.session_persistence_jsonl import JsonlBackend

LIMIT = 120  # seconds: a bound on waits for the child, never a timing assertion


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = _main.run(list(argv), Io(out=out, err=err, inp=io.StringIO()))
    return code, out.getvalue(), err.getvalue()


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_repair_refused_while_a_live_writer_holds_the_session(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    receiving, sending = ctx.Pipe(duplex=False)
    header = {"version": 0, "id": "busy", "createdAt": 1000, "isSeeded": False, "cwd": "/w"}
    events = [event_to_builtins(e) for e in (turn_start(0, 1), step_start(1, 1, 1))]  # a turn left open
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
        before = snapshot(root)
        code, out, err = cli("--root", str(root), "repair", "busy", "--yes")
        assert code == 1, (out, err)
        assert f"pid {writer.pid}" in err and "cannot repair" in err
        assert snapshot(root) == before  # nothing was written
        os.kill(writer.pid, signal.SIGKILL)  # type: ignore[arg-type]
        writer.join(LIMIT)
        code, out, err = cli("--root", str(root), "repair", "busy", "--yes")
        assert code == 0, err
        assert "now has 4 events, balanced" in out
    finally:
        sending.close()
        if writer.is_alive():
            writer.kill()
        writer.join(LIMIT)
