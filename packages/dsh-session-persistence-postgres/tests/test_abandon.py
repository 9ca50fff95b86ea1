"""Abandoned calls: a write whose caller left never blocks the session's next one.

A caller cancelled while its write is still queued for a worker thread leaves a write that may never run at all
(anyio's asyncio backend drops a queued job whose caller left): the session's next write must not wait for it.
The hang is caught by a bound (``SAFETY_NET``) that a passing run never comes near: not a timing assertion.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from dsh.session_persistence.backend import StorageMetadata
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import PostgresBackend

SAFETY_NET = 60  # seconds: a hang fails the test instead of blocking the run; never reached when it passes
ROUNDS = 24


@pytest.fixture
def schema(fresh_schema: Callable[[], str]) -> str:
    return fresh_schema()


async def _stored(dsn: str, schema: str, session_id: str) -> list[object] | None:
    backend = PostgresBackend(dsn, schema=schema)
    try:
        stored = await backend.load_stored(session_id)
    finally:
        await backend.aclose()
    return None if stored is None else list(stored.events)


@pytest.mark.anyio
async def test_a_write_abandoned_at_any_checkpoint_never_blocks_the_next(postgres_dsn: str, schema: str) -> None:
    """Each round cancels an append after 0..7 checkpoints (often while it is still queued for a thread), then
    sends the same batch again: the retry is acknowledged (never left waiting for a write that never ran), and the
    log holds each batch once."""
    storage = StorageMetadata(meta("ab"))
    backend = PostgresBackend(postgres_dsn, schema=schema)
    expected = one_turn_log()
    try:
        await backend.append_batch(storage, expected, False)
        for round_no in range(ROUNDS):
            batch = simple_turn(len(expected), round_no + 2)
            with anyio.CancelScope() as scope:

                async def cancel_after(scope: anyio.CancelScope = scope, k: int = round_no % 8) -> None:
                    for _ in range(k):
                        await anyio.lowlevel.checkpoint()
                    scope.cancel()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(cancel_after)
                    await backend.append_batch(storage, batch, True)
            with anyio.fail_after(SAFETY_NET):
                await backend.append_batch(storage, batch, True)
            expected = expected + batch
    finally:
        await backend.aclose()
    assert await _stored(postgres_dsn, schema, "ab") == expected
