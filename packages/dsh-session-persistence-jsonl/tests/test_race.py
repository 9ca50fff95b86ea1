"""Two real processes materialize the same session id at the same moment (spec/jsonl.md §3.1, §5 #49).

``link()`` publication guarantees exactly one winner; the loser gets ``SessionLogExistsError`` (also a
``FileExistsError``) and the winner's transcript is never overwritten.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from dsh.session_persistence_jsonl import JsonlBackend

pytestmark = pytest.mark.anyio

ROUNDS = 12 if os.environ.get("DSH_LONG") == "1" else 3

WRITER = textwrap.dedent(
    """
    import os, sys, time
    import anyio
    from dsh.session_persistence.backend import SessionHeader, StorageMetadata, decode_event
    from dsh.session_persistence_jsonl import JsonlBackend, SessionLogExistsError

    root, compression, sid, tag, go = sys.argv[1:6]
    meta = StorageMetadata(SessionHeader(id=sid, created_at=1, cwd="/race"))
    events = [decode_event({"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 0}}),
              decode_event({"type": "plugin/who", "seq": 1, "time": 2, "data": tag, "ignorable": True})]
    backend = JsonlBackend(root, compression=compression)

    async def main():
        await backend.list()  # warm up (preflight) before the start signal
        print("ready", flush=True)
        while not os.path.exists(go):
            pass
        try:
            await backend.append_batch(meta, events, False)
        except SessionLogExistsError as exc:
            assert isinstance(exc, FileExistsError)
            print("lost:", exc, flush=True)
            sys.exit(3)
        print("won", flush=True)

    anyio.run(main)
    """
)


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_two_processes_materialize_the_same_id(tmp_path: Path, compression: str) -> None:
    root = tmp_path / "root"
    for round_no in range(ROUNDS):
        sid = f"race-{round_no}"
        go = tmp_path / f"go-{round_no}"
        procs = [await anyio.to_thread.run_sync(_spawn, [str(root), compression, sid, tag, str(go)]) for tag in "AB"]
        for proc in procs:
            assert proc.stdout is not None
            line = await anyio.to_thread.run_sync(proc.stdout.readline)
            assert line.strip() == "ready", proc.stderr.read() if proc.stderr else ""
        go.touch()
        results = []
        for proc in procs:
            out, err = await anyio.to_thread.run_sync(proc.communicate)
            results.append((proc.returncode, out, err))
        codes = sorted(code for code, _out, _err in results)
        assert codes == [0, 3], results
        winner = "AB"[[code for code, _o, _e in results].index(0)]
        loser_out = next(out for code, out, _err in results if code == 3)
        assert f'refusing to materialize "{sid}"' in loser_out
        loaded = await JsonlBackend(root, compression=compression).load_stored(sid)  # type: ignore[arg-type]
        assert loaded is not None
        assert loaded.events[1].data == winner  # the winner's content, never overwritten
        session_dir = Path(JsonlBackend(root, compression=compression).locate(loaded.meta).path).parent  # type: ignore[arg-type]
        assert [p.name for p in session_dir.iterdir()] == [
            f"session{'.jsonl.zstd' if compression == 'zstd' else '.jsonl'}"
        ]
