"""A symlink inside the layout is refused per item, never for the whole root (issue 36 item 8): with one session's
transcript and another session's directory replaced by symlinks (to real copies outside the root), ``list``,
``list --limit`` and ``verify`` still answer for every other session and name the two refused ones. The command
line runs as a real process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from dsh.session_persistence import Host, PersistenceCoordinator
from dsh.session_persistence.backend import ListQuery
from dsh.session_persistence.testing import meta, simple_turn
from dsh.session_persistence_jsonl import JsonlBackend


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).with_name("dsh-sessions")
    return subprocess.run([str(cli), *argv], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    backend = JsonlBackend(root)

    async def write() -> None:
        host = Host()
        host.load_entrypoints()
        async with PersistenceCoordinator(host, backend) as coordinator:
            for session_id in ("a", "linked-file", "linked-dir"):
                await coordinator.create(meta(session_id))
                await coordinator.append(session_id, simple_turn(0, 1, f"hello {session_id}"))

    anyio.run(write)
    outside = tmp_path / "outside"
    outside.mkdir()
    transcript = Path(backend.locate(meta("linked-file")).path)
    shutil.move(transcript, outside / transcript.name)
    os.symlink(outside / transcript.name, transcript)
    session_dir = Path(backend.locate(meta("linked-dir")).path).parent
    shutil.move(session_dir, outside / "dir")
    os.symlink(outside / "dir", session_dir)
    return root


def test_list_and_verify_refuse_symlinks_per_session(root: Path) -> None:
    for argv in (["list"], ["list", "--limit", "5"]):
        listed = _cli("--root", str(root), *argv)
        assert listed.returncode == 0, (argv, listed.stdout, listed.stderr)
        assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ["a"], listed.stdout
        assert "linked-file" in listed.stderr and "linked-dir" in listed.stderr, listed.stderr  # reported
    listed = _cli("--root", str(root), "list", "--json")
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert [s["id"] for s in document["sessions"]] == ["a"]
    assert sorted(u["id"] for u in document["unreadable"]) == ["linked-dir", "linked-file"]
    verify = _cli("--root", str(root), "verify")
    assert verify.returncode == 1, verify.stdout + verify.stderr
    lines = {line.split()[1].rstrip(":"): line for line in verify.stdout.splitlines() if line.split()[0] != "verify"}
    assert lines["a"].startswith("ok"), verify.stdout
    for refused in ("linked-file", "linked-dir"):
        assert lines[refused].startswith("CORRUPT") and "symbolic link" in lines[refused], verify.stdout


@pytest.mark.anyio
async def test_list_page_leaves_a_symlinked_transcript_out(root: Path) -> None:
    backend = JsonlBackend(root)
    assert [r.id for r in await backend.list_page(ListQuery())] == ["a"]
    assert [r.id for r in await backend.list_page(ListQuery(limit=5))] == ["a"]
    artifacts = {a.session_id for a in await backend.list_artifacts()}
    assert artifacts == {"a", "linked-file", "linked-dir"}
