"""The shared seal: a round trip, what it is bound to, and a typed error when the optional cipher is missing."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest
from dsh.session_persistence.encryption import (
    KEY_BYTES,
    NONCE_BYTES,
    TAG_BYTES,
    SessionKeyError,
    StaticKeyProvider,
    open_sealed,
    open_sealed_many,
    seal,
)

KEY = bytes(range(KEY_BYTES))


def test_a_seal_opens_only_with_its_key_nonce_and_associated_data() -> None:
    nonce, sealed = seal(KEY, b"secret text", b"place")
    assert len(nonce) == NONCE_BYTES and len(sealed) == len(b"secret text") + TAG_BYTES
    assert b"secret" not in sealed
    assert open_sealed(KEY, nonce, sealed, b"place") == b"secret text"
    assert open_sealed(KEY, nonce, sealed, b"other place") is None
    assert open_sealed(bytes(KEY_BYTES), nonce, sealed, b"place") is None
    assert open_sealed(KEY, bytes(NONCE_BYTES), sealed, b"place") is None
    assert open_sealed(KEY, nonce, sealed[:-1] + bytes([sealed[-1] ^ 1]), b"place") is None
    assert open_sealed(KEY, nonce[:4], sealed, b"place") is None  # a truncated nonce: refused, not a ValueError
    assert open_sealed(KEY, nonce, sealed[: TAG_BYTES - 1], b"place") is None
    assert seal(KEY, b"x", b"")[0] != seal(KEY, b"x", b"")[0]  # a fresh random nonce each time


def test_many_seals_open_in_one_pass_and_stop_at_the_first_that_fails() -> None:
    places = [b"place %d" % i for i in range(5)]
    seals = [(*seal(KEY, b"text %d" % i, places[i]), places[i]) for i in range(5)]
    assert open_sealed_many(KEY, seals) == [b"text %d" % i for i in range(5)]
    buffer = b"".join(nonce + sealed for nonce, sealed, _ in seals)  # views of one buffer open without a copy
    views, at = [], 0
    for nonce, sealed, place in seals:
        views.append(
            (
                memoryview(buffer)[at : at + NONCE_BYTES],
                memoryview(buffer)[at + NONCE_BYTES : at + len(nonce) + len(sealed)],
                place,
            )
        )
        at += len(nonce) + len(sealed)
    assert open_sealed_many(KEY, views) == [b"text %d" % i for i in range(5)]
    # each way a seal fails, at index 2: the result stops there, and matches open_sealed seal by seal
    nonce, sealed, place = seals[2]
    for bad in (
        (nonce, sealed, b"other place"),
        (bytes(NONCE_BYTES), sealed, place),
        (nonce, sealed[:-1] + bytes([sealed[-1] ^ 1]), place),
        (nonce[:4], sealed, place),
        (nonce, sealed[: TAG_BYTES - 1], place),
    ):
        assert open_sealed(KEY, *bad) is None
        assert open_sealed_many(KEY, [*seals[:2], bad, *seals[3:]]) == [b"text 0", b"text 1"]
    assert open_sealed_many(bytes(KEY_BYTES), seals) == []
    assert open_sealed_many(KEY, []) == []
    with pytest.raises(SessionKeyError, match="exactly 32 bytes"):
        open_sealed_many(KEY[:16], seals)


def test_a_key_of_the_wrong_size_is_refused_typed() -> None:
    with pytest.raises(SessionKeyError, match="exactly 32 bytes"):
        seal(KEY[:16], b"x", b"")


def test_the_jsonl_face_re_exports_the_same_classes() -> None:
    jsonl = pytest.importorskip("dsh.session_persistence_jsonl.encryption")
    assert jsonl.StaticKeyProvider is StaticKeyProvider
    assert jsonl.SessionKeyError is SessionKeyError


def test_without_the_cipher_package_sealing_is_a_typed_error_naming_the_extra_not_a_key_error() -> None:
    probe = (
        "import sys\n"
        "sys.modules['cryptography'] = None  # as if the [encryption] extra were not installed\n"
        "from dsh.session_persistence.encryption import (\n"
        "    EncryptionUnavailableError, SessionKeyError, check_cipher_available, seal,\n"
        ")\n"
        "for attempt in (check_cipher_available, lambda: seal(bytes(32), b'x', b'')):\n"
        "    try:\n"
        "        attempt()\n"
        "    except EncryptionUnavailableError as exc:\n"
        "        assert not isinstance(exc, SessionKeyError)  # no key would help\n"
        "        print('typed:', exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert all("pip install 'dsh-session-persistence[encryption]'" in line for line in lines)


def test_a_key_source_named_by_kind_reads_the_variable_or_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``from_source`` is what both backends' ``key_options`` hand on for ``--key-env`` / ``--key-file``."""
    text = "k2:" + base64.b64encode(KEY).decode() + ",k1:" + base64.b64encode(bytes(KEY_BYTES)).decode()
    monkeypatch.setenv("DSH_TEST_SOURCE_KEYS", text)
    from_env = StaticKeyProvider.from_source("env", "DSH_TEST_SOURCE_KEYS")
    assert (from_env.current_key_id(), from_env.key("k2"), from_env.key("k1")) == ("k2", KEY, bytes(KEY_BYTES))
    path = tmp_path / "keys"
    path.write_text(text)
    path.chmod(0o600)
    from_file = StaticKeyProvider.from_source("file", str(path))
    assert (from_file.current_key_id(), from_file.key("k2")) == ("k2", KEY)
    with pytest.raises(SessionKeyError, match="DSH_TEST_NOT_SET is not set"):
        StaticKeyProvider.from_source("env", "DSH_TEST_NOT_SET")
    with pytest.raises(SessionKeyError, match="cannot open key file"):
        StaticKeyProvider.from_source("file", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="unknown key source kind 'vault'"):
        StaticKeyProvider.from_source("vault", "x")
