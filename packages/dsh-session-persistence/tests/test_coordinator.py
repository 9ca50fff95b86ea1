"""PersistenceCoordinator unit behaviour (spec coordinator §7.C without the preparation cache, §3.4 integration).

Every test runs on asyncio and trio. Blocking is done with gates (``anyio.Event``) released in ``finally``; every
wait that could hang is bounded by ``anyio.fail_after``. No assertion depends on timing.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from dsh.session_persistence._backends.memory import MemoryBackend, MemoryStore
from dsh.session_persistence._coordinator.scheduling import ManualScheduler
from dsh.session_persistence._coordinator.service import PersistenceCoordinator
from dsh.session_persistence._host.host import Host
from dsh.session_persistence._host.session import Session, SessionStore
from dsh.session_persistence._model.errors import (
    LiveTurnOpenError,
    SeqMismatchError,
    SessionDisposeError,
    SessionFormatUnsupportedError,
    SessionIdCollisionError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionReservedError,
    SessionStorageError,
    UnsupportedOperationError,
)
from dsh.session_persistence._model.header import SessionHeader
from dsh.session_persistence._wire.codec import event_to_builtins, event_types
from dsh.session_persistence.testing._controlled import ControlledMemoryBackend
from dsh.session_persistence.testing._logs import (
    WORK,
    event,
    meta,
    one_turn_log,
    opaque,
    step_start,
    turn_end,
    turn_start,
)

pytestmark = pytest.mark.anyio

LIMIT = 5  # seconds: a bound on waits that would otherwise hang a broken build, never a timing assertion
MAX_DELAY = 2_147_483_647


class Boom(Exception):
    """Injected failure."""


@dataclass
class Rig:
    host: Host
    store: SessionStore
    backend: ControlledMemoryBackend
    persistence: PersistenceCoordinator
    scheduler: ManualScheduler | None
    dispose_error: BaseException | None = None


def new_backend(store: MemoryStore | None = None) -> ControlledMemoryBackend:
    return ControlledMemoryBackend(store)


@asynccontextmanager
async def rig(
    backend: ControlledMemoryBackend | None = None,
    *,
    delay: int = MAX_DELAY,
    manual: bool = True,
    dispose_fails: bool = False,
) -> AsyncIterator[Rig]:
    """A host, its store and a started coordinator. ``dispose_fails``: teardown must raise its SessionDisposeError,
    which is kept in ``dispose_error`` for the test to inspect after the ``async with`` block."""
    host = Host()
    store = SessionStore(host)
    backend = backend if backend is not None else new_backend()
    scheduler = ManualScheduler() if manual else None
    persistence = PersistenceCoordinator(host, backend, write_batch_max_delay_ms=delay, scheduler=scheduler)
    r = Rig(host, store, backend, persistence, scheduler)
    try:
        async with persistence:
            yield r
    except SessionDisposeError as error:
        if not dispose_fails:
            raise
        r.dispose_error = error
    else:
        assert not dispose_fails, "teardown was expected to fail"


def live(store: SessionStore, session_id: str, **kwargs: Any) -> Session:
    kwargs.setdefault("meta", {"cwd": WORK})
    return store.create(session_id, **kwargs)


def start_turn(session: Session, turn: int = 1) -> None:
    session.append("turn/start", {"turn": turn})


def end_turn(session: Session, turn: int = 1, reason: dict[str, Any] | None = None) -> None:
    session.append("turn/end", {"turn": turn, "reason": reason or {"kind": "completed"}})


def seqs(events: Any) -> list[int]:
    return [e.seq for e in events]


def stored(r: Rig, session_id: str) -> list[int]:
    return seqs(r.backend.store.events(session_id))


def gate_hook(started: anyio.Event, gate: anyio.Event, *, attempt: int = 1, error: Exception | None = None) -> Any:
    """A ``before_*`` hook that blocks attempt ``attempt`` until ``gate`` is set (then raises ``error``)."""

    async def hook(n: int) -> None:
        if n == attempt:
            started.set()
            await gate.wait()
            if error is not None:
                raise error

    return hook


def maps_empty(p: PersistenceCoordinator) -> bool:
    return not (p._states or p._live or p._chains or p._retirements or p._reservations)


async def settle_retirements(p: PersistenceCoordinator) -> None:
    with anyio.fail_after(LIMIT):
        while p._retirements:
            await next(iter(p._retirements.values())).wait_settled()
        await anyio.wait_all_tasks_blocked()


async def run_in_background(tg: Any, func: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    """Start ``func`` in ``tg``; the returned dict receives ``result`` or ``error`` when it settles."""
    box: dict[str, Any] = {}

    async def runner() -> None:
        try:
            box["result"] = await func()
        except Exception as exc:
            box["error"] = exc
        finally:
            box["done"] = True

    tg.start_soon(runner)
    return box


# ------------------------------------------------------------------------------------------------------------------
# Construction and capability defaults


@pytest.mark.parametrize("size", [0, 1.5, True])
async def test_61_cache_size_must_be_positive_safe_int(size: Any) -> None:
    with pytest.raises(TypeError, match="preparedSessionCacheSize must be a positive safe integer"):
        PersistenceCoordinator(Host(), MemoryBackend(), prepared_session_cache_size=size)


@pytest.mark.parametrize("delay", [0, 1.5, 2_147_483_648, True])
async def test_61_delay_must_be_an_integer_in_range(delay: Any) -> None:
    with pytest.raises(TypeError, match="writeBatchMaxDelayMs must be an integer between"):
        PersistenceCoordinator(Host(), MemoryBackend(), write_batch_max_delay_ms=delay)


async def test_54_read_raw_unsupported_and_cancellation() -> None:
    async with rig() as r:
        p = r.persistence
        assert p.supports_raw_artifacts is False
        assert p.locate(meta("x", WORK)) is None
        with pytest.raises(UnsupportedOperationError, match="does not expose raw artifacts"):
            await p.read_raw("x")
        with anyio.CancelScope() as scope:
            scope.cancel()
            await p.read_raw("x")
        assert scope.cancelled_caught


async def test_memory_plugin_is_discoverable() -> None:
    from dsh.session_persistence._backends import memory_plugin as _memory_plugin

    host = Host()
    host.register(_memory_plugin)
    assert host.dsh_session_backends() == {"memory": MemoryBackend}


# ------------------------------------------------------------------------------------------------------------------
# Storage basics through the coordinator (no live session)


async def test_create_append_load_roundtrip_and_lazy_create() -> None:
    async with rig() as r:
        p = r.persistence
        await p.create(meta("s1", WORK))
        assert await p.list() == []
        assert await p.list_snapshots() == []
        await p.append("s1", one_turn_log())
        view = await p.load("s1")
        assert view.meta.cwd == WORK
        assert view.inherited_event_count == 0
        assert seqs(view.events) == list(range(6))
        assert [h.id for h in await p.list()] == ["s1"]


async def test_create_validation_order_and_messages() -> None:
    async with rig() as r:
        p = r.persistence
        with pytest.raises(TypeError, match="losslessly JSON-serializable"):
            await p.create({"version": 0, "id": "a", "createdAt": float("nan"), "isSeeded": False})
        with pytest.raises(TypeError, match="createdAt must be a non-negative safe integer"):
            await p.create({"version": 0, "id": "a", "createdAt": 1.5, "isSeeded": False})
        with pytest.raises(TypeError, match="requires an inherited event count"):
            await p.create(meta("a", WORK, is_seeded=True))
        with pytest.raises(TypeError, match="SessionLogOffset must be a non-negative safe integer, got -1"):
            await p.create(meta("a", WORK, is_seeded=True), -1)
        with pytest.raises(TypeError, match="inherited event count must be 0"):
            await p.create(meta("a", WORK), 1)
        # A failure reserved nothing.
        await p.create(meta("a", WORK))
        with pytest.raises(SessionPersistenceError, match="already exists in this backend"):
            await p.create(meta("a", WORK))


async def test_48_create_over_a_persisted_log_is_refused() -> None:
    shared = MemoryStore()
    async with rig(new_backend(shared)) as r:
        await r.persistence.create(meta("s", WORK))
        await r.persistence.append("s", one_turn_log())
    async with rig(new_backend(shared)) as r:
        with pytest.raises(SessionPersistenceError, match="already has a persisted log on disk"):
            await r.persistence.create(meta("s", WORK))


async def test_inherited_prefix_gate_and_seq_contiguity() -> None:
    async with rig() as r:
        p = r.persistence
        await p.create(meta("f", WORK, is_seeded=True), 2)
        with pytest.raises(SessionPersistenceError, match="cannot materialize before its inherited prefix is complete"):
            await p.append("f", one_turn_log()[:1])
        assert await p.list() == []
        await p.append("f", one_turn_log())
        assert (await p.load("f")).inherited_event_count == 2
        with pytest.raises(SeqMismatchError, match='append seq mismatch for "f": expected 6 at index 0, got 0'):
            await p.append("f", one_turn_log())
        assert stored(r, "f") == list(range(6))


async def test_append_snapshots_the_batch_at_call_time_and_refuses_non_json() -> None:
    async with rig() as r:
        p = r.persistence
        await p.create(meta("s", WORK))
        with pytest.raises(TypeError, match="losslessly JSON-serializable"):
            await p.append("s", [{"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1, "x": {1, 2}}}])
        batch: list[Any] = [{"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}]
        await p.append("s", batch)
        batch[0]["data"]["turn"] = 99
        assert (await p.inspect("s")).events[0].data.turn == 1  # type: ignore[union-attr]


async def test_empty_append_stays_lazy_even_for_unknown_ids() -> None:
    async with rig() as r:
        await r.persistence.append("nobody", [])
        await r.persistence.create(meta("s", WORK))
        await r.persistence.append("s", [])
        assert await r.persistence.list() == []
        with pytest.raises(SessionNotFoundError):
            await r.persistence.append("nobody", one_turn_log())


async def test_5_interrupted_turn_inspect_never_writes_load_repairs() -> None:
    async with rig() as r:
        p = r.persistence
        await p.create(meta("s", WORK))
        await p.append("s", [*one_turn_log(), turn_start(6, 2), step_start(7, 2, 1)])
        (r0,) = await p.list_snapshots()
        view = await p.inspect("s")
        assert event_types(view.events)[-4:] == ["turn/start", "step/start", "step/end", "turn/end"]
        assert (await p.list_snapshots())[0].revision == r0.revision
        assert r.backend.repair_attempts == 0
        loaded = await p.load("s")
        assert seqs(loaded.events) == list(range(10))
        assert event_to_builtins(loaded.events[-1])["data"]["reason"] == {"kind": "interrupted"}
        assert (await p.list_snapshots())[0].revision != r0.revision
        assert r.backend.repair_attempts == 1
        await p.append("s", [turn_start(10, 3), turn_end(11, 3)])
        assert seqs((await p.load("s")).events) == list(range(12))


async def test_53_torn_tail_is_truncated_and_repaired_by_a_fresh_instance() -> None:
    shared = MemoryStore()
    async with rig(new_backend(shared)) as r:
        await r.persistence.create(meta("s", WORK))
        await r.persistence.append("s", [*one_turn_log(), turn_start(6, 2), step_start(7, 2, 1)])
    shared.inject_torn_tail("s")
    async with rig(new_backend(shared)) as r:
        inspected = await r.persistence.inspect("s")
        assert shared.has_torn_tail("s")  # inspect leaves the torn tail alone
        assert len(inspected.events) == 10
        view = await r.persistence.load("s")
        assert event_types(view.events)[-2:] == ["step/end", "turn/end"]
        assert not shared.has_torn_tail("s")
        await r.persistence.append("s", [turn_start(10, 3), turn_end(11, 3)])
        assert seqs((await r.persistence.load("s")).events) == list(range(12))


async def test_read_from_is_a_detached_storage_suffix() -> None:
    async with rig() as r:
        p = r.persistence
        await p.create(meta("s", WORK))
        await p.append("s", one_turn_log())
        whole = await p.read_from("s", 0)
        assert (whole.from_seq, seqs(whole.events)) == (0, list(range(6)))
        assert seqs((await p.read_from("s", 3)).events) == [3, 4, 5]
        far = await p.read_from("s", 106)
        assert (far.from_seq, far.events) == (106, ())
        await p.append("s", [turn_start(6, 2)])
        assert event_types((await p.read_from("s", 6)).events) == ["turn/start"]
        with pytest.raises(SessionNotFoundError):
            await p.read_from("nobody", 0)
        for bad in (-1, 1.5):
            with pytest.raises(TypeError, match="non-negative safe integer"):
                await p.read_from("s", bad)  # type: ignore[arg-type]


async def test_9_cancelled_scope_reads_do_no_backend_io() -> None:
    async with rig() as r:
        p = r.persistence
        calls = (r.backend.load_attempts, r.backend.seek_attempts)
        for call in (p.list, p.list_snapshots, lambda: p.inspect("nobody"), lambda: p.read_from("nobody", 0)):
            with anyio.CancelScope() as scope:
                scope.cancel()
                await call()
            assert scope.cancelled_caught
        assert (r.backend.load_attempts, r.backend.seek_attempts) == calls


async def test_49_to_51_format_refusals_are_not_wrapped() -> None:
    async with rig() as r:
        r.backend.store.put("new", meta("new", WORK, version=99), one_turn_log())
        r.backend.store.put("old", meta("old", WORK, version=-1), one_turn_log())
        r.backend.store.put("fut", meta("fut", WORK), [*one_turn_log(), opaque(6, "future/event", {}, ignorable=False)])
        r.backend.store.put("ign", meta("ign", WORK), [*one_turn_log(), opaque(6, "plugin/test", None, ignorable=True)])
        with pytest.raises(SessionFormatUnsupportedError, match=r"written by a newer harness.*upgrade the harness"):
            await r.persistence.load("new")
        with pytest.raises(SessionFormatUnsupportedError, match=r"older than the supported v1.*no upgrade path"):
            await r.persistence.inspect("old")
        with pytest.raises(SessionFormatUnsupportedError, match=r'event type "future/event".*not marked ignorable'):
            await r.persistence.load("fut")
        assert event_types((await r.persistence.load("ign")).events)[-1] == "plugin/test"
        assert event_types((await r.persistence.read_from("ign", 6)).events) == ["plugin/test"]


async def test_58_identity_mismatch_is_corruption_without_repair_or_state() -> None:
    async with rig() as r:
        r.backend.store.put("requested", meta("different", WORK), [turn_start(0)])
        with pytest.raises(SessionPersistenceCorruptionError, match="stored session identity mismatch") as info:
            await r.persistence.load("requested")
        assert str(info.value).startswith('stored session "requested" failed validation: ')
        assert info.value.__cause__ is not None
        assert r.backend.repair_attempts == 0
        assert "requested" not in r.persistence._states


async def test_59_cut_beyond_stored_log_is_corruption() -> None:
    async with rig() as r:
        r.backend.store.put("s", meta("s", WORK, is_seeded=True), [turn_start(0)], inherited_event_count=2)
        with pytest.raises(
            SessionPersistenceCorruptionError, match="inherited event count exceeds its stored event count"
        ):
            await r.persistence.load("s")
        assert r.backend.repair_attempts == 0
        assert "s" not in r.persistence._states


async def test_98_current_turn_endings_load_unchanged() -> None:
    aborted = event(1, "turn/end", {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})
    failed = event(1, "turn/end", {"turn": 1, "reason": {"kind": "error", "error": {"message": "boom", "code": "E"}}})
    async with rig() as r:
        for name, ending in (("aborted", aborted), ("error", failed)):
            r.backend.store.put(name, meta(name, WORK), [turn_start(0), ending])
            view = await r.persistence.load(name)
            assert view.events[-1] == ending
        assert r.backend.repair_attempts == 0


async def test_45_storage_only_append_adopts_and_commits_pending_repair() -> None:
    shared = MemoryStore()
    async with rig(new_backend(shared)) as r:
        await r.persistence.create(meta("s", WORK))
        await r.persistence.append("s", [*one_turn_log(), turn_start(6, 2)])
    async with rig(new_backend(shared)) as r:
        # The open turn is closed (seq 7) by adoption before the append continues at seq 8.
        with pytest.raises(SeqMismatchError, match="expected 8 at index 0, got 7"):
            await r.persistence.append("s", [turn_end(7, 2)])
        assert r.backend.repair_attempts == 1
        await r.persistence.append("s", [turn_start(8, 3), turn_end(9, 3)])
        assert stored(r, "s") == list(range(10))


# ------------------------------------------------------------------------------------------------------------------
# Live sessions, write-behind integration (§3.4)


async def test_background_write_after_the_window_with_a_manual_scheduler() -> None:
    async with rig(delay=200) as r:
        assert r.scheduler is not None
        session = live(r.store, "s")
        start_turn(session)
        end_turn(session)
        await r.scheduler.advance_settled(199)
        assert r.backend.append_attempts == 0
        await r.scheduler.advance_settled(1)
        assert r.backend.append_attempts == 1
        assert stored(r, "s") == [0, 1]


async def test_flush_barrier_through_the_store_makes_events_durable() -> None:
    async with rig() as r:
        session = live(r.store, "s")
        for e in one_turn_log():
            session.append_event(e)
        assert stored(r, "s") == []
        assert await r.store.flush(session) is True
        assert stored(r, "s") == list(range(6))
        view = await r.persistence.load("s")
        assert view.meta.cwd == WORK
        assert r.scheduler is not None and r.scheduler.armed == []


async def test_failed_background_write_is_retained_logged_once_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    async with rig(delay=200) as r:
        assert r.scheduler is not None
        session = live(r.store, "s")
        r.backend.fail_next("append_batch", Boom("disk full"))
        with caplog.at_level(logging.WARNING, logger="dsh.session_persistence"):
            start_turn(session)
            await r.scheduler.advance_settled(200)
            warnings = [rec for rec in caplog.records if "background write for session" in rec.getMessage()]
        assert len(warnings) == 1
        # The backend's error arrives as a storage error (chained), after a read-back found nothing stored.
        assert (
            'memory: background write for session "s" failed (buffered events retained): '
            'memory: append for session "s" failed: disk full'
        ) in warnings[0].getMessage()
        assert stored(r, "s") == []
        await r.scheduler.advance_settled(1000)  # paused: no automatic retry
        assert r.backend.append_attempts == 1
        end_turn(session)  # a new event re-arms a fresh window
        await r.scheduler.advance_settled(200)
        assert r.backend.append_attempts == 2
        assert stored(r, "s") == [0, 1]


async def test_52_flush_before_init_ran_writes_everything_once() -> None:
    async with rig() as r:
        session = live(r.store, "s")
        start_turn(session)
        end_turn(session)
        start_turn(session, 2)
        assert await r.store.flush(session) is True
        assert stored(r, "s") == [0, 1, 2]
        assert r.backend.append_attempts == 1


async def test_55_init_failure_surfaces_on_flush_and_teardown() -> None:
    backend = new_backend()
    backend.fail_next("load_stored", Boom("F"))
    async with rig(backend, dispose_fails=True) as r:
        assert r.scheduler is not None
        session = live(r.store, "s")
        start_turn(session)
        with pytest.raises(Boom, match="F"):
            await r.store.flush(session)
        assert r.scheduler.armed == []
    assert r.scheduler.armed == []
    assert isinstance(r.dispose_error, SessionDisposeError)
    assert str(r.dispose_error).startswith("memory dispose failed")
    assert any(isinstance(e, Boom) for e in r.dispose_error.errors)
    assert backend.lifecycle[-1] == "close"


async def test_56_follow_up_batch_starts_when_the_blocked_write_completes() -> None:
    async with rig(delay=1, manual=False) as r:
        session = live(r.store, "s")
        assert await r.store.flush(session) is True
        started, gate = anyio.Event(), anyio.Event()
        r.backend.before_append = gate_hook(started, gate)
        try:
            start_turn(session)
            with anyio.fail_after(LIMIT):
                await started.wait()
            end_turn(session)
        finally:
            gate.set()
        with anyio.fail_after(LIMIT):
            await r.store.flush(session)
        assert r.backend.append_attempts == 2
        assert stored(r, "s") == [0, 1]


async def test_57_two_flushes_join_a_failing_background_write(caplog: pytest.LogCaptureFixture) -> None:
    async with rig(delay=1, manual=False) as r:
        session = live(r.store, "s")
        started, gate = anyio.Event(), anyio.Event()
        r.backend.before_append = gate_hook(started, gate, error=Boom("F"))
        results: list[bool] = []
        with caplog.at_level(logging.WARNING, logger="dsh.session_persistence"):
            async with anyio.create_task_group() as tg:
                try:
                    start_turn(session)
                    end_turn(session)
                    with anyio.fail_after(LIMIT):
                        await started.wait()

                    async def flush() -> None:
                        results.append(await r.store.flush(session))

                    tg.start_soon(flush)
                    tg.start_soon(flush)
                    await anyio.wait_all_tasks_blocked()
                finally:
                    gate.set()
        assert results == [True, True]
        assert r.backend.append_attempts == 2
        assert stored(r, "s") == [0, 1]
        assert len([rec for rec in caplog.records if "background write" in rec.getMessage()]) == 1


async def test_75_live_open_turn_inspect_is_live_and_load_refuses() -> None:
    async with rig() as r:
        session = live(r.store, "s")
        start_turn(session)
        view = await r.persistence.inspect("s")
        assert view.events is session.events
        with pytest.raises(LiveTurnOpenError, match='cannot load session "s" while its live turn is open'):
            await r.persistence.load("s")
        end_turn(session)
        loaded = await r.persistence.load("s")
        assert event_types(loaded.events) == ["turn/start", "turn/end"]
        assert stored(r, "s") == [0, 1]


async def test_18_live_session_without_events_is_not_found() -> None:
    async with rig() as r:
        live(r.store, "s")
        with pytest.raises(SessionNotFoundError, match='session "s" not found'):
            await r.persistence.load("s")


async def test_35_reemitted_session_created_writes_nothing_twice() -> None:
    async with rig() as r:
        session = live(r.store, "s")
        for e in one_turn_log()[:3]:
            session.append_event(e)
        r.host.session_created(session)
        await r.store.flush(session)
        assert stored(r, "s") == [0, 1, 2]


async def test_fork_child_writes_seed_and_marker_as_one_materializing_batch() -> None:
    async with rig() as r:
        child = r.store.create(
            "child", seed=one_turn_log(), meta={"cwd": WORK, "isSeeded": True}, inherited_event_count=6
        )
        assert await r.store.flush(child) is True
        assert r.backend.append_attempts == 1
        await r.store.flush(child)
        assert r.backend.append_attempts == 1
        view = await r.persistence.load("child")
        assert (view.inherited_event_count, event_types(view.events)[-1]) == (6, "session/end-seed")
        suffix = await r.persistence.read_from("child", 3)
        assert (suffix.inherited_event_count, suffix.from_seq, seqs(suffix.events)) == (6, 3, [3, 4, 5, 6])


async def test_26_resume_via_load_then_a_seeded_session_claims_the_state() -> None:
    shared = MemoryStore()
    async with rig(new_backend(shared)) as r:
        session = live(r.store, "resumed")
        for e in one_turn_log():
            session.append_event(e)
        await r.store.flush(session)
    async with rig(new_backend(shared)) as r:
        loaded = await r.persistence.load("resumed")
        session = r.store.create("resumed", seed=loaded.events, meta=loaded.meta)
        assert await r.store.flush(session) is True
        start_turn(session, 2)
        end_turn(session, 2)
        await r.store.flush(session)
        view = await r.persistence.load("resumed")
        assert seqs(view.events) == list(range(9))
        assert view.events[6].type == "session/end-seed"


async def test_29_31_hot_reload_adopts_and_truncates_a_torn_tail_without_closing_the_live_turn() -> None:
    shared = MemoryStore()
    host = Host()
    store = SessionStore(host)
    async with PersistenceCoordinator(host, new_backend(shared), scheduler=ManualScheduler()):
        session = live(store, "hot")
        start_turn(session)
        session.append("step/start", {"turn": 1, "step": 1})
        await store.flush(session)
    shared.inject_torn_tail("hot")
    backend2 = new_backend(shared)
    async with PersistenceCoordinator(host, backend2, scheduler=ManualScheduler()):
        session.append("step/end", {"turn": 1, "step": 1})
        end_turn(session)
        assert await store.flush(session) is True
        assert not shared.has_torn_tail("hot")
        assert backend2.repair_attempts == 1
        view = await PersistenceCoordinator(host, new_backend(shared))._cold_commit("hot")
        assert event_types(view.events) == ["turn/start", "step/start", "step/end", "turn/end"]
        assert event_to_builtins(view.events[-1])["data"]["reason"] == {"kind": "completed"}


async def test_32_37_40_collisions_surface_on_flush() -> None:
    shared = MemoryStore()
    async with rig(new_backend(shared)) as r:
        await r.persistence.create(meta("collide", WORK))
        await r.persistence.append("collide", one_turn_log())
    async with rig(new_backend(shared), dispose_fails=True) as r:
        session = live(r.store, "collide")
        start_turn(session)
        with pytest.raises(SessionIdCollisionError, match="persisted log on disk that does not match"):
            await r.store.flush(session)
        r.store.dispose(session)
        await settle_retirements(r.persistence)
        await r.persistence.create(meta("elsewhere", "/other"))
        other = live(r.store, "elsewhere")
        with pytest.raises(SessionIdCollisionError, match=r"different cwd \(persisted: /other, live: /w\)"):
            await r.store.flush(other)
    # Both failed lifecycles are reported again by teardown (the disposed one's retirement failed too).
    assert isinstance(r.dispose_error, SessionDisposeError)
    assert len(r.dispose_error.errors) == 2


# ------------------------------------------------------------------------------------------------------------------
# Serialization, cancellation, reservations


async def test_92_same_id_appends_run_in_call_order_and_the_chain_drains() -> None:
    async with rig() as r:
        p = r.persistence
        await p.create(meta("s", WORK))
        started, gate = anyio.Event(), anyio.Event()
        r.backend.before_append = gate_hook(started, gate)
        async with anyio.create_task_group() as tg:
            try:
                first = await run_in_background(tg, lambda: p.append("s", [turn_start(0)]))
                with anyio.fail_after(LIMIT):
                    await started.wait()
                second = await run_in_background(tg, lambda: p.append("s", [turn_end(1)]))
                await anyio.wait_all_tasks_blocked()
                assert r.backend.append_attempts == 1
            finally:
                gate.set()
        assert "error" not in first and "error" not in second
        assert r.backend.append_attempts == 2
        assert stored(r, "s") == [0, 1]
        assert p._chains == {}


async def test_a_failed_op_never_poisons_the_chain_and_a_cancelled_queued_op_is_skipped() -> None:
    async with rig() as r:
        p = r.persistence
        await p.create(meta("s", WORK))
        started, gate = anyio.Event(), anyio.Event()
        r.backend.before_append = gate_hook(started, gate, error=Boom("first write fails"))
        async with anyio.create_task_group() as tg:
            try:
                failing = await run_in_background(tg, lambda: p.append("s", [turn_start(0)]))
                with anyio.fail_after(LIMIT):
                    await started.wait()
                skipped_scope = anyio.CancelScope()

                async def queued_then_cancelled() -> None:
                    with skipped_scope:
                        await p.append("s", [turn_start(0), turn_end(1)])

                tg.start_soon(queued_then_cancelled)
                after = await run_in_background(tg, lambda: p.append("s", [turn_start(0)]))
                await anyio.wait_all_tasks_blocked()
                skipped_scope.cancel()
                await anyio.wait_all_tasks_blocked()
                assert r.backend.append_attempts == 1
            finally:
                gate.set()
        assert isinstance(failing["error"], SessionStorageError)
        assert isinstance(failing["error"].__cause__, Boom)
        assert skipped_scope.cancelled_caught
        assert "error" not in after
        assert r.backend.append_attempts == 2  # the cancelled op never reached the backend
        assert stored(r, "s") == [0]
        assert p._chains == {}


async def test_different_ids_are_fully_concurrent() -> None:
    async with rig() as r:
        p = r.persistence
        await p.create(meta("a", WORK))
        await p.create(meta("b", WORK))
        started, gate = anyio.Event(), anyio.Event()
        r.backend.before_append = gate_hook(started, gate)
        async with anyio.create_task_group() as tg:
            try:
                blocked = await run_in_background(tg, lambda: p.append("a", [turn_start(0)]))
                with anyio.fail_after(LIMIT):
                    await started.wait()
                    await p.append("b", [turn_start(0), turn_end(1)])
                assert stored(r, "b") == [0, 1]
                assert "done" not in blocked
            finally:
                gate.set()
        assert stored(r, "a") == [0]


async def test_cancelling_a_caller_mid_write_releases_it_and_the_write_completes() -> None:
    async with rig() as r:
        p = r.persistence
        await p.create(meta("s", WORK))
        started, gate = anyio.Event(), anyio.Event()
        r.backend.before_append = gate_hook(started, gate)
        scope = anyio.CancelScope()
        returned: list[bool] = []
        async with anyio.create_task_group() as tg:

            async def caller() -> None:
                with scope:
                    await p.append("s", [turn_start(0)])
                    returned.append(True)  # never: the caller leaves at its cancellation (DESIGN 11.2)

            try:
                tg.start_soon(caller)
                with anyio.fail_after(LIMIT):
                    await started.wait()
                scope.cancel()
                await anyio.wait_all_tasks_blocked()
            finally:
                gate.set()
        assert returned == []
        # The started write went on in the coordinator's task group; the next append waits for it and continues
        # at seq 1 (the state moved with the durable write).
        await p.append("s", [turn_end(1)])
        assert stored(r, "s") == [0, 1]


async def test_84_inspect_cancelled_while_queued_is_skipped() -> None:
    async with rig() as r:
        r.backend.store.put("s", meta("s", WORK), one_turn_log())
        started, gate = anyio.Event(), anyio.Event()
        r.backend.before_load_stored = gate_hook(started, gate)
        async with anyio.create_task_group() as tg:
            try:
                first = await run_in_background(tg, lambda: r.persistence.inspect("s"))
                with anyio.fail_after(LIMIT):
                    await started.wait()
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    await r.persistence.inspect("s")
                assert scope.cancelled_caught
                assert r.backend.load_attempts == 1
                third = await run_in_background(tg, lambda: r.persistence.inspect("s"))
            finally:
                gate.set()
        assert seqs(first["result"].events) == list(range(6))
        assert seqs(third["result"].events) == list(range(6))
        assert r.persistence._chains == {}


async def test_60_cold_load_in_flight_vetoes_publication() -> None:
    async with rig() as r:
        r.backend.store.put("s", meta("s", WORK), [turn_start(0)])
        started, gate = anyio.Event(), anyio.Event()
        r.backend.before_load_stored = gate_hook(started, gate)
        async with anyio.create_task_group() as tg:
            try:
                loading = await run_in_background(tg, lambda: r.persistence.load("s"))
                with anyio.fail_after(LIMIT):
                    await started.wait()
                with pytest.raises(SessionReservedError, match="persisted state already owns this identity"):
                    live(r.store, "s")
                assert r.store.get("s") is None
            finally:
                gate.set()
        view: Any = loading["result"]
        assert event_types(view.events) == ["turn/start", "turn/end"]
        session = r.store.create("s", seed=view.events, meta=view.meta)
        assert await r.store.flush(session) is True
        assert event_types(r.backend.store.events("s")) == ["turn/start", "turn/end", "session/end-seed"]


async def test_87_waiting_for_retirement_is_cancellable_and_does_no_io() -> None:
    async with rig() as r:
        session = live(r.store, "s")
        start_turn(session)
        end_turn(session)
        started, gate = anyio.Event(), anyio.Event()
        r.backend.before_append = gate_hook(started, gate)
        try:
            r.store.dispose(session)
            with anyio.fail_after(LIMIT):
                await started.wait()
            loads = r.backend.load_attempts
            with anyio.CancelScope() as scope:
                scope.cancel()
                await r.persistence.inspect("s")
            assert scope.cancelled_caught
            assert r.backend.load_attempts == loads
        finally:
            gate.set()
        await settle_retirements(r.persistence)
        assert seqs((await r.persistence.inspect("s")).events) == [0, 1]


async def test_88_abandoned_lazy_id_is_reclaimed_by_a_new_session() -> None:
    async with rig() as r:
        started, gate = anyio.Event(), anyio.Event()
        r.backend.before_load_stored = gate_hook(started, gate)
        try:
            first = live(r.store, "s")
            with anyio.fail_after(LIMIT):
                await started.wait()
            r.store.dispose(first)
            second = live(r.store, "s")
        finally:
            gate.set()
        with anyio.fail_after(LIMIT):
            assert await r.store.flush(second) is True
        start_turn(second)
        end_turn(second)
        await r.store.flush(second)
        assert stored(r, "s") == [0, 1]
        r.store.dispose(second)
        await settle_retirements(r.persistence)
        assert maps_empty(r.persistence)


async def test_89_successor_retirement_replaces_the_record_and_nothing_stale_is_left() -> None:
    backend = new_backend()
    # No seek primitive on this instance (optional primitives are resolved when the coordinator is built):
    # read_from goes through the gated load_stored.
    backend.load_stored_from = None  # type: ignore[assignment, method-assign]
    async with rig(backend) as r:
        started, gate = anyio.Event(), anyio.Event()
        r.backend.before_load_stored = gate_hook(started, gate)
        async with anyio.create_task_group() as tg:
            try:
                reading = await run_in_background(tg, lambda: r.persistence.read_from("s", 0))
                with anyio.fail_after(LIMIT):
                    await started.wait()
                first = live(r.store, "s")
                r.store.dispose(first)
                record = r.persistence._retirements["s"]
                second = live(r.store, "s")
                r.store.dispose(second)
                assert r.persistence._retirements["s"] is not record
            finally:
                gate.set()
        await settle_retirements(r.persistence)
        assert record.is_set()
        assert isinstance(reading["error"], SessionNotFoundError)
        assert maps_empty(r.persistence)
        assert await r.persistence.list() == []


async def test_90_final_append_in_flight_then_a_new_session_collides() -> None:
    async with rig(dispose_fails=True) as r:
        first = live(r.store, "s")
        start_turn(first)
        end_turn(first)
        started, gate = anyio.Event(), anyio.Event()
        r.backend.before_append = gate_hook(started, gate)
        async with anyio.create_task_group() as tg:
            try:
                r.store.dispose(first)
                with anyio.fail_after(LIMIT):
                    await started.wait()
                second = live(r.store, "s")
                flushing = await run_in_background(tg, lambda: r.store.flush(second))
                await anyio.wait_all_tasks_blocked()
                assert "done" not in flushing
            finally:
                gate.set()
        assert isinstance(flushing["error"], SessionIdCollisionError)
        assert "bound to a different live session" in str(flushing["error"])
        assert stored(r, "s") == [0, 1]
        await settle_retirements(r.persistence)
    # The second Session is still live with a failed initialization: teardown reports it.
    assert isinstance(r.dispose_error, SessionDisposeError)


async def test_93_disposed_session_writes_are_retried_by_teardown(caplog: pytest.LogCaptureFixture) -> None:
    backend = new_backend()
    with caplog.at_level(logging.WARNING, logger="dsh.session_persistence"):
        async with rig(backend) as r:
            session = live(r.store, "s")
            start_turn(session)
            end_turn(session)
            backend.fail_next("append_batch", Boom("F"), times=None)
            r.store.dispose(session)
            await settle_retirements(r.persistence)
            assert any("retirement failed" in rec.getMessage() for rec in caplog.records)
            backend.heal()
    assert backend.store.events("s") and seqs(backend.store.events("s")) == [0, 1]
    assert backend.lifecycle[-2:] == ["append-committed", "close"]


async def test_94_teardown_waits_for_a_disposed_sessions_write_in_flight() -> None:
    backend = new_backend()
    async with rig(backend) as r:
        session = live(r.store, "s")
        start_turn(session)
        end_turn(session)
        started, gate = anyio.Event(), anyio.Event()
        backend.before_append = gate_hook(started, gate)
        async with anyio.create_task_group() as tg:
            try:
                r.store.dispose(session)
                with anyio.fail_after(LIMIT):
                    await started.wait()
                closing = await run_in_background(tg, r.persistence.aclose)
                await anyio.wait_all_tasks_blocked()
                assert "done" not in closing
                assert "close" not in backend.lifecycle
            finally:
                gate.set()
        assert "error" not in closing
    assert backend.lifecycle == ["append-started", "append-committed", "close"]


async def test_95_teardown_waits_for_a_public_append_in_flight() -> None:
    backend = new_backend()
    async with rig(backend) as r:
        await r.persistence.create(meta("s", WORK))
        started, gate = anyio.Event(), anyio.Event()
        backend.before_append = gate_hook(started, gate)
        async with anyio.create_task_group() as tg:
            try:
                appending = await run_in_background(tg, lambda: r.persistence.append("s", one_turn_log()))
                with anyio.fail_after(LIMIT):
                    await started.wait()
                closing = await run_in_background(tg, r.persistence.aclose)
                await anyio.wait_all_tasks_blocked()
                assert "done" not in closing
            finally:
                gate.set()
        assert "error" not in appending and "error" not in closing
    assert backend.lifecycle == ["append-started", "append-committed", "close"]
    assert seqs(backend.store.events("s")) == list(range(6))


async def test_96_ensure_materialized_twice() -> None:
    async with rig() as r:
        session = live(r.store, "empty")
        await r.persistence.ensure_materialized(session)
        await r.persistence.ensure_materialized(session)
        assert await r.persistence.list() == [session.header]
        view = await r.persistence.load("empty")
        assert (view.meta, view.inherited_event_count, view.events) == (session.header, 0, ())


async def test_97_backend_without_materialize_header() -> None:
    class NoHeader(ControlledMemoryBackend):
        materialize_header = None  # type: ignore[assignment]

    async with rig(NoHeader()) as r:
        session = live(r.store, "empty")
        with pytest.raises(UnsupportedOperationError, match="cannot materialize an empty session"):
            await r.persistence.ensure_materialized(session)


async def test_102_sessions_retire_and_every_map_drains() -> None:
    async with rig() as r:
        sessions = [live(r.store, f"s{i}") for i in range(3)]
        for session in sessions:
            start_turn(session)
            end_turn(session)
            assert await r.store.flush(session) is True
        for session in sessions:
            r.store.dispose(session)
        await settle_retirements(r.persistence)
        assert maps_empty(r.persistence)
        assert sorted(h.id for h in await r.persistence.list()) == ["s0", "s1", "s2"]


async def test_34_dispose_without_flush_persists_and_a_new_session_collides() -> None:
    async with rig(dispose_fails=True) as r:
        session = live(r.store, "s")
        start_turn(session)
        end_turn(session)
        r.store.dispose(session)
        assert seqs((await r.persistence.load("s")).events) == [0, 1]
        again = live(r.store, "s")
        with pytest.raises(SessionIdCollisionError):
            await r.store.flush(again)
    assert isinstance(r.dispose_error, SessionDisposeError)


async def test_33_empty_session_disposed_then_same_id_reused() -> None:
    async with rig() as r:
        first = live(r.store, "s")
        assert await r.store.flush(first) is True
        r.store.dispose(first)
        await settle_retirements(r.persistence)
        second = live(r.store, "s")
        start_turn(second)
        end_turn(second)
        assert await r.store.flush(second) is True
        assert seqs((await r.persistence.load("s")).events) == [0, 1]


async def test_27_late_attach_initializes_sessions_already_live() -> None:
    host = Host()
    store = SessionStore(host)
    session = live(store, "early")
    start_turn(session)
    end_turn(session)
    backend = new_backend()
    async with PersistenceCoordinator(host, backend, scheduler=ManualScheduler()) as p:
        start_turn(session, 2)
        assert await store.flush(session) is True
        assert seqs(backend.store.events("early")) == [0, 1, 2]
        assert (await p.inspect("early")).events is session.events


async def test_28_teardown_flushes_unflushed_live_events() -> None:
    shared = MemoryStore()
    async with rig(new_backend(shared)) as r:
        session = live(r.store, "s")
        start_turn(session)
        end_turn(session)
        start_turn(session, 2)
    async with rig(new_backend(shared)) as r:
        assert seqs((await r.persistence.inspect("s")).events) == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------------------------------------
# truncate (§1.2 #13)


async def test_103_truncate_rewrites_storage_then_the_session_continues() -> None:
    async with rig() as r:
        session = live(r.store, "s")
        for e in one_turn_log():
            session.append_event(e)
        start_turn(session, 2)
        end_turn(session, 2)
        await r.store.flush(session)
        (before,) = await r.persistence.list_snapshots()
        await r.persistence.truncate(session, 6)
        assert stored(r, "s") == list(range(6))
        assert (await r.persistence.list_snapshots())[0].revision != before.revision
        session.truncate(6)
        start_turn(session, 2)
        await r.store.flush(session)
        assert stored(r, "s") == list(range(7))


async def test_104_truncate_errors() -> None:
    async with rig() as r:
        child = r.store.create("c", seed=one_turn_log(), meta={"cwd": WORK, "isSeeded": True}, inherited_event_count=6)
        for bad in (5, 8):
            with pytest.raises(ValueError, match=f"session truncation length {bad} is outside the writable log prefix"):
                await r.persistence.truncate(child, bad)
        stranger = Session("c", header={"cwd": WORK})
        with pytest.raises(SessionPersistenceError, match="not owned by this persistence coordinator"):
            await r.persistence.truncate(stranger, 0)
        with pytest.raises(TypeError, match="non-negative safe integer"):
            await r.persistence.truncate(child, -1)

    class NoRewrite(ControlledMemoryBackend):
        rewrite = None  # type: ignore[assignment]

    async with rig(NoRewrite()) as r:
        session = live(r.store, "s")
        start_turn(session)
        end_turn(session)
        with pytest.raises(UnsupportedOperationError, match="memory does not support destructive session deletion"):
            await r.persistence.truncate(session, 0)


# ------------------------------------------------------------------------------------------------------------------
# Memory backend specifics


async def test_memory_backend_loads_fresh_objects_and_revisions_are_store_qualified() -> None:
    a, b = MemoryBackend(), MemoryBackend()
    header: SessionHeader = meta("s", WORK)
    for backend in (a, b):
        await backend.append_batch(_storage(header), one_turn_log(), False)
    first, second = await a.load_stored("s"), await a.load_stored("s")
    assert first is not None and second is not None
    assert first.events == second.events and first.events[0] is not second.events[0]
    assert first.revision == second.revision
    assert first.revision != (await b.read_stored_revision("s"))
    with pytest.raises(SessionPersistenceError):
        await a.append_batch(_storage(header), one_turn_log(), False)  # never clobbers
    with pytest.raises(SessionPersistenceError):
        await a.materialize_header(_storage(header))
    a.store.inject_torn_tail("s")
    torn = await a.load_stored("s")
    assert torn is not None and torn.torn_marker == 6
    await a.commit_repair(_storage(header), torn.torn_marker, [])
    repaired = await a.load_stored("s")
    assert repaired is not None and repaired.torn_marker is None and len(repaired.events) == 6


def _storage(header: SessionHeader) -> Any:
    from dsh.session_persistence._backends.protocol import StorageMetadata

    return StorageMetadata(header, 0)
