"""``dsh-sessions`` as an operator meets it (issue #36 item 14): ``--version``; ``compact`` and ``re-encrypt`` over
several sessions or ``--all`` (rotating a store's key is one command), with a progress line on a terminal only; the
``list`` table's EVENTS is the number ``--json`` gives; ``repair`` suggests only a next step that works (``rm`` for an
empty transcript) and says what it already did apart from what a cold load will do.

Real files written by a real ``JsonlBackend``; most commands run in-process through ``run``; ``--version`` and the
progress line run in a real process (the progress line with its stderr on a pseudo-terminal).
"""

from __future__ import annotations

import base64
import io
import json
import os
import select
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh.session_persistence import Host, PersistenceCoordinator
from dsh.session_persistence._cli import _main
from dsh.session_persistence._cli._io import Io
from dsh.session_persistence.backend import StorageMetadata
from dsh.session_persistence.testing import (
    assistant_message,
    event,
    meta,
    one_turn_log,
    simple_turn,
    step_end,
    step_start,
    turn_end,
    turn_start,
    user_message,
)
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl.encryption import StaticKeyProvider

OLD, NEW = bytes(range(32)), bytes(range(200, 232))
CLOSED = ("a", "b", "c")


class Result:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> Any:
        return json.loads(self.out)


def cli(*argv: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    code = _main.run(list(argv), Io(out=out, err=err, inp=io.StringIO()))
    return Result(code, out.getvalue(), err.getvalue())


def keys_text(*pairs: tuple[str, bytes]) -> str:
    return ",".join(f"{kid}:{base64.b64encode(key).decode()}" for kid, key in pairs)


def transcript(root: Path, session_id: str) -> Path:
    return Path(JsonlBackend(root).locate(meta(session_id)).path)


def write_store(root: Path, provider: StaticKeyProvider | None, *, interrupted: bool = True) -> None:
    """Closed sessions ``a``, ``b``, ``c`` (two batches each) and, with ``interrupted``, ``open`` (a turn left open:
    not closed, so no rewrite takes it before a load repairs it)."""

    async def main() -> None:
        host = Host()
        host.load_entrypoints()
        async with PersistenceCoordinator(host, JsonlBackend(root, encryption=provider)) as coordinator:
            for session_id in CLOSED:
                await coordinator.create(meta(session_id))
                await coordinator.append(session_id, simple_turn(0, 1, f"hello {session_id}"))
                await coordinator.append(session_id, simple_turn(3, 2, "again"))
            if interrupted:
                await coordinator.create(meta("open"))
                await coordinator.append("open", [turn_start(0, 1), user_message(1, "pay")])
                await coordinator.append("open", [step_start(2, 1, 1)])

    anyio.run(main)


def readable_with(root: Path, keys: StaticKeyProvider, session_id: str) -> bool:
    async def main() -> bool:
        async with PersistenceCoordinator(Host(), JsonlBackend(root, encryption=keys)) as coordinator:
            try:
                await coordinator.inspect(session_id)
            except Exception:
                return False
            return True

    return anyio.run(main)


@pytest.fixture
def sealed_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "sessions"
    write_store(root, StaticKeyProvider("k1", {"k1": OLD}))
    monkeypatch.setenv("KEYS_ROTATED", keys_text(("k2", NEW), ("k1", OLD)))
    monkeypatch.setenv("KEYS_NEW_ONLY", keys_text(("k2", NEW)))
    return root


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DSH_SESSIONS_ROOT"}
    env.update(extra)
    return env


# ----------------------------------------------------------------------------------------------------------------
# --version


def test_version_names_the_core_and_every_installed_dsh_distribution() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dsh.session_persistence", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    first, *rest = proc.stdout.splitlines()
    assert first == f"dsh-sessions {metadata.version('dsh-session-persistence')} (dsh-session-persistence)"
    listed = dict(line.split() for line in rest)
    assert listed["dsh-session-persistence"] == metadata.version("dsh-session-persistence")
    assert listed["dsh-session-persistence-jsonl"] == metadata.version("dsh-session-persistence-jsonl")
    assert all(name.startswith("dsh-") for name in listed)
    as_json = cli("--version", "--json")
    assert as_json.code == 0
    assert as_json.json() == {"version": metadata.version("dsh-session-persistence"), "distributions": listed}


# ----------------------------------------------------------------------------------------------------------------
# list: EVENTS


def test_the_table_events_column_is_the_json_events(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    chunk = {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "hel"}}
    streamed = [
        turn_start(0, 1),
        user_message(1, "hi"),
        step_start(2, 1, 1),
        event(3, "assistant/chunk", chunk),
        event(4, "assistant/chunk", chunk),
        assistant_message(5, "hello"),
        step_end(6, 1, 1),
        turn_end(7, 1),
    ]

    async def plant() -> None:
        backend = JsonlBackend(root)
        for session_id, events in (("plain", one_turn_log()), ("streamed", streamed)):
            await backend.append_batch(StorageMetadata(meta(session_id)), events, False)

    anyio.run(plant)
    documents = {s["id"]: s for s in cli("--root", str(root), "list", "--json").json()["sessions"]}
    assert documents["streamed"]["chunks"] == 2  # the case where the two used to differ
    header, *rows = cli("--root", str(root), "list").out.splitlines()
    column = header.index("EVENTS")
    for row in rows:
        session_id = row.split()[0]
        assert row[column:].split()[0] == str(documents[session_id]["events"]), row


# ----------------------------------------------------------------------------------------------------------------
# compact / re-encrypt over several sessions


def test_reencrypt_all_rotates_every_closed_session_and_reports_the_rest(sealed_root: Path) -> None:
    root = str(sealed_root)
    before = transcript(sealed_root, "open").read_bytes()
    run = cli("--root", root, "--key-env", "KEYS_ROTATED", "re-encrypt", "--all")
    assert run.code == 1, run.err  # incomplete: the interrupted session is not closed
    lines = run.out.splitlines()
    assert sorted(line.split(":")[0] for line in lines[:-1]) == [
        "re-encrypted a",
        "re-encrypted b",
        "re-encrypted c",
        "skipped open",
    ]
    assert "load or repair it first" in run.out
    assert lines[-1] == "re-encrypt: 3 re-encrypted, 1 skipped"
    new_only = StaticKeyProvider("k2", {"k2": NEW})
    assert all(readable_with(sealed_root, new_only, sid) for sid in CLOSED)
    assert transcript(sealed_root, "open").read_bytes() == before  # nothing written to what was skipped
    # Repaired, the last one follows, and the whole store is under the new key: exit 0.
    assert cli("--root", root, "--key-env", "KEYS_ROTATED", "repair", "open", "--yes").code == 0
    again = cli("--root", root, "--key-env", "KEYS_ROTATED", "re-encrypt", "--all", "--json")
    assert again.code == 0, again.err
    doc = again.json()
    assert sorted(r["id"] for r in doc["rewritten"]) == [*CLOSED, "open"] and doc["skipped"] == []
    assert readable_with(sealed_root, new_only, "open")


def test_rewrite_arguments_are_checked_before_anything_is_written(sealed_root: Path) -> None:
    root = str(sealed_root)
    stored = {p: p.read_bytes() for p in sealed_root.rglob("session.jsonl*")}
    for argv, code in (
        (["compact"], 2),
        (["compact", "a", "--all"], 2),
        (["compact", "a", "nope"], 3),
        (["--key-env", "KEYS_ROTATED", "re-encrypt"], 2),
        (["--key-env", "KEYS_ROTATED", "re-encrypt", "b", "nope"], 3),
        (["re-encrypt", "--all"], 2),  # no keys: it would write plaintext
    ):
        run = cli("--root", root, *argv)
        assert run.code == code, (argv, run.err)
    assert {p: p.read_bytes() for p in sealed_root.rglob("session.jsonl*")} == stored


def test_compact_of_named_sessions_with_a_missing_key_is_exit_7(sealed_root: Path) -> None:
    run = cli("--root", str(sealed_root), "--key-env", "KEYS_NEW_ONLY", "compact", "a", "b", "--json")
    assert run.code == 7, run.err
    doc = run.json()
    assert doc["rewritten"] == [] and [s["id"] for s in doc["skipped"]] == ["a", "b"]
    # One id: the same document as before --all existed.
    single = cli("--root", str(sealed_root), "--key-env", "KEYS_ROTATED", "compact", "a", "--json")
    assert single.code == 0 and set(single.json()) == {"id", "events", "bytesBefore", "bytesAfter"}


def read_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, str, bytes]:
    """Run with stderr on a pseudo-terminal (stdout a pipe); returns (exit code, stdout, what the terminal got)."""
    import pty

    primary, secondary = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=secondary, env=env)
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([primary], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    assert proc.stdout is not None
    with proc.stdout:
        out = proc.stdout.read().decode()
    code = proc.wait(timeout=30)
    os.close(primary)
    return code, out, seen


@pytest.mark.skipif(os.name != "posix", reason="pseudo-terminals are POSIX")
def test_reencrypt_all_shows_progress_on_a_terminal_and_plain_lines_elsewhere(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    write_store(root, StaticKeyProvider("k1", {"k1": OLD}), interrupted=False)
    env = child_env(KEYS=keys_text(("k2", NEW), ("k1", OLD)))
    argv = [sys.executable, "-m", "dsh.session_persistence", "--root", str(root), "--key-env", "KEYS"]
    code, out, terminal = read_terminal([*argv, "re-encrypt", "--all"], env)
    assert code == 0, terminal
    shown = terminal.decode()
    for done in (1, 2, 3):
        assert f"\rre-encrypting sessions {done}/3" in shown, shown
    assert shown.endswith("\r"), shown  # erased at the end
    assert out.splitlines()[-1] == "re-encrypt: 3 re-encrypted, 0 skipped"
    piped = subprocess.run(
        [*argv, "compact", "--all"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == ""  # no indicator where nobody watches
    *done, summary = piped.stdout.splitlines()
    assert sorted(line.split(":")[0] for line in done) == [f"compacted {sid}" for sid in CLOSED]
    assert summary == "compact: 3 compacted, 0 skipped"


# ----------------------------------------------------------------------------------------------------------------
# repair: only next steps that work, and what a cold load will do apart from what was done


def test_repair_of_an_empty_transcript_suggests_rm_which_works(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    write_store(root, None, interrupted=False)
    path = transcript(root, "a")
    path.write_bytes(b"")
    for argv in (["repair", "a", "--yes"], ["repair", "a", "--discard-damaged-tail", "--yes"]):
        run = cli("--root", str(root), *argv)
        assert run.code == 1
        assert "--discard-damaged-tail a" not in run.err  # the option that then fails is not offered
        assert "`dsh-sessions rm a`" in run.err and f"`rm {path}`" in run.err, run.err
        assert path.read_bytes() == b""
    assert cli("--root", str(root), "rm", "a", "--yes").code == 0  # the step suggested works
    assert not path.exists()


def flip_last_batch(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # inside the final batch's data: its CRC fails
    path.write_bytes(bytes(data))


def test_repair_after_discarding_says_what_was_done_apart_from_what_a_load_will_do(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    write_store(root, None)
    for session_id in ("a", "open"):
        flip_last_batch(transcript(root, session_id))
    plain = cli("--root", str(root), "repair", "open", "--yes")
    assert plain.code == 1 and "`dsh-sessions repair --discard-damaged-tail open`" in plain.err
    run = cli("--root", str(root), "repair", "open", "--discard-damaged-tail", "--yes")
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    plan_at = lines.index("session open: a cold load will:")
    assert lines[plan_at - 1].startswith("discarded ") and "bytes from session open" in lines[plan_at - 1]
    plan = lines[plan_at + 1 : -1]
    assert plan and all(line.startswith("  - append ") for line in plan), lines
    assert lines[-1].startswith("repaired: session open now has")
    # Balanced once its damaged final batch is gone: nothing more to do, said so.
    doc = cli("--root", str(root), "repair", "a", "--discard-damaged-tail", "--yes", "--json").json()
    assert doc["plan"] == [] and doc["repaired"] is False and "the final batch at bytes" in doc["discarded"]
