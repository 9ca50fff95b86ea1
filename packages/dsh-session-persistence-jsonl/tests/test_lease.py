"""The JSONL writer lease on real files: a kernel ``flock`` on ``session.lock`` beside the transcript.

Checked from outside the lease code: another open file description (a second backend instance) and another
process (a plain ``flock`` in a subprocess) both find the file locked while a lease is held, the file names the
holder's pid and host, and releasing (or the holder dying) frees it.
"""

from __future__ import annotations

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
