"""On trio the backend refuses plainly: psycopg's async API does not run there."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from dsh.session_persistence.backend import StorageMetadata, UnsupportedOperationError
from dsh.session_persistence.testing import meta, one_turn_log
from dsh.session_persistence_postgres import PostgresBackend

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_every_primitive_refuses_trio(anyio_backend: str) -> None:
    # No server is needed: the refusal comes before any connection is attempted.
    backend = PostgresBackend("host=127.0.0.1 port=1 dbname=none")
    storage = StorageMetadata(meta("t"))
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: backend.load_stored("t"),
        lambda: backend.load_stored_from("t", 0),
        lambda: backend.read_stored_revision("t"),
        lambda: backend.list(),
        lambda: backend.list_snapshots(),
        lambda: backend.append_batch(storage, one_turn_log(), False),
        lambda: backend.commit_repair(storage, None, []),
        lambda: backend.materialize_header(storage),
        lambda: backend.rewrite(storage, []),
    ]
    for call in calls:
        with pytest.raises(UnsupportedOperationError, match="asyncio only: psycopg's async API does not support trio"):
            await call()
    await backend.aclose()
