"""The recorded 0.2.0 release loads and validates every log shape the 0.3 resume paths write.

``golden_v03/`` holds logs written by this tree (``golden_v03/generate.py``: SIGKILLed children, reconciled and
continued). A git worktree at the 0.2.0 commit of ``tools/releases.toml`` runs its own reader in a subprocess
(``PYTHONPATH`` at its package sources, never this tree's): ``inspect`` and ``load`` through its coordinator (the
load runs its turn validator and refuses an unknown type that is not ``ignorable``), a live seed with
``check_turns=True``, and the messages it would send a model. Logs freshly written by the current code in this test
are read the same way, so the check does not rest on the checked-in copies alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh.session_persistence import Session
from dsh.session_persistence.invariant import validate_turns
from dsh.session_persistence_jsonl import JsonlBackend
from test_continue_crash import child

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden_v03"
sys.path.insert(0, str(REPO / "tools"))
import _wheeltools as wt  # noqa: E402

UNKNOWN_PREFIX = "The tool call was interrupted after it was recorded, but no result was durably recorded."

READER = r"""
import json, sys
import anyio
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
from dsh.session_persistence_jsonl import JsonlBackend

async def main(root, compression):
    host = Host()
    backend = JsonlBackend(root, compression=compression)
    async with PersistenceCoordinator(host, backend) as coordinator:
        inspected = await coordinator.inspect("continue-crash")
        loaded = await coordinator.load("continue-crash")
        store = SessionStore(host, check_turns=True)
        live = store.create("continue-crash", seed=loaded.events, meta=loaded.meta)
        texts = []
        for message in live.derive_messages():
            for block in message.content:
                if getattr(block, "tool_call_id", None) == "charge-1":
                    texts.append(" ".join(getattr(b, "text", "") for b in block.content))
        print(json.dumps({
            "inspected": len(inspected.events),
            "loaded": [[e.type, type(e).__name__, getattr(e, "ignorable", None) is True] for e in loaded.events],
            "charge": texts,
        }))

anyio.run(main, sys.argv[1], sys.argv[2])
"""


#: The commit the 0.2.0 release was built from (tools/releases.toml records it once 0.2.0 is entered there).
RELEASE_0_2_0 = "01f5c4d0cb322a86f78c8d90109d2e25a5ad5b2a"


def _release_commit() -> str:
    record = wt.load_pyproject(REPO / "tools" / "releases.toml").get("release", [])
    found = {e["commit"] for e in record if e["distribution"] == "dsh-session-persistence" and e["version"] == "0.2.0"}
    assert found <= {RELEASE_0_2_0}, found
    return RELEASE_0_2_0


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("release") / "v0.2.0"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "--quiet", str(where), _release_commit()], cwd=REPO, check=True
    )
    yield where  # type: ignore[misc]
    subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=REPO, check=False)
    subprocess.run(["git", "worktree", "prune"], cwd=REPO, check=False)


def read_with_release(release: Path, root: Path, compression: str) -> dict[str, Any]:
    src = [
        str(release / "packages" / name / "src")
        for name in ("dsh-session-persistence", "dsh-session-persistence-jsonl")
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(src), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-c", READER, str(root), compression],
        cwd=release,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def check_release_view(view: dict[str, Any], shape: str) -> None:
    loaded = view["loaded"]
    assert view["inspected"] == len(loaded)  # balanced already: the release has nothing to repair
    new = [(etype, cls, flag) for etype, cls, flag in loaded if etype in ("turn/continue", "tool/reconcile")]
    assert new and all(cls == "OpaqueEvent" and flag for _, cls, flag in new)  # kept, ignored, never interpreted
    continuations = {"continued-twice": 2}.get(shape, 1)
    assert [etype for etype, _, _ in new].count("turn/continue") == continuations
    # The release shows the model the repair's honest text (it does not know findings); nothing else changed.
    assert [t.startswith(UNKNOWN_PREFIX) for t in view["charge"]] == [True]


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("shape", ["continued-twice", "not-happened", "cannot-tell"])
def test_release_reads_the_golden_logs(release: Path, tmp_path: Path, compression: str, shape: str) -> None:
    root = tmp_path / "sessions"
    shutil.copytree(GOLDEN / compression / shape / "sessions", root)
    check_release_view(read_with_release(release, root, compression), shape)


@pytest.mark.parametrize(("backend", "compression"), [("asyncio", "zstd"), ("trio", "none")])
def test_release_reads_a_freshly_written_continued_log(
    release: Path, tmp_path: Path, backend: str, compression: str
) -> None:
    assert child(tmp_path, "start", backend, compression, kill_in="charge") == -9
    assert child(tmp_path, "resume", backend, compression, kill_in="notify") == -9
    assert child(tmp_path, "resume", backend, compression) == 0
    check_release_view(read_with_release(release, tmp_path / "sessions", compression), "continued-twice")


def test_cli_show_and_verify_display_the_reconciliation(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    shutil.copytree(GOLDEN / "none" / "continued-twice" / "sessions", root)
    cli = [sys.executable, "-m", "dsh.session_persistence", "--root", str(root), "-o", "compression=none"]

    def run(*args: str) -> str:
        proc = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    shown = run("show", "continue-crash")
    assert "reconciled charge [charge-1]: happened (found in the ledger)" in shown
    assert "[REPAIRED: TOOL_OUTCOME_UNKNOWN] [RECONCILED: happened, see below]" in shown
    assert "(continues interrupted turn 1: no new user message)" in shown
    document = json.loads(run("show", "--json", "continue-crash"))
    assert [(f["callId"], f["outcome"]) for f in document["resume"]["reconciled"]] == [
        ("charge-1", "happened"),
        ("notify-4", "happened"),
    ]
    assert document["resume"]["continued"] == [{"turn": 2, "interruptedTurn": 1}, {"turn": 3, "interruptedTurn": 2}]
    assert document["resume"]["unknownOutcomes"] == []
    verified = run("verify")
    assert "reconciled charge [charge-1]: happened" in verified and "turn 3 continues interrupted turn 2" in verified
    report = json.loads(run("verify", "--json"))["sessions"][0]
    assert report["resume"]["continued"][1] == {"turn": 3, "interruptedTurn": 2}
    assert (root / "_no-cwd" / "continue-crash" / "session.jsonl").read_bytes() == (
        GOLDEN / "none" / "continued-twice" / "sessions" / "_no-cwd" / "continue-crash" / "session.jsonl"
    ).read_bytes()  # read-only


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("shape", ["continued-twice", "not-happened", "cannot-tell"])
def test_this_tree_validates_the_golden_logs_and_shows_the_findings(compression: str, shape: str) -> None:
    async def read() -> list[Any]:
        backend = JsonlBackend(GOLDEN / compression / shape / "sessions", compression=compression)
        log = await backend.load_stored("continue-crash")
        return list(log.events)

    events = anyio.run(read)
    validate_turns(events)  # the hypothesis-tested validator, on logs the real resume paths wrote
    session = Session("continue-crash", seed=events)
    [text] = [
        " ".join(getattr(b, "text", "") for b in block.content)
        for message in session.derive_messages()
        for block in message.content
        if getattr(block, "tool_call_id", None) == "charge-1"
    ]
    expected = {"continued-twice": "DID take effect", "not-happened": "did NOT take effect"}.get(shape, UNKNOWN_PREFIX)
    assert expected in text
