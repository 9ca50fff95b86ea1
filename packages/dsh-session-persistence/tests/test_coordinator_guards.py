"""Each guard of the coordinator's identity checks, writer lease and in-doubt read-back has a test here that
fails when the guard is removed (the mutation table in the issue notes names them).

Storage is a real :class:`MemoryBackend` store; failures are injected by subclasses that do, inside the
primitive, what a failing storage does (write then raise, write part then raise), never by mocking the
coordinator.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
from dsh.session_persistence._backends.memory import MemoryBackend, MemoryStore
from dsh.session_persistence._backends.protocol import StorageMetadata
from dsh.session_persistence._coordinator.service import PersistenceCoordinator
from dsh.session_persistence._host.host import Host
from dsh.session_persistence._host.session import SessionStore
from dsh.session_persistence._model.errors import (
    SeqMismatchError,
    SessionDisposeError,
    SessionIdCollisionError,
    SessionLockedError,
    SessionPersistenceCorruptionError,
    SessionStorageError,
)
from dsh.session_persistence._model.events import SessionEvent
from dsh.session_persistence._wire.codec import encode_event
from dsh.session_persistence.testing._logs import WORK, meta, one_turn_log, simple_turn, turn_start

pytestmark = pytest.mark.anyio


class NoSeek(MemoryBackend):
    """A backend without the optional seek read (``read_from`` then reads the whole log)."""

    load_stored_from = None  # type: ignore[assignment]


class Lax(MemoryBackend):
    """A backend that appends whatever it is given, at any seq (no contiguity check of its own)."""

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        if not is_materialized:
            await super().append_batch(storage, events, is_materialized)
            return
        self.store.append_raw(storage.meta.id, list(events))


class Misbehaving(MemoryBackend):
    """``append_batch`` runs ``self.effect`` (what a failing storage left behind) instead of writing, then raises
    ``OSError`` as a failed fsync or a failed rollback would. One shot: later calls write normally."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.effect: Any = None

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        effect, self.effect = self.effect, None
        if effect is None:
            await super().append_batch(storage, events, is_materialized)
            return
        await effect(storage, list(events), is_materialized)
        raise OSError(5, "Input/output error")


def coordinator(backend: MemoryBackend) -> tuple[PersistenceCoordinator, SessionStore]:
    host = Host()
    store = SessionStore(host)
    return PersistenceCoordinator(host, backend), store


@asynccontextmanager
async def close_reports_a_failure(persistence: PersistenceCoordinator) -> AsyncIterator[None]:
    """Run the body in the started coordinator; its close must then report the refused session's buffered events
    (a ``SessionDisposeError``, never an ``ExceptionGroup``). A failure of the body itself wins and is raised
    unchanged."""
    await persistence.__aenter__()
    try:
        yield
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            await persistence.__aexit__(type(exc), exc, exc.__traceback__)
        raise
    with pytest.raises(SessionDisposeError):
        await persistence.__aexit__(None, None, None)


# ------------------------------------------------------------------------------------------------------------------
# Identity of the stored header, for every reader


@pytest.mark.parametrize("backend_class", [MemoryBackend, NoSeek], ids=["seek", "whole-log"])
async def test_read_from_refuses_a_header_naming_another_session(backend_class: type[MemoryBackend]) -> None:
    backend = backend_class()
    backend.store.put("requested", meta("different", WORK), one_turn_log())
    persistence, _ = coordinator(backend)
    async with persistence:
        with pytest.raises(SessionPersistenceCorruptionError, match="stored session identity mismatch"):
            await persistence.read_from("requested", 0)
        with pytest.raises(SessionPersistenceCorruptionError, match="stored session identity mismatch"):
            await persistence.read_from("requested", 3)


async def test_read_from_seek_suffix_must_start_at_the_requested_seq() -> None:
    class Shifted(MemoryBackend):
        async def load_stored_from(self, session_id: str, from_seq: int) -> Any:
            return await super().load_stored_from(session_id, from_seq + 1)

    backend = Shifted()
    backend.store.put("s", meta("s", WORK), one_turn_log())
    persistence, _ = coordinator(backend)
    async with persistence:
        with pytest.raises(SessionPersistenceCorruptionError, match="stored event at index 2 has seq 3"):
            await persistence.read_from("s", 2)


