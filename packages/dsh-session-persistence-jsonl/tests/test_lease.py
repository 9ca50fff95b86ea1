"""The JSONL writer lease on real files: ``session.lock``'s ``flock`` and the session directory's anchor.

Checked from outside the lease code: another open file description (a second backend instance) and another
process (a plain ``flock`` in a subprocess) both find the file locked while a lease is held, the file names the
holder's pid and host, and releasing (or the holder dying) frees it; with the file deleted or replaced, the
anchor still refuses a second instance and the probe still finds the holder from another process; a lock file
replaced between the lease code's open and its lock is never the one held.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from dsh.session_persistence.backend import SessionLockedError, SupportsWriterLease
from dsh.session_persistence.testing import meta
from dsh.session_persistence_jsonl import JsonlBackend

pytestmark = pytest.mark.anyio

_PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    print("locked")
else:
    print("free")
"""


def probe(path: Path) -> str:
    """Whether another process can take the kernel lock of ``path`` right now."""
    done = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, check=True)
    return done.stdout.strip()


async def test_the_lease_is_a_kernel_lock_beside_the_transcript(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path / "root")
    assert isinstance(backend, SupportsWriterLease)
    header = meta("leased", "/w")
    lease = await backend.acquire_writer_lease(header)
    lock = Path(backend.locate(header).path).parent / "session.lock"
    assert json.loads(lock.read_text()) == {"pid": os.getpid(), "host": socket.gethostname()}
    assert lease.holder == f"pid {os.getpid()} on {socket.gethostname()}"
    assert probe(lock) == "locked"
    with pytest.raises(SessionLockedError) as info:
        await JsonlBackend(tmp_path / "root").acquire_writer_lease(header)
    assert info.value.holder == lease.holder
    await lease.release()
    await lease.release()  # idempotent
    assert probe(lock) == "free"
    again = await JsonlBackend(tmp_path / "root").acquire_writer_lease(header)
    await again.release()


_PROBE_HOLDER = """
import sys, anyio
from dsh.session_persistence.testing import meta
from dsh.session_persistence_jsonl import JsonlBackend
backend = JsonlBackend(sys.argv[1])
for _ in sys.stdin:
    print(repr(anyio.run(backend.writer_lease_holder, meta(sys.argv[2], "/w"))), flush=True)
"""


class ProbeElsewhere:
    """The lease probe (the CLI's live listing) run in another process, once per call."""

    def __init__(self, root: Path, session_id: str) -> None:
        argv = [sys.executable, "-c", _PROBE_HOLDER, str(root), session_id]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("probe\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.communicate(timeout=60)


async def test_the_lease_outlives_its_lock_file(tmp_path: Path) -> None:
    """The lock file deleted, then replaced, under a held lease: a second backend instance in this process is
    still refused, the probe still finds the holder from another process (not in its own), and once released the
    lease is free again."""
    root = tmp_path / "root"
    header = meta("anchored", "/w")
    lease = await JsonlBackend(root).acquire_writer_lease(header)
    lock = Path(JsonlBackend(root).locate(header).path).parent / "session.lock"
    probe_elsewhere = ProbeElsewhere(root, "anchored")
    try:
        assert probe_elsewhere() == repr(lease.holder)
        lock.unlink()
        with pytest.raises(SessionLockedError) as info:
            await JsonlBackend(root).acquire_writer_lease(header)
        assert info.value.holder is None  # the file that named it is gone: refused all the same, nameless
        assert probe_elsewhere() == repr("")
        lock.with_name("new").write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
        os.replace(lock.with_name("new"), lock)
        with pytest.raises(SessionLockedError) as info:
            await JsonlBackend(root).acquire_writer_lease(header)
        assert info.value.holder is None  # a replacement nobody locks names nobody
        assert probe_elsewhere() == repr("")
        assert await JsonlBackend(root).writer_lease_holder(header) is None  # this process's own lease
        await lease.release()
        assert probe_elsewhere() == "None"
        again = await JsonlBackend(root).acquire_writer_lease(header)
        assert probe_elsewhere() == repr(again.holder)
        await again.release()
    finally:
        probe_elsewhere.close()


class ReplaceBeforeLock:
    """Another writer's move at the worst instant: ``session.lock`` replaced by a new file after the lease code
    opened it and before its lock call (the real ``flock`` runs right after, on the now nameless inode)."""

    def __init__(self, lock: Path) -> None:
        self.lock, self.armed = lock, False
        self.orphans: list[int] = []  # the inodes the lease code had opened when the replacement came
        self._real = fcntl.flock

    def __call__(self, fd: int, operation: int) -> None:
        if (
            self.armed
            and operation == fcntl.LOCK_EX | fcntl.LOCK_NB
            and os.readlink(f"/proc/self/fd/{fd}") == str(self.lock)
        ):
            self.armed = False
            self.orphans.append(os.fstat(fd).st_ino)
            self.lock.with_name("replacement").write_text("")
            os.replace(self.lock.with_name("replacement"), self.lock)
        self._real(fd, operation)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
@pytest.mark.parametrize("when", ["taking the lease", "putting a deleted lock file back"])
async def test_a_lock_file_replaced_between_open_and_lock_is_never_the_one_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The lease holds the file at the path, not the inode it opened first: a 0.2 writer, which sees only the file
    at the path, is refused after the replacement too."""
    root = tmp_path / "root"
    header = meta("raced", "/w")
    lock = Path(JsonlBackend(root).locate(header).path).parent / "session.lock"
    replace = ReplaceBeforeLock(lock)
    monkeypatch.setattr(fcntl, "flock", replace)
    if when == "taking the lease":
        lock.parent.mkdir(parents=True)
        lock.write_text("")
        replace.armed = True
        lease = await JsonlBackend(root).acquire_writer_lease(header)
    else:
        lease = await JsonlBackend(root).acquire_writer_lease(header)
        lock.unlink()
        replace.armed = True
        lease.keep()  # what every write under the lease does first
    try:
        assert len(replace.orphans) == 1, "the replacement happened"
        assert lock.stat().st_ino != replace.orphans[0]
        assert probe(lock) == "locked"  # the file at the path is the held one
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    finally:
        await lease.release()
    assert probe(lock) == "free"
