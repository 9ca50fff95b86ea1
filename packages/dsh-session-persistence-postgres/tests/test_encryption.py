"""Sealed sessions on a real server: no plaintext at rest (rows and data files), typed errors for a missing or
wrong key and for altered or moved rows, rotation, listing without the key, the schema version, the CLI."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import psycopg
import pytest
from dsh.session_persistence.backend import (
    SeqMismatchError,
    SessionPersistenceCorruptionError,
    StorageMetadata,
)
from dsh.session_persistence.encryption import SessionDecryptError, SessionKeyError, StaticKeyProvider
from dsh.session_persistence.events import OpaqueEvent, SessionEvent
from dsh.session_persistence.testing import meta
from dsh.session_persistence_postgres import SCHEMA_VERSION, SEALED_SCHEMA_VERSION, PostgresBackend

from ._pgserver import PgCluster
from ._sealed import KEY_NEW, KEY_OLD, provider

pytestmark = pytest.mark.anyio


@pytest.fixture
def schema(fresh_schema: Callable[[], str]) -> str:
    return fresh_schema()


@pytest.fixture
def marker() -> str:
    # Unique per test: the data directory is shared by every test of the run.
    return f"MARKER-{uuid.uuid4().hex}-Ada-Lovelace-42-Elm-Street"


def _blob(seq: int, value: str) -> SessionEvent:
    return OpaqueEvent(type="plugin/blob", seq=seq, time=7, data={"v": value}, ignorable=True)


def _events(marker: str, start: int = 0) -> list[SessionEvent]:
    """A small event (stored as JSON), a large one (stored compressed) and another small one, all with ``marker``."""
    return [_blob(start, f"my address is {marker}"), _blob(start + 1, marker * 300), _blob(start + 2, marker)]


def _sql(dsn: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query.encode(), params)
        return cur.fetchall() if cur.description is not None else []


async def _write(
    dsn: str, schema: str, session_id: str, events: list[SessionEvent], keys: StaticKeyProvider | None
) -> None:
    # These tests mix plaintext and sealed sessions in one store on purpose (test_sealed_store.py: the refusal).
    backend = PostgresBackend(dsn, schema=schema, encryption=keys, allow_plaintext=keys is None)
    try:
        await backend.append_batch(StorageMetadata(meta(session_id)), events[:1], False)
        await backend.append_batch(StorageMetadata(meta(session_id)), events[1:], True)
    finally:
        await backend.aclose()


async def _load(dsn: str, schema: str, session_id: str, keys: StaticKeyProvider | None) -> list[SessionEvent]:
    backend = PostgresBackend(dsn, schema=schema, encryption=keys)
    try:
        stored = await backend.load_stored(session_id)
    finally:
        await backend.aclose()
    assert stored is not None
    return list(stored.events)


def _rows(dsn: str, schema: str, session_id: str) -> list[tuple[Any, ...]]:
    return _sql(
        dsn,
        f'SELECT seq, compressed, body, key_id, nonce FROM "{schema}".dsh_events WHERE session_id = %s ORDER BY seq',
        (session_id,),
    )


def _data_files(data: Path) -> Iterator[bytes]:
    for path in data.rglob("*"):
        if path.is_file():
            try:
                yield path.read_bytes()
            except OSError:  # a file the server removed meanwhile
                continue


async def test_no_plaintext_of_a_marker_in_the_rows_or_the_data_files(
    pg_cluster: PgCluster, schema: str, marker: str
) -> None:
    dsn = pg_cluster.dsn
    await _write(dsn, schema, "sealed", _events(marker), provider())
    plain_marker = marker.replace("MARKER", "PLAIN")
    await _write(dsn, schema, "plain", [_blob(0, plain_marker), _blob(1, plain_marker)], None)
    rows = _rows(dsn, schema, "sealed")
    assert [(seq, compressed, key_id) for seq, compressed, _b, key_id, _n in rows] == [
        (0, False, "k2"),
        (1, True, "k2"),
        (2, False, "k2"),
    ]
    needle = marker.encode()
    every_row = _sql(dsn, f'SELECT t::text FROM "{schema}".dsh_events t') + _sql(
        dsn, f'SELECT t::text FROM "{schema}".dsh_sessions t'
    )
    assert all(needle not in bytes(body) for _s, _c, body, _k, _n in rows)
    assert all(marker not in text for (text,) in every_row)
    # And on disk, after a checkpoint wrote the pages out (the WAL has them already).
    _sql(dsn, "CHECKPOINT")
    blobs = list(_data_files(pg_cluster.data))
    assert not [b for b in blobs if needle in b]
    # The search can find what is there: the plaintext session's marker is on disk.
    assert [b for b in blobs if plain_marker.encode() in b]
    assert await _load(dsn, schema, "sealed", provider()) == _events(marker)


async def test_listing_works_without_the_key_and_loading_needs_it(postgres_dsn: str, schema: str, marker: str) -> None:
    await _write(postgres_dsn, schema, "s1", _events(marker), provider())
    keyless = PostgresBackend(postgres_dsn, schema=schema)
    try:
        assert [h.id for h in await keyless.list()] == ["s1"]
        assert [s.header.id for s in await keyless.list_snapshots()] == ["s1"]
        assert await keyless.read_stored_revision("s1") is not None
        with pytest.raises(SessionKeyError, match=r'session "s1": the event at seq 0 is sealed with key "k2"'):
            await keyless.load_stored("s1")
        with pytest.raises(SessionKeyError, match="no key provider"):  # never a plaintext row in a sealed session
            await keyless.append_batch(StorageMetadata(meta("s1")), [_blob(3, "x")], True)
        await keyless.delete("s1")  # lifecycle needs no key
        assert await keyless.list() == []
    finally:
        await keyless.aclose()


async def test_a_key_the_provider_does_not_hold_and_a_wrong_key_fail_typed(
    postgres_dsn: str, schema: str, marker: str
) -> None:
    await _write(postgres_dsn, schema, "s1", _events(marker), provider())
    with pytest.raises(SessionKeyError, match=r'"s1": the event at seq 0 is sealed with key "k2", which the key'):
        await _load(postgres_dsn, schema, "s1", provider("k1", new=False))
    wrong = StaticKeyProvider("k2", {"k2": KEY_OLD})
    with pytest.raises(SessionDecryptError, match=r'session "s1": the event at seq 0 fails authentication'):
        await _load(postgres_dsn, schema, "s1", wrong)


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


@pytest.mark.parametrize("where", ["body-start", "tag", "nonce", "flag", "key-id-of-a-held-key"])
async def test_an_altered_row_fails_authentication(postgres_dsn: str, schema: str, marker: str, where: str) -> None:
    await _write(postgres_dsn, schema, "s1", _events(marker), provider())
    table = f'"{schema}".dsh_events'
    (seq, _c, body, _k, nonce) = _rows(postgres_dsn, schema, "s1")[1]
    body, nonce = bytes(body), bytes(nonce)
    if where == "body-start":
        _sql(postgres_dsn, f"UPDATE {table} SET body = %s WHERE session_id = 's1' AND seq = %s", (_flip(body, 0), seq))
    elif where == "tag":
        _sql(postgres_dsn, f"UPDATE {table} SET body = %s WHERE session_id = 's1' AND seq = %s", (_flip(body, -1), seq))
    elif where == "nonce":
        _sql(
            postgres_dsn, f"UPDATE {table} SET nonce = %s WHERE session_id = 's1' AND seq = %s", (_flip(nonce, 5), seq)
        )
    elif where == "flag":
        _sql(
            postgres_dsn, f"UPDATE {table} SET compressed = NOT compressed WHERE session_id = 's1' AND seq = %s", (seq,)
        )
    else:
        _sql(postgres_dsn, f"UPDATE {table} SET key_id = 'k1' WHERE session_id = 's1' AND seq = %s", (seq,))
    with pytest.raises(SessionDecryptError, match=r'session "s1": the event at seq 1 fails authentication'):
        await _load(postgres_dsn, schema, "s1", provider())


async def test_a_plaintext_row_planted_in_a_sealed_session_is_refused(
    postgres_dsn: str, schema: str, marker: str
) -> None:
    await _write(postgres_dsn, schema, "s1", _events(marker), provider())
    await _write(postgres_dsn, schema, "p1", _events(marker), None)
    table = f'"{schema}".dsh_events'
    _sql(
        postgres_dsn,
        f"UPDATE {table} t SET body = p.body, compressed = p.compressed, key_id = NULL, nonce = NULL FROM {table} p"
        " WHERE t.session_id = 's1' AND t.seq = 2 AND p.session_id = 'p1' AND p.seq = 2",
    )
    with pytest.raises(SessionDecryptError, match=r'"s1": the event at seq 2 is not sealed, but the session is'):
        await _load(postgres_dsn, schema, "s1", provider())
    # And the other way round: a sealed row in a plaintext session is damage, never decoded.
    await _write(postgres_dsn, schema, "s2", _events(marker), provider())
    _sql(
        postgres_dsn,
        f"UPDATE {table} t SET body = s.body, key_id = s.key_id, nonce = s.nonce FROM {table} s"
        " WHERE t.session_id = 'p1' AND t.seq = 0 AND s.session_id = 's2' AND s.seq = 0",
    )
    with pytest.raises(SessionPersistenceCorruptionError, match=r'"p1": the event at seq 0 is sealed, but the session'):
        await _load(postgres_dsn, schema, "p1", provider())


def _copy_row(dsn: str, table: str, source: tuple[str, int], target: tuple[str, int]) -> None:
    _sql(
        dsn,
        f"UPDATE {table} t SET body = s.body, compressed = s.compressed, key_id = s.key_id, nonce = s.nonce"
        f" FROM {table} s WHERE t.session_id = %s AND t.seq = %s AND s.session_id = %s AND s.seq = %s",
        (*target, *source),
    )


def _transplant(dsn: str, source: tuple[str, str], target: tuple[str, str]) -> None:
    """Every row of session ``source`` (schema, id) over the rows of ``target``, with its plaintext seal id too."""
    (src_schema, src_id), (dst_schema, dst_id) = source, target
    _sql(
        dsn,
        f'UPDATE "{dst_schema}".dsh_sessions t SET seal_id = s.seal_id FROM "{src_schema}".dsh_sessions s'
        " WHERE t.id = %s AND s.id = %s",
        (dst_id, src_id),
    )
    for seq in range(3):
        _sql(
            dsn,
            f'UPDATE "{dst_schema}".dsh_events t SET body = s.body, compressed = s.compressed, key_id = s.key_id,'
            f' nonce = s.nonce FROM "{src_schema}".dsh_events s'
            " WHERE t.session_id = %s AND t.seq = %s AND s.session_id = %s AND s.seq = %s",
            (dst_id, seq, src_id, seq),
        )


async def test_a_row_copied_to_another_session_seq_or_store_fails_authentication(
    postgres_dsn: str, fresh_schema: Callable[[], str], marker: str
) -> None:
    schema, other = fresh_schema(), fresh_schema()
    same = [_blob(0, marker), _blob(1, marker), _blob(2, marker)]  # same plaintext everywhere: only the place differs
    for sid in ("a", "b", "c", "d"):
        await _write(postgres_dsn, schema, sid, same, provider())
    await _write(postgres_dsn, other, "a", same, provider())
    table = f'"{schema}".dsh_events'
    _copy_row(postgres_dsn, table, ("a", 0), ("b", 0))  # another session, same seq
    with pytest.raises(SessionDecryptError, match=r'session "b": the event at seq 0 fails authentication'):
        await _load(postgres_dsn, schema, "b", provider())
    _copy_row(postgres_dsn, table, ("c", 0), ("c", 1))  # another seq of the same session
    with pytest.raises(SessionDecryptError, match=r'session "c": the event at seq 1 fails authentication'):
        await _load(postgres_dsn, schema, "c", provider())
    # A whole session moved, its (plaintext) seal id with it: to another id, and to the same id in another store.
    _transplant(postgres_dsn, (schema, "a"), (schema, "d"))
    with pytest.raises(SessionDecryptError, match=r'session "d": the event at seq 0 fails authentication'):
        await _load(postgres_dsn, schema, "d", provider())
    _transplant(postgres_dsn, (schema, "a"), (other, "a"))
    with pytest.raises(SessionDecryptError, match=r'session "a": the event at seq 0 fails authentication'):
        await _load(postgres_dsn, other, "a", provider())
    assert await _load(postgres_dsn, schema, "a", provider()) == same  # the source is untouched


async def test_a_row_of_an_earlier_incarnation_of_the_same_id_fails_authentication(
    postgres_dsn: str, schema: str, marker: str
) -> None:
    same = [_blob(0, marker), _blob(1, marker)]
    await _write(postgres_dsn, schema, "s1", same, provider())
    saved = _rows(postgres_dsn, schema, "s1")
    backend = PostgresBackend(postgres_dsn, schema=schema, encryption=provider())
    try:
        await backend.delete("s1")
    finally:
        await backend.aclose()
    await _write(postgres_dsn, schema, "s1", same, provider())  # same id, same header, same events
    _seq, _c, body, _k, nonce = saved[1]
    _sql(
        postgres_dsn,
        f"UPDATE \"{schema}\".dsh_events SET body = %s, nonce = %s WHERE session_id = 's1' AND seq = 1",
        (bytes(body), bytes(nonce)),
    )
    with pytest.raises(SessionDecryptError, match=r'session "s1": the event at seq 1 fails authentication'):
        await _load(postgres_dsn, schema, "s1", provider())


async def test_a_writer_that_missed_a_re_creation_is_refused_not_sealed_for_the_old_incarnation(
    postgres_dsn: str, schema: str, marker: str
) -> None:
    stale = PostgresBackend(postgres_dsn, schema=schema, encryption=provider())
    other = PostgresBackend(postgres_dsn, schema=schema, encryption=provider())
    storage = StorageMetadata(meta("s1"))
    try:
        await stale.append_batch(storage, [_blob(0, marker)], False)  # ``stale`` knows this incarnation
        await other.delete("s1")
        await other.append_batch(storage, [_blob(0, "again")], False)  # same id, same next seq
        with pytest.raises(SeqMismatchError, match="deleted and created again"):
            await stale.append_batch(storage, [_blob(1, marker)], True)
        assert await _load(postgres_dsn, schema, "s1", provider()) == [_blob(0, "again")]
        # Having been told, it reads the new incarnation and goes on.
        stored = await stale.load_stored("s1")
        assert stored is not None and list(stored.events) == [_blob(0, "again")]
        await stale.append_batch(storage, [_blob(1, marker)], True)
    finally:
        await stale.aclose()
        await other.aclose()
    assert await _load(postgres_dsn, schema, "s1", provider()) == [_blob(0, "again"), _blob(1, marker)]


async def test_rotation_keeps_old_sessions_loading_and_compaction_reseals(
    postgres_dsn: str, schema: str, marker: str
) -> None:
    events = _events(marker)
    await _write(postgres_dsn, schema, "old", events, provider("k1", new=False))
    rotated = PostgresBackend(postgres_dsn, schema=schema, encryption=provider("k2"))
    storage = StorageMetadata(meta("old"))
    try:
        stored = await rotated.load_stored("old")
        assert stored is not None and list(stored.events) == events
        await rotated.append_batch(storage, [_blob(3, marker)], True)  # new rows: the current key
        assert [k for _s, _c, _b, k, _n in _rows(postgres_dsn, schema, "old")] == ["k1", "k1", "k1", "k2"]
        with pytest.raises(SessionKeyError, match=r'seq 0 is sealed with key "k1"'):
            await _load(postgres_dsn, schema, "old", provider("k2", old=False))
        stored = await rotated.load_stored("old")
        assert stored is not None
        await rotated.compact(storage, list(stored.events), stored.revision)  # what re-encrypt does
    finally:
        await rotated.aclose()
    assert {k for _s, _c, _b, k, _n in _rows(postgres_dsn, schema, "old")} == {"k2"}
    assert await _load(postgres_dsn, schema, "old", provider("k2", old=False)) == [*events, _blob(3, marker)]


async def test_a_plaintext_session_stays_plaintext_until_compacted_by_a_backend_with_keys(
    postgres_dsn: str, schema: str, marker: str
) -> None:
    events = _events(marker)
    await _write(postgres_dsn, schema, "p", events, None)
    backend = PostgresBackend(postgres_dsn, schema=schema, encryption=provider())
    storage = StorageMetadata(meta("p"))
    try:
        stored = await backend.load_stored("p")
        assert stored is not None
        await backend.append_batch(storage, [_blob(3, "more")], True)  # never mixed: the new row is plaintext
        assert [k for _s, _c, _b, k, _n in _rows(postgres_dsn, schema, "p")] == [None] * 4
        stored = await backend.load_stored("p")
        assert stored is not None
        await backend.compact(storage, list(stored.events), stored.revision)
    finally:
        await backend.aclose()
    assert [k for _s, _c, _b, k, _n in _rows(postgres_dsn, schema, "p")] == ["k2"] * 4
    assert all(marker.encode() not in bytes(b) for _s, _c, b, _k, _n in _rows(postgres_dsn, schema, "p"))
    with pytest.raises(SessionKeyError):
        await _load(postgres_dsn, schema, "p", None)
    assert await _load(postgres_dsn, schema, "p", provider()) == [*events, _blob(3, "more")]


async def test_the_schema_version_marks_a_store_that_may_hold_sealed_rows(postgres_dsn: str, schema: str) -> None:
    version = f'SELECT version FROM "{schema}".dsh_schema'
    await _write(postgres_dsn, schema, "p", [_blob(0, "a"), _blob(1, "b")], None)
    assert _sql(postgres_dsn, version) == [(SCHEMA_VERSION,)]  # plaintext only: a 0.2 reader still opens it
    await _write(postgres_dsn, schema, "s", [_blob(0, "a"), _blob(1, "b")], provider())
    assert _sql(postgres_dsn, version) == [(SEALED_SCHEMA_VERSION,)]
    # A backend without keys of this build still reads the plaintext sessions of a v2 store.
    assert await _load(postgres_dsn, schema, "p", None) == [_blob(0, "a"), _blob(1, "b")]


def _released_02_package(tmp: Path) -> Path:
    """The 0.2.0 release's backend package, from the commit tools/releases.toml records, as package ``pg02``."""
    repo = Path(__file__).resolve().parents[3]
    commit = "01f5c4d0cb322a86f78c8d90109d2e25a5ad5b2a"
    prefix = "packages/dsh-session-persistence-postgres/src/dsh/session_persistence_postgres"
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "--name-only", commit, prefix + "/"],
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode != 0:
        pytest.fail(f"the 0.2.0 release commit is not in this clone: {listed.stderr}")
    package = tmp / "pg02"
    package.mkdir()
    for name in listed.stdout.split():
        if name.endswith(".py"):
            shown = subprocess.run(
                ["git", "-C", str(repo), "show", f"{commit}:{name}"], capture_output=True, check=True
            )
            (package / Path(name).name).write_bytes(shown.stdout)
    return tmp