async def test_live_adoption_refuses_a_header_naming_another_session() -> None:
    backend = MemoryBackend()
    backend.store.put("requested", meta("different", WORK), [turn_start(0)])
    persistence, store = coordinator(backend)
    async with close_reports_a_failure(persistence):
        session = store.create("requested", meta={"cwd": WORK})
        session.append("turn/start", {"turn": 1})
        with pytest.raises(SessionPersistenceCorruptionError, match="stored session identity mismatch"):
            await store.flush(session)
        assert "requested" not in persistence._states
    assert backend.store.events("requested") == [turn_start(0)]


async def test_live_adoption_refuses_a_different_inherited_cut() -> None:
    shared = MemoryStore()
    shared.put("cut", meta("cut", WORK, is_seeded=True), one_turn_log(), inherited_event_count=2)
    persistence, store = coordinator(MemoryBackend(shared))
    async with close_reports_a_failure(persistence):
        session = store.create(
            "cut", meta={"cwd": WORK, "isSeeded": True}, seed=one_turn_log(), inherited_event_count=3
        )
        with pytest.raises(SessionIdCollisionError, match="different inherited event count"):
            await store.flush(session)


# ------------------------------------------------------------------------------------------------------------------
# The writer lease


async def test_a_cold_load_without_repair_takes_no_lease_but_a_repairing_one_does() -> None:
    shared = MemoryStore()
    shared.put("balanced", meta("balanced", WORK), one_turn_log())
    shared.put("open", meta("open", WORK), [turn_start(0)])
    persistence, _ = coordinator(MemoryBackend(shared))
    async with persistence:
        await persistence.load("balanced")
        assert shared.lease_holder("balanced") is None
        await persistence.load("open")
        assert shared.lease_holder("open") is not None
        other, _ = coordinator(MemoryBackend(shared))
        async with other:
            await other.load("balanced")  # plain: fine while nobody writes
            with pytest.raises(SessionLockedError):
                await other.append("open", simple_turn(2, 2))
    assert shared.lease_holder("open") is None  # released when the coordinator closed


async def test_append_after_an_unleased_load_rereads_under_the_lease() -> None:
    """A load (no lease) then an external append: the next append re-reads under the lease and refuses the stale
    seq, even over a backend that would append at any seq."""
    shared = MemoryStore()
    shared.put("s", meta("s", WORK), one_turn_log())
    persistence, _ = coordinator(Lax(shared))
    async with persistence:
        await persistence.load("s")
        shared.append_raw("s", simple_turn(6, 2, "external"))
        with pytest.raises(SeqMismatchError, match="expected 9 at index 0, got 6"):
            await persistence.append("s", simple_turn(6, 2, "stale"))
        await persistence.append("s", simple_turn(9, 3))
    assert shared.events("s") == one_turn_log() + simple_turn(6, 2, "external") + simple_turn(9, 3)


async def test_hot_reload_adoption_rereads_a_log_that_moved_while_the_lease_was_taken() -> None:
    shared = MemoryStore()
    shared.put("hot", meta("hot", WORK), one_turn_log())

    class MovesOnLease(Lax):
        async def acquire_writer_lease(self, header: Any) -> Any:
            lease = await super().acquire_writer_lease(header)
            shared.append_raw("hot", simple_turn(6, 2, "moved"))  # another writer finished just before
            return lease

    persistence, store = coordinator(MovesOnLease(shared))
    async with close_reports_a_failure(persistence):
        session = store.create("hot", meta={"cwd": WORK}, seed=one_turn_log())
        with pytest.raises(SessionIdCollisionError, match="does not match this live session"):
            await store.flush(session)
    assert shared.events("hot") == one_turn_log() + simple_turn(6, 2, "moved")


# ------------------------------------------------------------------------------------------------------------------
# The in-doubt read-back: what a failed primitive left behind decides


