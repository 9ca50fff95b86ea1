"""Keys for the sealed-backend tests: two fixed 32-byte keys and providers over them."""

from __future__ import annotations

import functools
from typing import Any

from dsh.session_persistence.encryption import StaticKeyProvider
from dsh.session_persistence_postgres import PostgresBackend

KEY_OLD = bytes(range(32))
KEY_NEW = bytes(range(100, 132))


def provider(current: str = "k2", *, old: bool = True, new: bool = True) -> StaticKeyProvider:
    """``k1`` (old) and ``k2`` (new), either left out on request; ``current`` seals."""
    keys = {**({"k1": KEY_OLD} if old else {}), **({"k2": KEY_NEW} if new else {})}
    return StaticKeyProvider(current, keys)


def sealed_backend(*args: Any, **kwargs: Any) -> PostgresBackend:
    """A ``PostgresBackend`` sealing under ``k2`` (``k1`` still held); picklable as a partial for child processes."""
    return PostgresBackend(*args, encryption=provider(), **kwargs)


def sealed_factory(*args: Any, **kwargs: Any) -> functools.partial[PostgresBackend]:
    return functools.partial(PostgresBackend, *args, encryption=provider(), **kwargs)
