"""Encrypted sessions, shared by every backend: the key-provider protocol, the stock providers and the AEAD seal.

A backend given ``encryption=provider`` (``JsonlBackend``, ``PostgresBackend``) seals what it stores with
AES-256-GCM through :func:`seal` and :func:`open_sealed`; each backend binds its own associated data (where the
sealed unit belongs). The cipher is the ``cryptography`` package, the ``[encryption]`` extra of this
distribution, imported only when a seal is made or opened: without it those raise
:class:`EncryptionUnavailableError` (naming the extra; not a key error: no key would help).
A provider names one *current* key (new data is sealed with it) and returns any key it still holds by id (old
data keeps loading while its key is provided). Keys are 32 random bytes; ids are 1-64 characters of
``[A-Za-z0-9._-]``.

* :class:`StaticKeyProvider` holds keys in memory; :meth:`StaticKeyProvider.from_env` reads ``DSH_SESSION_KEYS``
  and :meth:`StaticKeyProvider.from_file` a key file, both in the text format of :func:`parse_keys`;
* :class:`CallbackKeyProvider` asks a callback (a KMS client) and keeps each answer in memory.

A key that is not provided raises :class:`SessionKeyError`; data that fails authentication (wrong key, altered
or moved bytes) raises :class:`SessionDecryptError`. Backends name the session and the sealed unit in both.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from ._model.errors import EncryptionUnavailableError, SessionDecryptError, SessionKeyError

__all__ = [
    "AEAD_NAME",
    "KEYS_ENV",
    "KEY_BYTES",
    "NONCE_BYTES",
    "TAG_BYTES",
    "CallbackKeyProvider",
    "EncryptionUnavailableError",
    "KeyProvider",
    "SessionDecryptError",
    "SessionKeyError",
    "StaticKeyProvider",
    "check_cipher_available",
    "check_key",
    "check_key_id",
    "open_sealed",
    "open_sealed_many",
    "parse_keys",
    "seal",
    "sealed_opener",
]

#: Every key is exactly this many bytes (AES-256).
KEY_BYTES = 32
#: The environment variable :meth:`StaticKeyProvider.from_env` reads by default.
KEYS_ENV = "DSH_SESSION_KEYS"
#: The AEAD every seal uses, its nonce (random per seal) and its tag sizes in bytes.
AEAD_NAME = "AES-256-GCM"
NONCE_BYTES = 12
TAG_BYTES = 16
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


@runtime_checkable
class KeyProvider(Protocol):
    """Where a backend gets its keys. Called from worker threads: implementations must be thread-safe."""

    def current_key_id(self) -> str:
        """The id of the key new batches are sealed with (:class:`SessionKeyError` if there is none)."""
        ...

    def key(self, key_id: str) -> bytes | None:
        """The 32-byte key ``key_id``, or ``None`` if this provider does not hold it (any more)."""
        ...


def check_key_id(key_id: object) -> str:
    """``key_id`` if it is a valid key id, else :class:`SessionKeyError`."""
    if type(key_id) is not str or _KEY_ID.fullmatch(key_id) is None:
        raise SessionKeyError(f"invalid key id {key_id!r}: 1-64 characters of A-Z a-z 0-9 . _ -")
    return key_id


def check_key(key_id: str, key: object) -> bytes:
    """``key`` if it is exactly :data:`KEY_BYTES` bytes, else :class:`SessionKeyError` (the key is never shown)."""
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        size = len(key) if isinstance(key, bytes) else type(key).__name__
        raise SessionKeyError(f'key "{key_id}" must be exactly {KEY_BYTES} bytes, got {size}')
    return key


def parse_keys(text: str, source: str) -> tuple[str, dict[str, bytes]]:
    """Parse ``id:base64key`` entries (separated by commas or newlines; ``#`` starts a comment); the first is current.

    Returns the current id and every key. Any malformed entry raises :class:`SessionKeyError` naming ``source``
    and the entry's position, never the key bytes.
    """
    keys: dict[str, bytes] = {}
    current: str | None = None
    entries = [part.strip() for line in text.splitlines() for part in line.split("#", 1)[0].split(",")]
    for number, entry in enumerate((e for e in entries if e), 1):
        key_id, sep, encoded = entry.partition(":")
        if not sep:
            raise SessionKeyError(f"{source}: entry {number} is not id:base64key")
        try:
            key_id = check_key_id(key_id.strip())
        except SessionKeyError as exc:
            raise SessionKeyError(f"{source}: entry {number}: {exc}") from None
        try:
            key = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise SessionKeyError(f'{source}: key "{key_id}" is not valid base64') from exc
        if key_id in keys:
            raise SessionKeyError(f'{source}: key id "{key_id}" appears twice')
        try:
            keys[key_id] = check_key(key_id, key)
        except SessionKeyError as exc:  # a key of the wrong size: say where it came from (never its bytes)
            raise SessionKeyError(f"{source}: {exc}") from None
        current = key_id if current is None else current
    if current is None:
        raise SessionKeyError(f"{source}: no key (expected id:base64key entries, the first one current)")
    return current, keys


class StaticKeyProvider:
    """Keys held in memory: ``StaticKeyProvider("k2", {"k2": b"...", "k1": b"..."})`` seals with ``k2``."""

    def __init__(self, current: str, keys: Mapping[str, bytes]) -> None:
        self._keys = {check_key_id(k): check_key(k, v) for k, v in keys.items()}
        if check_key_id(current) not in self._keys:
            raise SessionKeyError(f'the current key "{current}" is not among the provided keys')
        self._current = current

    @classmethod
    def from_env(cls, variable: str = KEYS_ENV) -> StaticKeyProvider:
        """Keys from the environment variable ``variable`` (format of :func:`parse_keys`)."""
        text = os.environ.get(variable)
        if not text:
            raise SessionKeyError(f"environment variable {variable} is not set (expected id:base64key,...)")
        return cls(*parse_keys(text, f"environment variable {variable}"))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> StaticKeyProvider:
        """Keys from a file (format of :func:`parse_keys`) that only its owner may read or write."""
        name = os.fspath(path)
        try:
            fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            raise SessionKeyError(f'cannot open key file "{name}": {exc.strerror}') from exc
        with os.fdopen(fd, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise SessionKeyError(f'key file "{name}" is accessible by group or others (chmod 600 it)')
            raw = handle.read(1 << 20)
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError as exc:
            raise SessionKeyError(f'key file "{name}" is not ASCII text') from exc
        return cls(*parse_keys(text, f'key file "{name}"'))

    @classmethod
    def from_source(cls, kind: str, name: str) -> StaticKeyProvider:
        """Keys from the source a tool names: ``kind`` ``"env"`` (:meth:`from_env`: the variable ``name``) or
        ``"file"`` (:meth:`from_file`: the path ``name``); what a backend class's ``key_options`` hands on for
        ``dsh-sessions --key-env NAME`` / ``--key-file PATH``."""
        if kind == "env":
            return cls.from_env(name)
        if kind == "file":
            return cls.from_file(name)
        raise ValueError(f'unknown key source kind {kind!r} (expected "env" or "file")')

    def current_key_id(self) -> str:
        return self._current

    def key(self, key_id: str) -> bytes | None:
        return self._keys.get(key_id)

    def __repr__(self) -> str:
        return f"StaticKeyProvider(current={self._current!r}, ids={sorted(self._keys)!r})"  # never the key bytes


class CallbackKeyProvider:
    """Keys fetched by ``fetch(key_id)`` (a KMS unwrap; ``None`` when unknown), each kept in memory once fetched.

    ``current`` returns the id to seal with (it may change over time: rotation). ``fetch`` is called from worker
    threads, at most once per id that it answered.
    """

    def __init__(self, current: Callable[[], str], fetch: Callable[[str], bytes | None]) -> None:
        self._current = current
        self._fetch = fetch
        self._cache: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def current_key_id(self) -> str:
        return check_key_id(self._current())

    def key(self, key_id: str) -> bytes | None:
        with self._lock:
            known = self._cache.get(key_id)
        if known is not None:
            return known
        fetched = self._fetch(key_id)
        if fetched is None:
            return None
        key = check_key(key_id, fetched)
        with self._lock:
            self._cache[key_id] = key
        return key


@functools.lru_cache(maxsize=16)
def _aesgcm(key: bytes) -> Any:
    # Cached per key: building the cipher object (its key schedule) per sealed unit cost as much as the
    # sealing itself for small events. AESGCM objects are immutable, so threads share them safely.
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:  # the optional extra is not installed
        raise EncryptionUnavailableError(
            "encrypted sessions need the 'cryptography' package: pip install 'dsh-session-persistence[encryption]'"
        ) from exc
    return AESGCM(key)


def check_cipher_available() -> None:
    """Raise :class:`EncryptionUnavailableError` unless the optional ``cryptography`` dependency is importable."""
    _aesgcm(bytes(KEY_BYTES))


def seal(key: bytes, plaintext: bytes, associated_data: bytes) -> tuple[bytes, bytes]:
    """``(nonce, ciphertext + tag)`` of ``plaintext`` under ``key`` (AES-256-GCM), bound to ``associated_data``.

    The nonce is :data:`NONCE_BYTES` fresh random bytes per call: with 96 random bits a key may seal 2**32
    units before the chance of a repeated nonce reaches 2**-32 (NIST SP 800-38D, 8.3), and no counter has to
    survive crashes or be shared between processes.
    """
    nonce = os.urandom(NONCE_BYTES)
    return nonce, bytes(_aesgcm(check_key("current", key)).encrypt(nonce, plaintext, associated_data))


def open_sealed(key: bytes, nonce: bytes, sealed: bytes, associated_data: bytes) -> bytes | None:
    """The plaintext of one seal, or ``None`` if it fails authentication (wrong key, altered or moved bytes)."""
    return sealed_opener(key)(nonce, sealed, associated_data)


def sealed_opener(key: bytes) -> Callable[[bytes, bytes, bytes], bytes | None]:
    """:func:`open_sealed` with ``key`` bound: ``opener(nonce, sealed, associated_data)``, the same answer.

    For a reader that opens many seals under one key (a log's batches, a session's rows): the key is checked and
    its cipher looked up once, not per seal.
    """
    aead = _aesgcm(check_key("given", key))
    from cryptography.exceptions import InvalidTag  # present: _aesgcm imported the package

    def opener(nonce: bytes, sealed: bytes, associated_data: bytes) -> bytes | None:
        if len(nonce) != NONCE_BYTES or len(sealed) < TAG_BYTES:
            return None
        try:
            return bytes(aead.decrypt(nonce, sealed, associated_data))
        except InvalidTag:
            return None

    return opener


def open_sealed_many(key: bytes, seals: Iterable[tuple[bytes | memoryview, bytes | memoryview, bytes]]) -> list[bytes]:
    """The plaintexts of many seals under one ``key``, in order: :func:`open_sealed` of each
    ``(nonce, sealed, associated_data)`` in one pass (the key checked and its cipher looked up once, no call per
    seal). Stops at the first seal that fails authentication: the result is then shorter than ``seals``, and the
    seal at index ``len(result)`` is the one that failed. Any bytes-like ``nonce`` and ``sealed`` will do (slices of
    a read buffer open without a copy).
    """
    aead = _aesgcm(check_key("given", key))
    from cryptography.exceptions import InvalidTag  # present: _aesgcm imported the package

    decrypt = aead.decrypt
    out: list[bytes] = []
    append = out.append
    try:
        for nonce, sealed, associated_data in seals:
            if len(nonce) != NONCE_BYTES or len(sealed) < TAG_BYTES:
                break
            append(bytes(decrypt(nonce, sealed, associated_data)))
    except InvalidTag:
        pass
    return out
