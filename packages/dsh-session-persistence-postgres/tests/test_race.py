"""Two real processes append to one session id at the same moment, against the real server.

Each round both writers get the go signal together and append a batch at the same seq (the first round
materializes the session). The database admits exactly one per round: the loser gets a typed error
(``SessionAlreadyExistsError`` for the first batch, ``SeqMismatchError`` after it), and the stored log is
contiguous with every batch wholly from one writer. One writer runs on asyncio, the other on trio.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

import anyio
import anyio.to_thread
import psycopg
import pytest
from dsh.session_persistence.backend import SeqMismatchError, StorageMetadata
from dsh.session_persistence.testing import meta, one_turn_log, simple_turn
from dsh.session_persistence_postgres import PostgresBackend

ROUNDS = 40 if os.environ.get("DSH_LONG") == "1" else 12
BATCH = 40

WRITER = textwrap.dedent(
    """
    import sys
    import anyio
    from dsh.session_persistence.backend import StorageMetadata
    from dsh.session_persistence.backend import SeqMismatchError, SessionAlreadyExistsError
    from dsh.session_persistence.events import OpaqueEvent
    from dsh.session_persistence.backend import SessionHeader
    from dsh.session_persistence_postgres import PostgresBackend

    dsn, schema, sid, tag, size, loop = sys.argv[1:7]
    size = int(size)
    storage = StorageMetadata(SessionHeader(id=sid, created_at=1, cwd="/race"))

    def batch(start):
        return [OpaqueEvent(type="plugin/who", seq=start + i, time=1, data={"tag": tag, "i": i}, ignorable=True)
                for i in range(size)]

    async def main():
        backend = PostgresBackend(dsn, schema=schema)
        await backend.list()  # warm up (pool open, schema checked) before the first signal
        print("ready", flush=True)
        while line := await anyio.to_thread.run_sync(sys.stdin.readline):
            round_no = int(line)
            try:
                await backend.append_batch(storage, batch(round_no * size), round_no > 0)
            except (SeqMismatchError, SessionAlreadyExistsError) as exc:
                print(f"lost {round_no} {type(exc).__name__}", flush=True)
            else:
                print(f"won {round_no}", flush=True)
        await backend.aclose()

    anyio.run(main, backend=loop)
    """
)


def test_two_processes_race_on_one_session(postgres_dsn: str) -> None:
    schema = f"race_{uuid.uuid4().hex[:12]}"
    procs = {
        tag: subprocess.Popen(
            [sys.executable, "-c", WRITER, postgres_dsn, schema, "race", tag, str(BATCH), loop],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag, loop in (("A", "asyncio"), ("B", "trio"))
    }
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdin is not None
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.stderr.read() if proc.stderr else ""
        winners: list[str] = []
        for round_no in range(ROUNDS):
            for proc in procs.values():
                assert proc.stdin is not None
                proc.stdin.write(f"{round_no}\n")
                proc.stdin.flush()
            answers = {}
            for tag, proc in procs.items():
                assert proc.stdout is not None
                answers[tag] = proc.stdout.readline().split()
            won = [tag for tag, words in answers.items() if words[:2] == ["won", str(round_no)]]
            assert len(won) == 1, f"round {round_no}: expected exactly one winner, got {answers}"
            (loser,) = set(answers) - set(won)
            expected_error = "SessionAlreadyExistsError" if round_no == 0 else "SeqMismatchError"
            assert answers[loser] == ["lost", str(round_no), expected_error], answers
            winners.append(won[0])
    finally:
        # communicate() closes stdin, which ends each writer's loop.
        results = {tag: proc.communicate(timeout=60) for tag, proc in procs.items()}
    for tag, proc in procs.items():
        assert proc.returncode == 0, results[tag]

    async def stored_log() -> list[tuple[int, str]]:
        backend = PostgresBackend(postgres_dsn, schema=schema)
        try:
            stored = await backend.load_stored("race")
        finally:
            await backend.aclose()
        assert stored is not None
        return [(e.seq, e.data["tag"]) for e in stored.events if isinstance(e.data, dict)]

    log = anyio.run(stored_log, backend="asyncio")
    assert [seq for seq, _tag in log] == list(range(ROUNDS * BATCH))  # contiguous, nothing duplicated
    for round_no, winner in enumerate(winners):
        batch_tags = {tag for _seq, tag in log[round_no * BATCH : (round_no + 1) * BATCH]}
        assert batch_tags == {winner}, f"round {round_no} mixes writers: {batch_tags}"


async def _waiting_on_a_lock(dsn: str, app: str) -> int:
    def count() -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                b"SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
                (app,),
            ).fetchone()
        return 0 if row is None else int(row[0])

    return await anyio.to_thread.run_sync(count)


@pytest.mark.anyio
async def test_a_writer_that_lost_the_race_is_told_the_truth(postgres_dsn: str) -> None:
    """Two writers send a batch at seq 6 while a third transaction holds the session row: both were in line when
    sent, one wins, and the loser's error says another writer stored seq 6 first (its statement's snapshot still
    shows next_seq 6, which once read as "expected 6 at index 0, got 6")."""
    schema = f"truth_{uuid.uuid4().hex[:10]}"
    app = f"dsh-race-{uuid.uuid4().hex[:8]}"
    writers = [
        PostgresBackend(postgres_dsn, schema=schema, connection_kwargs={"application_name": app}, lock_timeout=None)
        for _ in range(2)
    ]
    storage = StorageMetadata(meta("r"))
    holder = await anyio.to_thread.run_sync(psycopg.connect, postgres_dsn)
    outcomes: list[BaseException | None] = []
    try:
        await writers[0].append_batch(storage, one_turn_log(), False)
        await writers[1].list()
        await anyio.to_thread.run_sync(
            holder.execute, f"SELECT 1 FROM \"{schema}\".dsh_sessions WHERE id = 'r' FOR UPDATE".encode()
        )

        async def write(backend: PostgresBackend, turn: int) -> None:
            try:
                await backend.append_batch(storage, simple_turn(6, turn), True)
            except SeqMismatchError as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)

        async with anyio.create_task_group() as tg:
            tg.start_soon(write, writers[0], 2)
            tg.start_soon(write, writers[1], 3)
            with anyio.fail_after(60):  # a safety net for a hang, not a timing assertion
                while await _waiting_on_a_lock(postgres_dsn, app) < 2:  # noqa: ASYNC110 - polling the server's view
                    await anyio.sleep(0.02)
            await anyio.to_thread.run_sync(holder.rollback)
    finally:
        await anyio.to_thread.run_sync(holder.close)
        for backend in writers:
            await backend.aclose()
    lost = [exc for exc in outcomes if exc is not None]
    assert len(outcomes) == 2 and len(lost) == 1, outcomes
    message = str(lost[0])
    assert "another writer stored seq 6 first" in message, message
    assert "expected 6" not in message and "got 6" not in message, message
