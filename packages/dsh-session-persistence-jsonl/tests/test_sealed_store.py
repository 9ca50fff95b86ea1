"""A sealed store stays sealed (DESIGN §12.3, issue 36 item 3): the first sealed write leaves ``.dsh-sealed`` at
the root, and a backend without keys then refuses plaintext writes (typed, nothing written) unless it opts out;
reading and listing still need no key. The command line is run as a real process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dsh.session_persistence import Host, PersistenceCoordinator
from dsh.session_persistence.backend import SessionKeyError
from dsh.session_persistence.testing import meta, simple_turn
from dsh.session_persistence_jsonl import JsonlBackend, SealedStoreError

from ._sealed import provider
from ._sessions import storage, turn_batches

pytestmark = pytest.mark.anyio
MARKER = ".dsh-sealed"


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _session_files(root: Path) -> dict[str, bytes]:
    return {k: v for k, v in _tree(root).items() if "session.jsonl" in k}


@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_a_keyless_backend_refuses_plaintext_writes_into_a_sealed_store(tmp_path: Path, compression: str) -> None:
    root = tmp_path / "root"
    # A plaintext session first (the store is not sealed yet: allowed), then the first sealed one.
    plain = JsonlBackend(root, compression=compression)  # type: ignore[arg-type]
    older = storage("older")
    first, second = turn_batches(2)
    await plain.append_batch(older, first, False)
    assert not (root / MARKER).exists()
    sealed = JsonlBackend(root, compression=compression, encryption=provider())  # type: ignore[arg-type]
    await sealed.append_batch(storage("secret"), turn_batches(1)[0], False)
    assert (root / MARKER).is_file()

    for backend in (plain, JsonlBackend(root, compression=compression)):  # type: ignore[arg-type]
        before = _session_files(root)
        with pytest.raises(SealedStoreError, match="allow_plaintext=True") as info:
            await backend.append_batch(storage("new"), first, False)
        assert isinstance(info.value, SessionKeyError)
        with pytest.raises(SealedStoreError):
            await backend.append_batch(older, second, True)
        assert _session_files(root) == before  # nothing written, no new session directory
        # Reads and listing need no key.
        assert sorted(h.id for h in await backend.list()) == ["older", "secret"]
        loaded = await backend.load_stored("older")
        assert loaded is not None and len(loaded.events) == len(first)

    opted = JsonlBackend(root, compression=compression, allow_plaintext=True)  # type: ignore[arg-type]
    await opted.append_batch(older, second, True)
    await opted.append_batch(storage("new"), first, False)
    assert sorted(h.id for h in await opted.list()) == ["new", "older", "secret"]


async def test_a_marker_in_any_form_refuses_a_keyless_write_even_a_dangling_symlink(tmp_path: Path) -> None:
    root = tmp_path / "root"
    plain = JsonlBackend(root)
    first, second = turn_batches(2)
    await plain.append_batch(storage("s1"), first, False)
    (root / MARKER).symlink_to(tmp_path / "nowhere")  # a name there is the store's word, whatever it names
    before = _session_files(root)
    with pytest.raises(SealedStoreError):
        await plain.append_batch(storage("s1"), second, True)
    assert _session_files(root) == before


async def test_the_marker_is_written_before_the_first_sealed_session_and_survives_a_fresh_root(tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    await JsonlBackend(root, encryption=provider()).append_batch(storage("s1"), turn_batches(1)[0], False)
    assert (root / MARKER).read_bytes().startswith(b"{")
    with pytest.raises(SealedStoreError):
        await JsonlBackend(root).append_batch(storage("s2"), turn_batches(1)[0], False)


def test_allow_plaintext_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        JsonlBackend(tmp_path, allow_plaintext="yes")  # type: ignore[arg-type]


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).with_name("dsh-sessions")
    return subprocess.run([str(cli), *argv], capture_output=True, text=True, timeout=120, check=False)


async def test_the_command_line_refuses_a_plaintext_write_and_names_the_opt_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    host = Host()
    host.load_entrypoints()
    async with PersistenceCoordinator(host, JsonlBackend(root)) as plain:
        await plain.create(meta("older"))
        await plain.append("older", simple_turn(0, 1, "first"))
        await plain.append("older", simple_turn(3, 2, "second"))
    await JsonlBackend(root, encryption=provider()).append_batch(storage("secret"), turn_batches(1)[0], False)
    before = _session_files(root)
    refused = _cli("--root", str(root), "compact", "older")
    assert refused.returncode == 7, refused.stdout + refused.stderr
    assert "allow_plaintext" in refused.stderr
    assert _session_files(root) == before
    listed = _cli("--root", str(root), "list")
    assert listed.returncode == 0, listed.stderr
    assert "older" in listed.stdout and "secret" in listed.stdout
    done = _cli("--root", str(root), "-o", "allow_plaintext=true", "compact", "older")
    assert done.returncode == 0, done.stdout + done.stderr