async def test_in_doubt_first_batch_with_another_header_is_corruption_and_stays_in_doubt() -> None:
    shared = MemoryStore()
    backend = Misbehaving(shared)

    async def foreign(storage: StorageMetadata, events: list[SessionEvent], materialized: bool) -> None:
        shared.put(storage.meta.id, meta(storage.meta.id, "/elsewhere"), events)

    backend.effect = foreign
    persistence, _ = coordinator(backend)
    async with persistence:
        await persistence.create(meta("s", WORK))
        with pytest.raises(SessionPersistenceCorruptionError, match="header or inherited cut differs"):
            await persistence.append("s", one_turn_log())
        with pytest.raises(SessionPersistenceCorruptionError, match="header or inherited cut differs"):
            await persistence.append("s", one_turn_log())  # still in doubt: read back again, never written on top
    assert shared.events("s") == one_turn_log()


async def test_in_doubt_batch_with_other_events_at_its_seqs_is_corruption() -> None:
    shared = MemoryStore()
    backend = Misbehaving(shared)

    async def other_events(storage: StorageMetadata, events: list[SessionEvent], materialized: bool) -> None:
        shared.append_raw(storage.meta.id, simple_turn(6, 2, "not mine"))

    persistence, _ = coordinator(backend)
    async with persistence:
        await persistence.create(meta("s", WORK))
        await persistence.append("s", one_turn_log())
        backend.effect = other_events
        with pytest.raises(SessionPersistenceCorruptionError, match="did not write from seq 6"):
            await persistence.append("s", simple_turn(6, 2))
    assert shared.events("s") == one_turn_log() + simple_turn(6, 2, "not mine")


async def test_in_doubt_read_back_finding_lost_acknowledged_events_is_corruption() -> None:
    shared = MemoryStore()
    backend = Misbehaving(shared)

    async def lose(storage: StorageMetadata, events: list[SessionEvent], materialized: bool) -> None:
        shared.put(storage.meta.id, storage.meta, one_turn_log()[:3])

    persistence, _ = coordinator(backend)
    async with persistence:
        await persistence.create(meta("s", WORK))
        await persistence.append("s", one_turn_log())
        backend.effect = lose
        with pytest.raises(SessionPersistenceCorruptionError, match="fewer than the 6 acknowledged"):
            await persistence.append("s", simple_turn(6, 2))


async def test_in_doubt_partial_batch_acknowledges_the_stored_part_and_retries_the_rest() -> None:
    shared = MemoryStore()
    backend = Misbehaving(shared)

    async def half(storage: StorageMetadata, events: list[SessionEvent], materialized: bool) -> None:
        shared.append_raw(storage.meta.id, events[:1])

    persistence, _ = coordinator(backend)
    async with persistence:
        await persistence.create(meta("s", WORK))
        await persistence.append("s", one_turn_log())
        backend.effect = half
        batch = simple_turn(6, 2)
        with pytest.raises(SessionStorageError, match="events before seq 7 were stored") as info:
            await persistence.append("s", batch)
        assert info.value.errno == 5
        await persistence.append("s", batch[1:])
    assert shared.events("s") == one_turn_log() + simple_turn(6, 2)


async def test_in_doubt_torn_tail_is_cut_before_the_retry() -> None:
    shared = MemoryStore()
    backend = Misbehaving(shared)

    async def torn(storage: StorageMetadata, events: list[SessionEvent], materialized: bool) -> None:
        shared.inject_torn_tail(storage.meta.id, encode_event(events[0])[:10])

    persistence, _ = coordinator(backend)
    async with persistence:
        await persistence.create(meta("s", WORK))
        await persistence.append("s", one_turn_log())
        backend.effect = torn
        with pytest.raises(SessionStorageError):
            await persistence.append("s", simple_turn(6, 2))
        assert not shared.has_torn_tail("s")
        await persistence.append("s", simple_turn(6, 2))
    assert shared.events("s") == one_turn_log() + simple_turn(6, 2)