def test_a_02_reader_refuses_a_sealed_store_and_opens_a_plaintext_one(
    postgres_dsn: str, fresh_schema: Callable[[], str], tmp_path: Path
) -> None:
    """The released 0.2 schema check, run in a child process against a store this build sealed."""

    sealed, plain = fresh_schema(), fresh_schema()
    anyio.run(_write, postgres_dsn, sealed, "s", [_blob(0, "a"), _blob(1, "b")], provider())
    anyio.run(_write, postgres_dsn, plain, "p", [_blob(0, "a"), _blob(1, "b")], None)
    path = _released_02_package(tmp_path)
    probe = (
        "import sys, psycopg\n"
        "from pg02._schema import Tables, ensure_schema, SCHEMA_VERSION\n"
        "from pg02._errors import SchemaVersionError\n"
        "assert SCHEMA_VERSION == 1\n"
        "for schema in sys.argv[2:]:\n"
        "    with psycopg.connect(sys.argv[1], autocommit=True) as conn:\n"
        "        try:\n"
        "            ensure_schema(conn, Tables(schema))\n"
        "            print(schema, 'opened')\n"
        "        except SchemaVersionError as exc:\n"
        "            print(schema, 'refused', exc.version, exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(path)}
    done = subprocess.run(
        [sys.executable, "-c", probe, postgres_dsn, sealed, plain], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"{sealed} refused 2 ") and "upgrade it" in lines[0]
    assert lines[1] == f"{plain} opened"


def test_key_options_and_the_cli_against_a_postgres_url(
    postgres_dsn: str, schema: str, marker: str, monkeypatch: pytest.MonkeyPatch
) -> None:

    anyio.run(_write, postgres_dsn, schema, "s1", _events(marker), provider("k1"))  # sealed under the old key
    text = ",".join(f"{kid}:{base64.b64encode(key).decode()}" for kid, key in (("k2", KEY_NEW), ("k1", KEY_OLD)))
    monkeypatch.setenv("PG_TEST_KEYS", text)
    options = PostgresBackend.key_options("env", "PG_TEST_KEYS")
    assert isinstance(options["encryption"], StaticKeyProvider)
    with pytest.raises(SessionKeyError, match="NOT_SET_ANYWHERE is not set"):
        PostgresBackend.key_options("env", "NOT_SET_ANYWHERE")
    base = ["--backend", "postgres", "-o", f"conninfo={postgres_dsn}", "-o", f"schema={schema}"]

    def cli(*argv: str) -> tuple[int, str, str]:
        done = subprocess.run(
            [sys.executable, "-m", "dsh.session_persistence", *base, *argv],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        return done.returncode, done.stdout, done.stderr

    code, out, _err = cli("list")
    assert code == 0 and "s1" in out  # listing needs no key
    code, _out, err = cli("show", "s1")
    assert code == 7, err  # no key: exit 7, never "corrupt"
    code, out, err = cli("--key-env", "PG_TEST_KEYS", "export", "s1")
    assert code == 0, err
    assert marker in out
    code, _out, err = cli("--key-env", "PG_TEST_KEYS", "re-encrypt", "s1")
    assert code == 0, err
    assert {k for _s, _c, _b, k, _n in _rows(postgres_dsn, schema, "s1")} == {"k2"}  # re-sealed under the current key


async def test_a_write_retried_after_an_unknown_outcome_is_recognized_sealed(
    postgres_dsn: str, schema: str, marker: str
) -> None:
    """The read-back before a retry (``after_unknown``): the retry seals again (new nonces; for a first batch a new
    seal id), so the stored rows are compared by what they open to, never by their ciphertext."""
    backend = PostgresBackend(postgres_dsn, schema=schema, encryption=provider())
    storage = StorageMetadata(meta("s1"))
    store, codec = backend._store, backend._codec
    first = [codec.encode(e) for e in _events(marker)]
    later = [codec.encode(e) for e in _events(marker, 3)]
    try:
        await anyio.to_thread.run_sync(lambda: store.append(storage, first, 0, True))
        await anyio.to_thread.run_sync(lambda: store.append(storage, first, 0, True, after_unknown=True))
        await anyio.to_thread.run_sync(lambda: store.append(storage, later, 3, False))
        before = _rows(postgres_dsn, schema, "s1")
        await anyio.to_thread.run_sync(lambda: store.append(storage, later, 3, False, after_unknown=True))
        assert _rows(postgres_dsn, schema, "s1") == before  # found stored: nothing sent again
    finally:
        await backend.aclose()
    assert await _load(postgres_dsn, schema, "s1", provider()) == _events(marker) + _events(marker, 3)


def test_without_the_cipher_package_an_encrypting_backend_is_refused_at_construction() -> None:
    probe = (
        "import sys\n"
        "sys.modules['cryptography'] = None  # as if the [encryption] extra were not installed\n"
        "from dsh.session_persistence import SessionPersistenceError\n"
        "from dsh.session_persistence.encryption import StaticKeyProvider\n"
        "from dsh.session_persistence_postgres import PostgresBackend\n"
        "try:\n"
        "    PostgresBackend('host=127.0.0.1', encryption=StaticKeyProvider('k', {'k': bytes(32)}))\n"
        "except SessionPersistenceError as exc:  # EncryptionUnavailableError since core 0.4 (SessionKeyError before)\n"
        "    print('typed:', exc)\n"
        "PostgresBackend('host=127.0.0.1')  # without keys it needs no cipher\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("typed: ") and "[encryption]" in done.stdout
