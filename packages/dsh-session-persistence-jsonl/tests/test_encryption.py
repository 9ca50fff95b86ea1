"""Sealed sessions: no plaintext at rest, typed errors for a missing or wrong key and for moved batches, rotation,
listing without the key, and the conformance and crash-state kits on a sealed backend (both encodings)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import zstandard
from dsh.session_persistence.backend import (
    SessionBackend,
    SessionFormatUnsupportedError,
    SessionPersistenceCorruptionError,
)
from dsh.session_persistence.testing import CrashBackend, CrashStateConformance
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl._format.v1 import BufferSource, encode_declared_batch, walk_declared
from dsh.session_persistence_jsonl.encryption import (
    SessionDecryptError,
    SessionKeyError,
    StaticKeyProvider,
    parse_keys,
)

from ._formats import pairs
from ._sealed import HERE, KEY_NEW, KEY_OLD, provider, sealed_backend
from ._sessions import Builder, storage
from .test_conformance import TestJsonlConformance

MARKER = "MARKER-7f3a-Ada-Lovelace-42-Elm-Street"
pytestmark = pytest.mark.anyio


@pytest.fixture(params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _batches() -> list[list[Any]]:
    b = Builder()
    b.turn_start(0)
    b.user(0, f"my address is {MARKER}")
    first = list(b.events)
    b.events.clear()
    b.user(0, f"again {MARKER}")
    b.turn_end(0)
    return [first, list(b.events)]


async def _write(backend: JsonlBackend, session_id: str = "s1") -> tuple[Any, Path]:
    st = storage(session_id)
    for i, batch in enumerate(_batches()):
        await backend.append_batch(st, batch, i > 0)
    return st, Path(backend.locate(st.meta).path)


def _all_bytes(root: Path) -> list[bytes]:
    out = []
    for path in root.rglob("*"):
        if path.is_file():
            raw = path.read_bytes()
            out.append(raw)
            if path.suffix == ".zstd":  # what zstdcat prints: every real frame (the seals are skippable frames)
                out.append(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True).read())
    return out


async def test_no_plaintext_of_a_marker_at_rest(tmp_path: Path, compression: str) -> None:
    backend = sealed_backend(tmp_path / "root", compression=compression)
    await _write(backend)
    loaded = await backend.load_stored("s1")
    assert loaded is not None and MARKER in str(loaded.events)
    blobs = _all_bytes(tmp_path / "root")
    assert blobs and not any(MARKER.encode() in blob for blob in blobs)
    plain = JsonlBackend(tmp_path / "plain", compression=compression)  # type: ignore[arg-type]
    await _write(plain)
    assert any(MARKER.encode() in blob for blob in _all_bytes(tmp_path / "plain"))  # the check can fail


async def test_listing_works_without_the_key_and_loading_needs_it(tmp_path: Path, compression: str) -> None:
    await _write(sealed_backend(tmp_path / "root", compression=compression))
    keyless = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    assert [h.id for h in await keyless.list()] == ["s1"]
    with pytest.raises(SessionKeyError, match=r'session "s1": batch at byte \d+ \(seqs 0\.\.\d+'):
        await keyless.load_stored("s1")
    other = JsonlBackend(tmp_path / "root", compression=compression, encryption=provider("k9", k9=KEY_NEW))  # type: ignore[arg-type]
    with pytest.raises(SessionKeyError, match='sealed with key "k1", which the key provider does not hold'):
        await other.load_stored("s1")
    with pytest.raises(SessionKeyError, match="no key provider"):
        await keyless.append_batch(storage("s1"), [_next_event(tmp_path, compression)], True)


def _next_event(tmp_path: Path, compression: str) -> Any:
    b = Builder(start_seq=len([e for batch in _batches() for e in batch]))
    b.turn_start(1)
    return b.events[0]


async def test_a_wrong_key_fails_authentication_typed(tmp_path: Path, compression: str) -> None:
    await _write(sealed_backend(tmp_path / "root", compression=compression))
    wrong = JsonlBackend(tmp_path / "root", compression=compression, encryption=provider(k1=KEY_NEW))  # type: ignore[arg-type]
    with pytest.raises(SessionDecryptError, match=r'session "s1": batch at byte \d+ .*fails authentication'):
        await wrong.load_stored("s1")
    assert not isinstance(SessionDecryptError("x"), SessionPersistenceCorruptionError)  # repair never discards it


def _redeclared(raw: bytes, compression: str, first_seq: int, count: int, data: bytes) -> bytes:
    """What a tamperer who recomputes the CRCs writes: a valid declaration for ``data`` at another place."""
    from dsh.session_persistence_jsonl._format.v1_declarations import line_declaration, zstd_declaration

    declare = zstd_declaration if compression == "zstd" else line_declaration
    return declare(first_seq, count, data) + data


async def test_a_batch_swapped_between_sessions_fails_authentication(tmp_path: Path, compression: str) -> None:
    backend = sealed_backend(tmp_path / "root", compression=compression)
    _st, p1 = await _write(backend, "s1")
    _st, p2 = await _write(backend, "s2")
    a, b = p1.read_bytes(), p2.read_bytes()
    pa, pb = pairs(a, compression), pairs(b, compression)
    # Same seqs, same key, both CRCs valid: only the associated data (the other header) tells them apart.
    p1.write_bytes(a[: pa[1].start] + b[pb[1].start : pb[1].end] + a[pa[1].end :])
    with pytest.raises(SessionDecryptError, match=r'session "s1": batch at byte \d+ \(seqs 0\.\.'):
        await backend.load_stored("s1")


async def test_a_batch_moved_within_a_session_fails_typed(tmp_path: Path, compression: str) -> None:
    backend = sealed_backend(tmp_path / "root", compression=compression)
    _st, path = await _write(backend)
    raw = path.read_bytes()
    head, first, second = pairs(raw, compression)
    seqs = [(0, len(_batches()[0])), (len(_batches()[0]), len(_batches()[1]))]
    # Moved as they are: the seq order of the declarations refuses it.
    path.write_bytes(raw[: head.end] + raw[second.start : second.end] + raw[first.start : first.end])
    with pytest.raises(SessionPersistenceCorruptionError):
        await backend.load_stored("s1")
    # Moved with declarations rewritten to fit the new place: the seq range in the associated data refuses it.
    d1, d2 = raw[first.data_start : first.end], raw[second.data_start : second.end]
    moved = _redeclared(raw, compression, seqs[0][0], seqs[0][1], d2)
    moved += _redeclared(raw, compression, seqs[1][0], seqs[1][1], d1)
    backend = sealed_backend(tmp_path / "root", compression=compression)
    path.write_bytes(raw[: head.end] + moved)
    with pytest.raises(SessionDecryptError, match="fails authentication"):
        await backend.load_stored("s1")


async def test_a_tampered_batch_with_its_crc_recomputed_fails_authentication(tmp_path: Path, compression: str) -> None:
    backend = sealed_backend(tmp_path / "root", compression=compression)
    _st, path = await _write(backend)
    raw = path.read_bytes()
    last = pairs(raw, compression)[-1]
    data = bytearray(raw[last.data_start : last.end])
    at = len(data) - 20 if compression == "zstd" else len(data) - 8  # inside the ciphertext (or its base64)
    data[at] = ord("A") if data[at] != ord("A") else ord("B")
    count = len(_batches()[1])
    path.write_bytes(raw[: last.start] + _redeclared(raw, compression, len(_batches()[0]), count, bytes(data)))
    with pytest.raises((SessionDecryptError, SessionPersistenceCorruptionError)) as info:
        await backend.load_stored("s1")
    assert "s1" in str(info.value) and "byte" in str(info.value)


async def test_rotation_keeps_old_sessions_loading(tmp_path: Path, compression: str) -> None:
    root = tmp_path / "root"
    await _write(sealed_backend(root, compression=compression), "old")
    rotated = JsonlBackend(
        root, compression=compression, encryption=StaticKeyProvider("k2", {"k2": KEY_NEW, "k1": KEY_OLD})
    )  # type: ignore[arg-type]
    await rotated.append_batch(storage("old"), [_next_event(tmp_path, compression)], True)
    await _write(rotated, "new")
    old = await rotated.load_stored("old")
    assert old is not None and len(old.events) == len([e for b in _batches() for e in b]) + 1
    assert (await rotated.load_stored("new")) is not None
    only_new = JsonlBackend(root, compression=compression, encryption=provider("k2", k2=KEY_NEW))  # type: ignore[arg-type]
    assert (await only_new.load_stored("new")) is not None
    with pytest.raises(SessionKeyError, match='"k1"'):
        await only_new.load_stored("old")  # its first batches still need k1
    compacted = await rotated.load_stored("old")
    assert compacted is not None
    await rotated.compact(storage("old"), compacted.events, compacted.revision)  # re-sealed under k2
    assert (await only_new.load_stored("old")) is not None


def test_a_reader_that_does_not_know_the_seal_refuses_version_2(tmp_path: Path) -> None:
    from dsh.session_persistence_jsonl._format.records import parse_header_line

    line = b'{"type":"session","version":2,"id":"s1","createdAt":1,"isSeeded":false,"delegationDepth":0}'
    with pytest.raises(SessionFormatUnsupportedError, match="v2"):
        parse_header_line(line, "p")  # version 2 without a well-formed seal marker is a newer format
    bad_marker = line[:-1] + b',"sealed":{"aead":"ROT13","log":"00"}}'
    with pytest.raises(SessionFormatUnsupportedError):
        parse_header_line(bad_marker, "p")


def test_key_text_and_files_are_checked(tmp_path: Path) -> None:
    import base64

    good = base64.b64encode(KEY_OLD).decode()
    assert parse_keys(f"k2:{base64.b64encode(KEY_NEW).decode()}, k1:{good}", "env")[0] == "k2"
    for text in ("", "k1", f"k1:{good[:-4]}", f"k1:{good},k1:{good}", f"bad id:{good}", "k1:!!"):
        with pytest.raises(SessionKeyError):
            parse_keys(text, "env")
    key_file = tmp_path / "keys"
    key_file.write_text(f"# current first\nk1:{good}\n")
    key_file.chmod(0o644)
    with pytest.raises(SessionKeyError, match="group or others"):
        StaticKeyProvider.from_file(key_file)
    key_file.chmod(0o600)
    assert StaticKeyProvider.from_file(key_file).key("k1") == KEY_OLD
    assert "KEY" not in repr(StaticKeyProvider.from_file(key_file)) and good not in repr(
        StaticKeyProvider.from_file(key_file)
    )


class TestSealedConformance(TestJsonlConformance):
    """The whole backend conformance kit on a sealed backend."""

    @pytest.fixture
    def backend_factory(self, tmp_path: Path, compression: str) -> object:
        return lambda: sealed_backend(tmp_path / "root", compression=compression)

    @pytest.fixture
    def process_backend_factory(self, tmp_path: Path, compression: str) -> object:
        # JsonlBackend and StaticKeyProvider are importable by name in a spawned child: the partial pickles.
        return functools.partial(JsonlBackend, tmp_path / "root", compression=compression, encryption=provider())

    @pytest.fixture
    def other_backend_factory(self, tmp_path: Path, compression: str) -> object:
        return lambda: sealed_backend(tmp_path / "other-root", compression=compression)

    async def inject_torn_tail(self, backend: SessionBackend, session_id: str) -> None:
        assert isinstance(backend, JsonlBackend)
        (path,) = [p for p in Path(backend.root).rglob("session.jsonl*") if p.parent.name == session_id]  # noqa: ASYNC240
        compression = "zstd" if path.suffix == ".zstd" else "none"
        seq = len(
            walk_declared(BufferSource(path.read_bytes()), compression, str(path), 1 << 20, keys=provider()).events
        )
        seal = backend._core._seal_for(str(path))
        pair = encode_declared_batch(
            compression, seq, 1, b'{"type":"turn/end","seq":%d,"time":0,"data":{}}\n' % seq, seal
        )
        with path.open("ab") as fh:
            fh.write(pair[: len(pair) // 2])  # half of a real sealed batch: what an interrupted write leaves


@pytest.mark.slow
class TestSealedCrashStates(CrashStateConformance):
    @pytest.fixture(params=["zstd", "none"])
    def crash_backend(self, request: pytest.FixtureRequest) -> CrashBackend:
        return CrashBackend("_sealed:sealed_backend", kwargs={"compression": request.param}, sys_path=[HERE])