async def test_retrying_a_batch_the_read_back_acknowledged_is_acknowledged_not_refused() -> None:
    shared = MemoryStore()
    backend = Misbehaving(shared)

    async def lands(storage: StorageMetadata, events: list[SessionEvent], materialized: bool) -> None:
        await MemoryBackend.append_batch(backend, storage, events, materialized)

    persistence, _ = coordinator(backend)
    async with persistence:
        await persistence.create(meta("s", WORK))
        backend.effect = lands
        await persistence.append("s", one_turn_log())  # acknowledged by the read-back
        await persistence.append("s", one_turn_log())  # the caller retries anyway: acknowledged, not written
        with pytest.raises(SeqMismatchError):
            await persistence.append("s", simple_turn(0, 1, "different"))
    assert shared.events("s") == one_turn_log()


async def test_an_explicit_refusal_is_passed_on_without_a_read_back() -> None:
    """A primitive that refuses before writing (here ``SeqMismatchError``) is not in doubt: its error reaches the
    caller unchanged and nothing is read back."""

    class Refusing(MemoryBackend):
        reads = 0

        async def load_stored(self, session_id: str) -> Any:
            self.reads += 1
            return await super().load_stored(session_id)

        async def append_batch(
            self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
        ) -> None:
            if is_materialized:
                raise SeqMismatchError("refused by the backend before writing")
            await super().append_batch(storage, events, is_materialized)

    backend = Refusing()
    persistence, _ = coordinator(backend)
    async with persistence:
        await persistence.create(meta("s", WORK))
        await persistence.append("s", one_turn_log())
        reads = backend.reads
        with pytest.raises(SeqMismatchError, match="refused by the backend before writing"):
            await persistence.append("s", simple_turn(6, 2))
        assert backend.reads == reads


async def test_in_doubt_read_back_accepts_the_header_upgraded_by_the_write() -> None:
    """A backend that stores an older readable header raised to the version it writes (JSONL's v0 -> v1 on the
    first write) is still the same session: the landed batch is acknowledged, not called another writer's."""
    shared = MemoryStore()
    shared.put("old", meta("old", WORK, version=0), one_turn_log())
    backend = Misbehaving(shared)

    async def upgrade_and_land(storage: StorageMetadata, events: list[SessionEvent], materialized: bool) -> None:
        shared.put("old", meta("old", WORK, version=1), shared.events("old") + events)

    persistence, _ = coordinator(backend)
    async with persistence:
        await persistence.load("old")
        backend.effect = upgrade_and_land
        await persistence.append("old", simple_turn(6, 2))
        await persistence.append("old", simple_turn(9, 3))
    assert shared.events("old") == one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)


# ------------------------------------------------------------------------------------------------------------------
# The one-pass validation of a whole stored log: a defect it declines is decided by the separate checks, in order


def _reseq(events: list[SessionEvent], at: int, delta: int) -> list[SessionEvent]:
    """``events`` with every seq from index ``at`` on moved by ``delta`` (a gap or a repeat there)."""
    import msgspec

    return [*events[:at], *(msgspec.structs.replace(e, seq=e.seq + delta) for e in events[at:])]


def _with_turn_error() -> list[SessionEvent]:
    """Seqs 0..6 with a second ``turn/start`` at seq 2 while turn 1 is open (a turn-rule defect only)."""
    log = one_turn_log()
    return [*log[:2], turn_start(2, 2), *_reseq(log[2:], 0, 1)]


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        (lambda: _reseq(one_turn_log(), 2, 1), "stored event at index 2 has seq 3"),
        (lambda: _reseq(one_turn_log(), 4, -1), "stored event at index 4 has seq 3"),
        # A turn error before a gap: the gap is what is reported (contiguity is checked first, over the whole log).
        (lambda: _reseq(_with_turn_error(), 5, 1), "stored event at index 5 has seq 6"),
        (_with_turn_error, "rule turn-open"),
    ],
    ids=["gap", "repeat", "gap-after-a-turn-error", "turn-error"],
)
@pytest.mark.parametrize("read", ["load", "inspect"])
async def test_a_defective_stored_log_is_refused_naming_its_first_defect(stored: Any, message: str, read: str) -> None:
    backend = MemoryBackend()
    backend.store.put("s", meta("s", WORK), stored())
    persistence, _ = coordinator(backend)
    async with persistence:
        with pytest.raises(SessionPersistenceCorruptionError, match=message):
            await getattr(persistence, read)("s")
