"""Array parameters rendered as literal text: the server reads back exactly the values, whatever their characters."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import psycopg
import pytest
from dsh.session_persistence.backend import StorageMetadata
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import PostgresBackend
from dsh.session_persistence_postgres._arrays import bigint_array, bool_array, bytea_array, text_array

#: Text the array parser treats specially outside double quotes (or inside them: ``\`` and ``"``).
AWKWARD_TEXT = [
    "a",
    "",
    "NULL",
    "null",
    " padded ",
    'a "quoted" word',
    "back\\slash",
    "\\",
    '"',
    '\\"',
    "{}",
    "{a,b}",
    "a,b",
    "ünïcødé €",
    "'",
    "''",
    "\\x41",
    "\t\n\r",
    None,
]
AWKWARD_BYTES = [b"", bytes(range(256)), None, b"\\", b"'", b'"', b"\\x41", b"{,}"]


def _round_trip(dsn: str, cast: str, literal: str) -> list[object]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = psycopg.ClientCursor(conn).execute(f"SELECT %s::{cast}", [literal]).fetchone()
    assert row is not None
    return [bytes(value) if isinstance(value, memoryview) else value for value in row[0]]


def test_text_elements_come_back_exactly(postgres_dsn: str) -> None:
    assert _round_trip(postgres_dsn, "text[]", text_array(AWKWARD_TEXT)) == AWKWARD_TEXT
    assert _round_trip(postgres_dsn, "text[]", text_array([])) == []


def test_bytea_elements_come_back_exactly(postgres_dsn: str) -> None:
    assert _round_trip(postgres_dsn, "bytea[]", bytea_array(AWKWARD_BYTES)) == AWKWARD_BYTES
    assert _round_trip(postgres_dsn, "bytea[]", bytea_array([])) == []


def test_bigint_and_boolean_elements_come_back_exactly(postgres_dsn: str) -> None:
    ints = [0, -1, 2**63 - 1, -(2**63), 7]
    assert _round_trip(postgres_dsn, "bigint[]", bigint_array(ints)) == ints
    assert _round_trip(postgres_dsn, "boolean[]", bool_array([True, False, True])) == [True, False, True]


@pytest.mark.anyio
async def test_sessions_with_awkward_ids_append_alone_and_in_a_group(
    postgres_dsn: str, fresh_schema: Callable[[], str]
) -> None:
    """The ids travel in text arrays (the group statement): each session gets its own rows, none another's."""
    ids = [text for text in AWKWARD_TEXT if text] + ["plain"]
    backend = PostgresBackend(postgres_dsn, schema=fresh_schema())
    try:
        for session_id in ids:
            await backend.append_batch(StorageMetadata(meta(session_id)), one_turn_log(), False)

        async def append(index: int, session_id: str) -> None:
            storage = StorageMetadata(meta(session_id))
            await backend.append_batch(storage, simple_turn(6, 2, f"text {index} \\ \" ' {{,}}"), True)
            await backend.append_batch(storage, simple_turn(9, 3, session_id), True)

        async with anyio.create_task_group() as tg:
            for index, session_id in enumerate(ids):
                tg.start_soon(append, index, session_id)
        for index, session_id in enumerate(ids):
            stored = await backend.load_stored(session_id)
            assert stored is not None
            assert stored.meta.id == session_id
            want = [*one_turn_log(), *simple_turn(6, 2, f"text {index} \\ \" ' {{,}}"), *simple_turn(9, 3, session_id)]
            assert list(stored.events) == want
    finally:
        await backend.aclose()
