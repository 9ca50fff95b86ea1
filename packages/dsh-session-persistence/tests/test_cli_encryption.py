"""``dsh-sessions`` on encrypted (sealed) JSONL stores: ``--key-env`` / ``--key-file`` give the backend its keys
through the backend class (``SupportsKeySources``), never a cipher in the core; a missing key, a wrong key and an
unusable key source are exit 7 (``key_missing`` / ``decrypt_failed`` under ``--json``), never "damaged";
``re-encrypt`` re-seals a closed session under the current key (atomically, as ``compact``).

Real files written by a real sealed ``JsonlBackend``; most commands run in-process through ``run``, and the
installed CLI (``python -m dsh.session_persistence``) runs in a subprocess for the round trip a user makes.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from dsh.session_persistence import Host, PersistenceCoordinator
from dsh.session_persistence._cli import _main
from dsh.session_persistence._cli._io import Io
from dsh.session_persistence.testing import meta, simple_turn, step_start, turn_start
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl.encryption import StaticKeyProvider

MARKER = "MARKER-c2-Grace-Hopper-1906-Arlington"
OLD, NEW = bytes(range(32)), bytes(range(200, 232))


def keys_text(*pairs: tuple[str, bytes]) -> str:
    return ",".join(f"{kid}:{base64.b64encode(key).decode()}" for kid, key in pairs)


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = _main.run(list(argv), Io(out=out, err=err, inp=io.StringIO()))
    return code, out.getvalue(), err.getvalue()


def write_store(root: Path, provider: StaticKeyProvider | None, compression: str = "zstd") -> None:
    """``closed`` (two batches, the marker in both), ``open`` (a turn left open: a load repairs it)."""

    async def main() -> None:
        host = Host()
        host.load_entrypoints()
        async with PersistenceCoordinator(host, JsonlBackend(root, compression, encryption=provider)) as c:
            await c.create(meta("closed"))
            await c.append("closed", simple_turn(0, 1, f"my address is {MARKER}"))
            await c.append("closed", simple_turn(3, 2, f"again {MARKER}"))
            await c.create(meta("open"))
            await c.append("open", [turn_start(0, 1), step_start(1, 1, 1)])

    anyio.run(main)


def stored_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("session.jsonl*"))}


def no_marker_at_rest(root: Path) -> bool:
    return all(MARKER.encode() not in data for data in stored_bytes(root).values())


@pytest.fixture
def sealed_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "sessions"
    write_store(root, StaticKeyProvider("k1", {"k1": OLD}))
    monkeypatch.setenv("KEYS_OLD", keys_text(("k1", OLD)))
    monkeypatch.setenv("KEYS_ROTATED", keys_text(("k2", NEW), ("k1", OLD)))
    monkeypatch.setenv("KEYS_NEW_ONLY", keys_text(("k2", NEW)))
    monkeypatch.setenv("KEYS_WRONG", keys_text(("k1", NEW)))  # the right id, the wrong bytes
    return root


def test_without_the_key_listing_works_and_reads_fail_with_exit_7(sealed_root: Path) -> None:
    root = str(sealed_root)
    code, out, err = cli("--root", root, "list")
    assert code == 0, err
    assert "closed" in out and "open" in out and "no_key" in out and MARKER not in out
    for command in (["show", "closed"], ["export", "closed"]):
        code, out, err = cli("--root", root, *command)
        assert code == 7, (command, out, err)
        assert 'session "closed"' in err and "batch at byte" in err and "--key-env" in err
    code, out, _err = cli("--root", root, "--json", "show", "closed")
    assert (code, json.loads(out)["error"]["code"], json.loads(out)["error"]["exit"]) == (7, "key_missing", 7)
    code, out, _err = cli("--root", root, "verify")
    assert code == 7 and "NO KEY" in out and "2 no_key" in out and "--key-env NAME" in out
    code, out, err = cli("--root", root, "repair", "open", "--yes")
    assert code == 7 and "nothing was written" in err


def test_with_the_key_every_command_works_and_writes_only_sealed_bytes(sealed_root: Path) -> None:
    root = str(sealed_root)
    code, out, err = cli("--root", root, "--key-env", "KEYS_OLD", "show", "closed")
    assert code == 0, err
    assert MARKER in out
    code, out, err = cli("--root", root, "--key-env", "KEYS_OLD", "verify")
    assert code == 0 and "1 ok, 1 recoverable" in out, (out, err)
    code, out, err = cli("--root", root, "repair", "open", "--yes", "--key-env", "KEYS_OLD")  # after the command too
    assert code == 0 and "now has 4 events, balanced" in out, err
    code, out, err = cli("--root", root, "--key-env", "KEYS_OLD", "compact", "closed")
    assert code == 0 and "compacted closed: 6 events in one batch" in out, err
    code, out, err = cli("--root", root, "--key-env", "KEYS_OLD", "export", "closed")
    assert code == 0 and out.count(MARKER) == 2, err
    assert no_marker_at_rest(sealed_root)


def test_a_wrong_key_is_exit_7_decrypt_failed_never_damage(sealed_root: Path) -> None:
    root = str(sealed_root)
    code, out, err = cli("--root", root, "--key-env", "KEYS_WRONG", "--json", "show", "closed")
    assert code == 7, err
    error = json.loads(out)["error"]
    assert error["code"] == "decrypt_failed" and "fails authentication" in error["message"]
    code, out, _err = cli("--root", root, "--key-env", "KEYS_WRONG", "verify")
    assert code == 7 and "AUTH FAILED" in out and "2 auth_failed" in out


def test_damage_outranks_a_missing_key_in_verify(sealed_root: Path) -> None:
    (path,) = [p for p in sealed_root.rglob("session.jsonl.zstd") if p.parent.name == "closed"]
    data = bytearray(path.read_bytes())
    # Inside the first sealed batch (its seal is a skippable frame): its CRC fails before any key is asked for.
    data[data.index(b"\x5e\x2a\x4d\x18") + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    code, out, _err = cli("--root", str(sealed_root), "verify")
    assert code == 1 and "CORRUPT" in out and "NO KEY" in out, out


def test_key_sources_are_checked_and_typed(sealed_root: Path, tmp_path: Path) -> None:
    root = str(sealed_root)
    key_file = tmp_path / "keys"
    key_file.write_text(f"# current first\n{keys_text(('k1', OLD))}\n")
    key_file.chmod(0o644)
    code, _out, err = cli("--root", root, "--key-file", str(key_file), "show", "closed")
    assert code == 7 and "group or others" in err
    key_file.chmod(0o600)
    code, out, err = cli("--root", root, "--key-file", str(key_file), "show", "closed")
    assert code == 0 and MARKER in out, err
    code, _out, err = cli("--root", root, "--key-env", "KEYS_NOT_SET_ANYWHERE", "show", "closed")
    assert code == 7 and "KEYS_NOT_SET_ANYWHERE is not set" in err
    code, _out, err = cli("--root", root, "--key-env", "KEYS_OLD", "--key-file", str(key_file), "list")
    assert code == 2 and "not both" in err
    code, _out, err = cli("--root", root, "--key-env", "KEYS_OLD", "-o", "encryption=x", "list")
    assert code == 2 and "both set the backend option 'encryption'" in err
    code, _out, err = cli("--backend", "memory", "--key-env", "KEYS_OLD", "list")
    assert code == 2 and 'backend "memory" does not open encrypted stores' in err


def test_re_encrypt_needs_keys_and_rotates_a_session_to_the_current_key(sealed_root: Path) -> None:
    root = str(sealed_root)
    before = stored_bytes(sealed_root)
    code, _out, err = cli("--root", root, "re-encrypt", "closed")
    assert code == 2 and "re-encrypt needs the keys" in err
    assert stored_bytes(sealed_root) == before  # refused before anything was written
    code, out, err = cli("--root", root, "--key-env", "KEYS_ROTATED", "re-encrypt", "closed")
    assert code == 0 and "re-encrypted closed: 6 events in one batch under the current key" in out, err
    # Only the new key opens it now; the session not re-encrypted still needs the old one.
    code, out, err = cli("--root", root, "--key-env", "KEYS_NEW_ONLY", "show", "closed")
    assert code == 0 and MARKER in out, err
    code, _out, err = cli("--root", root, "--key-env", "KEYS_NEW_ONLY", "show", "open")
    assert code == 7 and 'key "k1"' in err
    # Before the old key is dropped: verify with the new key alone names every session that still needs the old.
    code, out, _err = cli("--root", root, "--key-env", "KEYS_NEW_ONLY", "verify")
    assert code == 7 and "1 ok" in out and "1 no_key" in out, out
    assert [line.split()[2] for line in out.splitlines() if line.startswith("NO KEY")] == ["open:"]
    code, _out, err = cli("--root", root, "--key-env", "KEYS_ROTATED", "re-encrypt", "open")
    assert code == 1 and "repair" in err  # an interrupted session is repaired first, as for compact
    assert no_marker_at_rest(sealed_root)


def test_re_encrypt_seals_a_plaintext_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "plain"
    write_store(root, None, compression="none")
    assert not no_marker_at_rest(root)  # plain JSONL: the marker is there to find
    monkeypatch.setenv("KEYS_OLD", keys_text(("k1", OLD)))
    plain = ("--root", str(root), "-o", "compression=none")
    code, out, err = cli(*plain, "--key-env", "KEYS_OLD", "re-encrypt", "closed")
    assert code == 0, err
    (path,) = [p for p in root.rglob("session.jsonl") if p.parent.name == "closed"]
    assert MARKER.encode() not in path.read_bytes()
    code, out, _err = cli(*plain, "show", "closed")
    assert code == 7
    code, out, _err = cli(*plain, "--key-env", "KEYS_OLD", "show", "closed")
    assert code == 0 and MARKER in out


def test_the_installed_cli_opens_a_sealed_store_in_a_subprocess(sealed_root: Path) -> None:
    """The round trip from a shell: refused without the key (exit 7), rotated with both keys, read with the new."""
    env = {**os.environ, "KEYS_ROTATED": keys_text(("k2", NEW), ("k1", OLD)), "KEYS_NEW": keys_text(("k2", NEW))}
    base = [sys.executable, "-m", "dsh.session_persistence", "--root", str(sealed_root)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], capture_output=True, text=True, timeout=120, check=False, env=env)

    refused = run("--json", "export", "closed")
    assert refused.returncode == 7 and json.loads(refused.stdout)["error"]["code"] == "key_missing", refused
    if os.environ.get("DSH_LONG") != "1":  # each start of the CLI costs seconds on a loaded machine
        return
    rotated = run("--key-env", "KEYS_ROTATED", "re-encrypt", "closed")
    assert rotated.returncode == 0, rotated.stderr
    shown = run("--key-env", "KEYS_NEW", "show", "closed")
    assert shown.returncode == 0 and MARKER in shown.stdout, shown.stderr
    assert no_marker_at_rest(sealed_root)


def test_a_key_of_the_wrong_size_names_its_source_and_the_cli_does_not_ask_for_keys(
    sealed_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(sealed_root)
    monkeypatch.setenv("KEYS_SHORT", keys_text(("k1", OLD[:31])))
    code, _out, err = cli("--root", root, "--key-env", "KEYS_SHORT", "show", "closed")
    assert code == 7, err
    assert 'environment variable KEYS_SHORT: key "k1" must be exactly 32 bytes, got 31' in err
    assert "give the store's keys" not in err  # they were given: the message says which ones
    key_file = tmp_path / "short.keys"
    key_file.write_text(keys_text(("k1", OLD[:31])))
    key_file.chmod(0o600)
    code, _out, err = cli("--root", root, "--key-file", str(key_file), "show", "closed")
    assert code == 7 and f'key file "{key_file}": key "k1" must be exactly 32 bytes, got 31' in err, err
    assert "give the store's keys" not in err


def test_keys_given_that_do_not_hold_the_sessions_key_are_named_not_asked_for(sealed_root: Path) -> None:
    code, _out, err = cli("--root", str(sealed_root), "--key-env", "KEYS_NEW_ONLY", "show", "closed")
    assert code == 7 and 'sealed with key "k1"' in err, err
    assert "give the store's keys" not in err and "keys given: --key-env KEYS_NEW_ONLY" in err
    code, _out, err = cli("--root", str(sealed_root), "--key-env", "KEYS_NEW_ONLY", "export", "closed")
    assert code == 7 and "give the store's keys" not in err, err


# A meta path finder that refuses the cipher package, as if the [encryption] extra were not installed; then the CLI.
NO_CRYPTOGRAPHY = """
import sys
from importlib.abc import MetaPathFinder

class Refuse(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "cryptography" or name.startswith("cryptography."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, Refuse())
from dsh.session_persistence._cli import main
sys.exit(main())
"""


def test_without_the_cipher_package_the_cli_names_the_extra_not_a_key(sealed_root: Path) -> None:
    env = {**os.environ, "KEYS_OLD": keys_text(("k1", OLD))}
    base = [sys.executable, "-c", NO_CRYPTOGRAPHY, "--root", str(sealed_root), "--key-env", "KEYS_OLD"]
    done = subprocess.run([*base, "show", "closed"], capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert "pip install 'dsh-session-persistence[encryption]'" in done.stderr
    assert "key" not in done.stderr.replace("--key-env", "")  # not a key error, and no hint to give keys
    as_json = subprocess.run(
        [*base, "--json", "verify"], capture_output=True, text=True, timeout=120, check=False, env=env
    )
    error = json.loads(as_json.stdout)["error"]
    assert (as_json.returncode, error["code"], error["exit"]) == (4, "encryption_unavailable", 4), as_json.stderr
