"""Session logs written by recorded releases load in this build exactly as that release read them, or are refused
with the same typed error.

``golden/v<version>/`` holds the storage roots (one per encoding) written by ``golden/generate.py`` running
against that release, and ``expected.json``, what the release's own ``inspect`` and ``load`` returned. A format
change that cannot read an older log fails here; such a break must be deliberate: documented in the changelog,
with the old directory moved out of this test and the reason recorded beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import dsh.session_persistence.backend as backend_face
import pytest
from dsh.session_persistence import Host, PersistenceCoordinator
from dsh.session_persistence.backend import (
    SESSION_FORMAT_VERSION,
    SessionPersistenceError,
    event_to_builtins,
    header_to_builtins,
)
from dsh.session_persistence_jsonl import JsonlBackend

pytestmark = pytest.mark.anyio

GOLDEN = Path(__file__).resolve().parent / "golden"


def _cases() -> list[Any]:
    cases = []
    for expected_file in sorted(GOLDEN.glob("v*/expected.json")):
        expected = json.loads(expected_file.read_text())
        for compression, sessions in sorted(expected["encodings"].items()):
            for session_id, view in sorted(sessions.items()):
                case = (expected_file.parent, compression, session_id, view)
                cases.append(pytest.param(*case, id=f"{expected_file.parent.name}-{compression}-{session_id}"))
    return cases


CASES = _cases()


def test_every_recorded_release_has_golden_logs() -> None:
    """Each release directory holds every shape in both encodings (a generator run that lost one fails here)."""
    shapes = {"completed", "forked", "unpacked", "interrupted", "torn", "damaged"}
    releases = sorted(p.parent.name for p in GOLDEN.glob("v*/expected.json"))
    assert "v0.1.0" in releases
    for release in releases:
        expected = json.loads((GOLDEN / release / "expected.json").read_text())
        assert set(expected["encodings"]) == {"zstd", "none"}, release
        for sessions in expected["encodings"].values():
            assert set(sessions) == shapes, release


def _events_in(document: Any) -> list[Any]:
    """Every event of every ``events`` list in an expected.json document."""
    if isinstance(document, dict):
        return [e for k, v in document.items() for e in (v if k == "events" else _events_in(v))]
    if isinstance(document, list):
        return [e for item in document for e in _events_in(item)]
    return []


@pytest.mark.parametrize("expected_file", sorted(GOLDEN.glob("v*/expected.json")), ids=lambda p: p.parent.name)
def test_golden_expectations_hold_one_event_per_line(expected_file: Path) -> None:
    """generate.py writes each expected event on a line of its own, so a regenerated file diffs event by event."""
    text = expected_file.read_text()
    events = _events_in(json.loads(text))
    assert events
    on_their_own_line = [json.loads(line.strip().removesuffix(",")) for line in text.splitlines() if '"seq": ' in line]
    assert on_their_own_line == events


def _copy_root(release: Path, compression: str, tmp_path: Path) -> Path:
    """A private copy with the modes the backend writes (git keeps neither 0700 nor 0600)."""
    root = tmp_path / compression
    shutil.copytree(release / compression, root)
    for here, _dirs, files in os.walk(root):
        os.chmod(here, 0o700)
        for name in files:
            os.chmod(os.path.join(here, name), 0o600)
    return root


def _view(inspection: Any, stored: int) -> dict[str, Any]:
    events = []
    for event in inspection.events:
        wire = event_to_builtins(event)
        item = {"seq": wire["seq"], "type": wire["type"], "data": wire.get("data")}
        if wire["seq"] < stored:  # repair closers are stamped when they are made
            item["time"] = wire["time"]
        for key in sorted(set(wire) - {"seq", "type", "data", "time"}):
            item[key] = wire[key]
        events.append(item)
    return {
        "header": header_to_builtins(inspection.meta),
        "inherited_event_count": inspection.inherited_event_count,
        "events": events,
    }


@pytest.mark.parametrize(("release", "compression", "session_id", "expected"), CASES)
async def test_golden_log_loads_as_the_release_read_it(
    release: Path, compression: str, session_id: str, expected: dict[str, Any], tmp_path: Path
) -> None:
    root = _copy_root(release, compression, tmp_path)
    path = root.parent / expected["file"]
    original = path.read_bytes()
    assert len(original) == expected["size"]

    if "error" in expected:  # damaged: refused by every read, and left as it is
        error = getattr(backend_face, expected["error"])
        assert issubclass(error, SessionPersistenceError)
        async with PersistenceCoordinator(Host(), JsonlBackend(root, compression=compression)) as persistence:
            with pytest.raises(error):
                await persistence.read_from(session_id, 0)
            with pytest.raises(error):
                await persistence.inspect(session_id)
            with pytest.raises(error):
                await persistence.load(session_id)
        assert path.read_bytes() == original, "a refused log was changed"
        return

    stored = expected["stored_events"]
    # A load that must repair is this build's first write to the log: it upgrades a v0 file to log format v1
    # (one atomic replacement; the events are the same, the header says version 1). A load with nothing to
    # repair leaves the file untouched, whatever its version.
    writes = len(expected["load"]["events"]) != stored or expected["bytes_kept"] < len(original)
    upgraded = writes and expected["load"]["header"]["version"] < SESSION_FORMAT_VERSION

    def as_written(view: dict[str, Any]) -> dict[str, Any]:
        if not upgraded:
            return view
        return {**view, "header": {**view["header"], "version": SESSION_FORMAT_VERSION}}

    async with PersistenceCoordinator(Host(), JsonlBackend(root, compression=compression)) as persistence:
        assert len((await persistence.read_from(session_id, 0)).events) == stored
        assert _view(await persistence.inspect(session_id), stored) == expected["inspect"]
        assert path.read_bytes() == original, "inspect wrote"
        assert _view(await persistence.load(session_id), stored) == as_written(expected["load"])

    after = path.read_bytes()
    kept = expected["bytes_kept"]
    if not writes:  # nothing to repair: the file is untouched
        assert after == original, "load of a clean log wrote"
    elif upgraded:
        assert after.startswith(b"\x5d\x2a\x4d\x18" if compression == "zstd" else b'{"type":"dsh.batch"')
    else:
        assert after[:kept] == original[:kept], "load rewrote committed bytes"

    # A restarted process finds exactly what the release's load left: the committed prefix unchanged (time
    # included), the repair closers durable, the torn fragment gone (appending after it would read as damage).
    async with PersistenceCoordinator(Host(), JsonlBackend(root, compression=compression)) as persistence:
        reread = await persistence.read_from(session_id, 0)
        assert _view(reread, stored)["events"] == expected["load"]["events"]
        assert _view(await persistence.load(session_id), stored) == as_written(expected["load"])
    assert path.read_bytes() == after, "a second load wrote again"


@pytest.mark.parametrize(("release", "compression", "session_id", "expected"), CASES)
def test_dsh_sessions_verify_judges_the_golden_log_without_writing(
    release: Path, compression: str, session_id: str, expected: dict[str, Any], tmp_path: Path
) -> None:
    """`dsh-sessions verify ID`: exit 0 for what loads (torn and interrupted are recoverable), 1 for damage."""
    root = _copy_root(release, compression, tmp_path)
    path = root.parent / expected["file"]
    original = path.read_bytes()
    cli = Path(sys.executable).with_name("dsh-sessions")
    command = [str(cli), "--root", str(root), "-o", f"compression={compression}", "verify", session_id]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == (1 if "error" in expected else 0), done.stdout + done.stderr
    assert path.read_bytes() == original, "verify wrote"
