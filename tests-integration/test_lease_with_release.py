"""A 0.2.0 writer and this tree's writer on one session still refuse each other, and neither ever waits.

0.3 anchors the writer lease on the session directory (an OFD lock held for the lease's life) besides the 0.2
``flock`` of ``session.lock``; 0.2 knows only the latter, and takes its short directory guard with a *blocking*
``flock``. Run from a git worktree at the 0.2.0 commit of ``tools/releases.toml`` (``PYTHONPATH`` at its package
sources, as ``test_release_reads_new_logs`` does), in its own process: while this tree holds a session the release
is refused at once (naming the holder), never left blocked on the anchor; while the release holds one this tree is
refused (naming it) and the lease probe finds it; once either lets go the other takes the lease.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
from dsh.session_persistence.backend import SessionLockedError
from dsh.session_persistence.testing import meta, simple_turn
from dsh.session_persistence_jsonl import JsonlBackend
from test_release_reads_new_logs import release  # noqa: F401 - the release worktree fixture, by name below

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the anchor and the probe need Linux")
anyio_test = pytest.mark.anyio

SESSION_ID = "shared"
#: Far above a refusal's few milliseconds (and a loaded machine's start-up); no timing is asserted below it.
STEP_BOUND_S = 60

#: The release's own lease, by its exported names, one step per line of stdin: ``try`` takes it (``holding``) or
#: reports the refusal at once (``refused <holder>``), ``release`` lets it go.
RELEASE_WRITER = textwrap.dedent(
    """
    import sys, anyio
    from dsh.session_persistence.backend import SessionLockedError
    from dsh.session_persistence.testing import meta
    from dsh.session_persistence_jsonl import JsonlBackend

    async def main(root):
        backend, lease = JsonlBackend(root), None
        while step := (await anyio.to_thread.run_sync(sys.stdin.readline)).strip():
            if step == "try":
                try:
                    lease = await backend.acquire_writer_lease(meta("shared", "/w"))
                except SessionLockedError as exc:
                    print(f"refused {exc.holder}", flush=True)
                else:
                    print("holding", flush=True)
            elif step == "release" and lease is not None:
                await lease.release()
                print("released", flush=True)

    anyio.run(main, sys.argv[1])
    """
)


class ReleaseWriter:
    """A 0.2.0 writer in its own process (its package sources from the release worktree, never this tree's)."""

    def __init__(self, worktree: Path, root: Path) -> None:
        src = [
            str(worktree / "packages" / n / "src") for n in ("dsh-session-persistence", "dsh-session-persistence-jsonl")
        ]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(src), PYTHONDONTWRITEBYTECODE="1")
        argv = [sys.executable, "-c", RELEASE_WRITER, str(root)]
        self.proc = subprocess.Popen(
            argv, cwd=worktree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def step(self, what: str) -> str:
        """One step's answer; a release writer left blocked on a lock fails here (no answer within the bound)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], STEP_BOUND_S)
        assert ready, f"the release writer did not answer {what!r} within {STEP_BOUND_S} s: blocked on a lock"
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        try:
            self.proc.communicate("", timeout=STEP_BOUND_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
        assert self.proc.returncode == 0


def test_a_release_writer_and_this_tree_refuse_each_other_and_never_wait(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    worktree: Path = request.getfixturevalue("release")
    root = tmp_path / "root"
    header = meta(SESSION_ID, "/w")
    this_tree = JsonlBackend(root)
    writer = ReleaseWriter(worktree, root)
    try:
        # This tree holds: the release is refused at once, naming it (it never waits on the anchor).
        lease = anyio.run(this_tree.acquire_writer_lease, header, backend="asyncio")
        assert writer.step("try") == f"refused {lease.holder}"
        anyio.run(lease.release, backend="trio")
        # Released: the anchor went with the lease, nothing is left for the release to wait on.
        assert writer.step("try") == "holding"
        # The release holds: this tree is refused, naming it, and the lease probe (the live listing) finds it.
        with pytest.raises(SessionLockedError) as info:
            anyio.run(JsonlBackend(root).acquire_writer_lease, header, backend="trio")
        named = f"pid {writer.proc.pid}"
        assert info.value.holder is not None and info.value.holder.startswith(named)
        probed = anyio.run(this_tree.writer_lease_holder, header, backend="asyncio")
        assert probed is not None and probed.startswith(named)
        assert writer.step("release") == "released"
        again = anyio.run(this_tree.acquire_writer_lease, header, backend="trio")
        assert anyio.run(this_tree.writer_lease_holder, header, backend="asyncio") is None  # its own lease
        anyio.run(again.release, backend="asyncio")
    finally:
        writer.close()


@anyio_test
async def test_a_deleted_lock_file_is_put_back_before_the_next_write(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A release writer sees only ``session.lock``. Deleted under this tree's live session, the file is locked
    again before this tree's next write, so the release is refused again; if the release takes the path before
    that write, the write is refused (typed) rather than two writers writing."""
    worktree: Path = request.getfixturevalue("release")
    root = tmp_path / "root"
    host = Host()
    store = SessionStore(host)
    lock = Path(JsonlBackend(root).locate(meta(SESSION_ID, "/w")).path).parent / "session.lock"
    writer = ReleaseWriter(worktree, root)
    try:
        async with PersistenceCoordinator(host, JsonlBackend(root)):
            session = store.create(SESSION_ID, meta=meta(SESSION_ID, "/w"))
            for turn in (1, 2):
                if turn == 2:
                    lock.unlink()
                for e in simple_turn(len(session.events), turn):
                    session.append_event(e)
                await store.flush(session)
            # Put back by the second flush: the release is refused, naming this process.
            assert (await anyio.to_thread.run_sync(writer.step, "try")).startswith(f"refused pid {os.getpid()}")
            for e in simple_turn(len(session.events), 3):
                session.append_event(e)
            await store.flush(session)
            lock.unlink()
            # The release gets in before this tree's next write: that write is refused, nothing is written.
            assert await anyio.to_thread.run_sync(writer.step, "try") == "holding"
            stored = await JsonlBackend(root).load_stored(SESSION_ID)  # the file itself, not the live view
            assert stored is not None and len(stored.events) == 9
            for e in simple_turn(len(session.events), 4):
                session.append_event(e)
            with pytest.raises(SessionLockedError):
                await store.flush(session)
            after = await JsonlBackend(root).load_stored(SESSION_ID)
            assert after is not None and after.events == stored.events
            # Once the release lets go, the retained write goes through under the lease this tree still holds.
            assert await anyio.to_thread.run_sync(writer.step, "release") == "released"
            await store.flush(session)
            store.dispose(session)
        final = await JsonlBackend(root).load_stored(SESSION_ID)
        assert final is not None and len(final.events) == 12
    finally:
        writer.close()
