"""Conformance cases for one writer per session, in-doubt writes and storage-level contracts.

Mixed into :class:`~dsh.session_persistence.testing.BackendConformance`, so every backend inherits them:

* two writers on one session, two coordinators in one process and two real processes racing: exactly one
  writes, the other gets :class:`SessionLockedError` before anything is written, the log stays intact, and
  the lease of a killed process is free again;
* a stale ``truncate`` (the log changed under the writer) is refused; a cold ``load`` that must repair is
  refused while a live writer holds the session, and plain reads never need the lease;
* in-doubt writes (the primitive raised after its write landed, or the read-back failed too) are acknowledged
  exactly once, never duplicated and never wedge the session;
* storage-level cases that bypass the coordinator's cursor: a batch at a wrong seq is
  :class:`SeqMismatchError`; a primitive cancelled at any checkpoint, or a process killed inside a first
  materialization, never leaves a listed session that cannot be loaded.

Lease cases skip (saying so) when the backend has no ``acquire_writer_lease``; cross-process cases need the
``process_backend_factory`` fixture (a picklable factory over the same storage), and skip without it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import pytest

from .._backends.protocol import SessionBackend, StorageMetadata, SupportsRewrite, SupportsWriterLease
from .._coordinator.service import core_of
from .._host.session import Session
from .._model.errors import (
    SeqMismatchError,
    SessionLockedError,
    SessionPersistenceError,
    SessionWriteInDoubtError,
)
from .._model.events import SessionEvent
from .._model.header import header_to_builtins
from .._wire.codec import event_to_builtins
from ._faults import FaultInjectingBackend
from ._logs import meta, one_turn_log, simple_turn, step_end, step_start, turn_end, turn_start
from ._rig import ConformanceRig
from ._writer_child import churn_materializations, write_and_hold

__all__ = ["_WriterCases"]

#: A bound on waits for a child process, never a timing assertion.
CHILD_LIMIT = 120


def _append_live(session: Session, events: Sequence[SessionEvent]) -> None:
    for e in events:
        session.append_event(e)


def _wire(events: Sequence[SessionEvent]) -> list[dict[str, Any]]:
    return [event_to_builtins(e) for e in events]


async def _next_result(results: Any) -> tuple[Any, ...]:
    result: tuple[Any, ...] = await anyio.to_thread.run_sync(lambda: results.get(True, CHILD_LIMIT))
    if result[0] == "error":
        raise AssertionError(f"child process {result[1]} failed: {result[2]}")
    return result


def _reap(processes: Sequence[Any]) -> None:
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join(CHILD_LIMIT)


class _WriterCases:
    """One writer per session, in-doubt writes, storage-level contracts (see the module doc)."""

    #: Whether ``SessionLockedError.holder`` names the holding process as ``"pid <n>..."`` (a file lock does;
    #: a server-side lock may name something else).
    lease_holder_names_pid: ClassVar[bool] = False
    #: Set ``False`` when the backend has the lease primitive but its lease excludes nobody (a no-op lease, e.g.
    #: a backend whose own compare-and-set refuses a stale writer instead): the exclusion cases then skip.
    writer_lease_excludes: ClassVar[bool] = True

    @pytest.fixture
    def process_backend_factory(self) -> Callable[[], SessionBackend] | None:
        """Override: a picklable zero-argument callable that builds, in another process, a backend over the
        same storage as ``backend_factory`` (e.g. ``functools.partial(MyBackend, path)``). ``None`` skips the
        cross-process cases (an in-process storage cannot be shared)."""
        return None

    def _require_lease(self, backend: SessionBackend) -> None:
        if not isinstance(backend, SupportsWriterLease):
            pytest.skip("backend has no writer lease primitive (acquire_writer_lease): no cross-writer exclusion")
        if not self.writer_lease_excludes:
            pytest.skip("this backend's writer lease is a no-op (writer_lease_excludes = False): no exclusion to test")

    @staticmethod
    def _require_processes(factory: Callable[[], SessionBackend] | None) -> Callable[[], SessionBackend]:
        if factory is None:
            pytest.skip("no process_backend_factory: this backend's storage cannot be shared with another process")
        return factory

    # ------------------------------------------------------------------------------------------------------
    # One writer per session

    async def test_lease_two_coordinators_in_one_process(self, conformance: ConformanceRig) -> None:
        """A second coordinator over the same storage is refused before it writes; the first keeps writing."""
        async with conformance.open() as a:
            self._require_lease(a.backend)
            session = a.store.create("duo", meta=meta("duo"))
            _append_live(session, one_turn_log())
            await a.store.flush(session)
            async with conformance.open() as b:
                with pytest.raises(SessionLockedError) as info:
                    await b.persistence.append("duo", simple_turn(6, 2, "intruder"))
                assert info.value.session_id == "duo"
                # A live Session of the same id in the second coordinator: its adoption is refused too.
                twin = b.store.create("duo", meta=meta("duo"))
                _append_live(twin, one_turn_log())
                with pytest.raises(SessionLockedError):
                    await b.store.flush(twin)
                b.store.dispose(twin)
                b.drain_failure = SessionLockedError  # its refused events stay buffered until the close
            assert await conformance.stored_events("duo") == one_turn_log()
            _append_live(session, simple_turn(6, 2))
            assert await a.store.flush(session) is True
        assert await conformance.stored_events("duo") == one_turn_log() + simple_turn(6, 2)
        # Closed: the lease is free again.
        async with conformance.open() as c:
            await c.persistence.append("duo", simple_turn(9, 3))
        assert await conformance.stored_events("duo") == one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)

    async def test_lease_is_released_when_the_session_is_disposed(self, conformance: ConformanceRig) -> None:
        """Disposing a live Session gives its lease back at once, while its coordinator keeps running."""
        async with conformance.open() as a:
            self._require_lease(a.backend)
            session = a.store.create("handover", meta=meta("handover"))
            _append_live(session, one_turn_log())
            await a.store.flush(session)
            async with conformance.open() as b:
                with pytest.raises(SessionLockedError):
                    await b.persistence.append("handover", simple_turn(6, 2))
                a.store.dispose(session)
                with anyio.fail_after(CHILD_LIMIT):  # a safety net, never a timing assertion
                    await core_of(a.persistence).wait_retired("handover")
                await b.persistence.append("handover", simple_turn(6, 2))
        assert await conformance.stored_events("handover") == one_turn_log() + simple_turn(6, 2)

    async def test_lease_two_processes_race(
        self, conformance: ConformanceRig, process_backend_factory: Callable[[], SessionBackend] | None
    ) -> None:
        """Two processes race to append to one session: exactly one writes and holds it, the other is refused
        naming it; this process is refused too; once the winner is killed its lease is free."""
        factory = self._require_processes(process_backend_factory)
        async with conformance.open() as p:
            self._require_lease(p.backend)
            await p.persistence.create(meta("raced"))
            await p.persistence.append("raced", one_turn_log())
        ctx = multiprocessing.get_context("spawn")
        start, results = ctx.Event(), ctx.Queue()
        batches = {name: simple_turn(6, 2, f"writer {name}") for name in ("a", "b")}
        pipes = {name: ctx.Pipe(duplex=False) for name in batches}
        processes = {
            name: ctx.Process(
                target=write_and_hold,
                args=(factory, "raced", None, _wire(batch), start, results, pipes[name][0]),
                daemon=True,
            )
            for name, batch in batches.items()
        }
        try:
            for process in processes.values():
                process.start()
            for receiving, _sending in pipes.values():
                receiving.close()  # the children hold their own copies
            start.set()
            outcomes = [await _next_result(results), await _next_result(results)]
            kinds = sorted(outcome[0] for outcome in outcomes)
            assert kinds == ["locked", "ok"], f"expected exactly one writer, got {outcomes}"
            winner_pid = next(outcome[1] for outcome in outcomes if outcome[0] == "ok")
            holder = next(outcome[2] for outcome in outcomes if outcome[0] == "locked")
            if self.lease_holder_names_pid:
                assert holder is not None and f"pid {winner_pid}" in holder, holder
            winner = next(name for name, process in processes.items() if process.pid == winner_pid)
            assert await conformance.stored_events("raced") == one_turn_log() + batches[winner]
            async with conformance.open() as p:
                with pytest.raises(SessionLockedError):
                    await p.persistence.append("raced", simple_turn(9, 3))
            assert await conformance.stored_events("raced") == one_turn_log() + batches[winner]
            os.kill(winner_pid, signal.SIGKILL)  # no cleanup runs: the lease must die with the process
            processes[winner].join(CHILD_LIMIT)
            async with conformance.open() as p:
                await p.persistence.append("raced", simple_turn(9, 3))
            assert await conformance.stored_events("raced") == one_turn_log() + batches[winner] + simple_turn(9, 3)
        finally:
            for _receiving, sending in pipes.values():
                sending.close()  # releases a child still holding its lease
            _reap(list(processes.values()))

    async def test_repair_refused_while_a_live_writer_holds_the_session(self, conformance: ConformanceRig) -> None:
        """A cold load that would close another writer's open turn is refused; plain reads need no lease."""
        async with conformance.open() as a:
            self._require_lease(a.backend)
            session = a.store.create("busy", meta=meta("busy"))
            _append_live(session, [turn_start(0, 1), step_start(1, 1, 1)])
            await a.store.flush(session)
            async with conformance.open() as b:
                with pytest.raises(SessionLockedError):
                    await b.persistence.load("busy")
                view = await b.persistence.inspect("busy")
                assert [e.type for e in view.events] == ["turn/start", "step/start", "step/end", "turn/end"]
                suffix = await b.persistence.read_from("busy", 1)
                assert [e.seq for e in suffix.events] == [1]
                assert [h.id for h in await b.persistence.list()] == ["busy"]
            assert await conformance.stored_events("busy") == [turn_start(0, 1), step_start(1, 1, 1)]
            _append_live(session, [step_end(2, 1, 1), turn_end(3, 1)])
            assert await a.store.flush(session) is True
        expected = [turn_start(0, 1), step_start(1, 1, 1), step_end(2, 1, 1), turn_end(3, 1)]
        assert await conformance.stored_events("busy") == expected

    async def test_stale_truncate_is_refused(self, conformance: ConformanceRig) -> None:
        """A truncate whose writer's view is stale (the stored log moved under it) deletes nothing."""
        async with conformance.open() as p:
            if not isinstance(p.backend, SupportsRewrite):
                pytest.skip("backend has no rewrite primitive")
            session = p.store.create("stale", meta=meta("stale"))
            log = one_turn_log() + simple_turn(6, 2)
            _append_live(session, log)
            await p.store.flush(session)
            stored = await conformance.stored("stale")
            assert stored is not None
            # Another writer that ignored the lease (or a backend without one) appended meanwhile.
            async with conformance.backend() as other:
                storage = StorageMetadata(stored.meta, stored.inherited_event_count)
                await other.append_batch(storage, simple_turn(9, 3, "other writer"), True)
            with pytest.raises(SessionPersistenceError, match="changed in storage"):
                await p.persistence.truncate(session, 6)
            assert await conformance.stored_events("stale") == log + simple_turn(9, 3, "other writer")

    # ------------------------------------------------------------------------------------------------------
    # In-doubt writes: the primitive raised, the write may have landed

    async def test_in_doubt_append_is_acknowledged_once(self, conformance: ConformanceRig) -> None:
        """A batch stored by a primitive that then raised is acknowledged by reading back, never re-appended;
        a first batch (header + batch) too, so the session is never wedged on its own committed write."""
        backend = FaultInjectingBackend(conformance.new_backend())
        async with conformance.open(backend) as p:
            await p.persistence.create(meta("doubt"))
            backend.fail_appends(1, when="after")  # e.g. EIO on the directory fsync after publishing the file
            await p.persistence.append("doubt", one_turn_log())
            assert [h.id for h in await p.persistence.list()] == ["doubt"]
            backend.fail_appends(1, when="after")  # e.g. the rollback of a failed fsync failed too
            await p.persistence.append("doubt", simple_turn(6, 2))
            await p.persistence.append("doubt", simple_turn(9, 3))
            assert backend.append_failures == 2
        assert await conformance.stored_events("doubt") == one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)

    async def test_in_doubt_write_whose_read_back_fails_is_settled_before_the_next_write(
        self, conformance: ConformanceRig
    ) -> None:
        """When the read-back fails too, the flush raises ``SessionWriteInDoubtError``; the next write reads
        back first: a batch that landed is not written twice, one that did not is written once."""
        backend = FaultInjectingBackend(conformance.new_backend())
        async with conformance.open(backend, delay_ms=2_147_483_647) as p:
            session = p.store.create("unsettled", meta=meta("unsettled"))
            _append_live(session, one_turn_log())
            await p.store.flush(session)
            backend.fail_appends(1, when="after")
            backend.fail_reads(1)
            _append_live(session, simple_turn(6, 2))
            with pytest.raises(SessionWriteInDoubtError):
                await p.store.flush(session)
            _append_live(session, simple_turn(9, 3))
            assert await p.store.flush(session) is True
            backend.fail_appends(1, when="before")
            backend.fail_reads(1)
            _append_live(session, simple_turn(12, 4))
            with pytest.raises(SessionWriteInDoubtError):
                await p.store.flush(session)
            assert await p.store.flush(session) is True
        expected = one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3) + simple_turn(12, 4)
        assert await conformance.stored_events("unsettled") == expected

    async def test_in_doubt_header_and_rewrite_are_acknowledged(self, conformance: ConformanceRig) -> None:
        """``materialize_header`` and ``rewrite`` that raise after landing are acknowledged by reading back."""
        backend = FaultInjectingBackend(conformance.new_backend())
        async with conformance.open(backend) as p:
            if not hasattr(backend, "materialize_header") or not hasattr(backend, "rewrite"):
                pytest.skip("backend has no materialize_header or rewrite primitive")
            session = p.store.create("empty", meta=meta("empty"))
            backend.fail("materialize_header", when="after")
            await p.persistence.ensure_materialized(session)
            assert [h.id for h in await p.persistence.list()] == ["empty"]
            _append_live(session, one_turn_log() + simple_turn(6, 2))
            await p.store.flush(session)
            backend.fail("rewrite", when="after")
            await p.persistence.truncate(session, 6)
            session.truncate(6)
            _append_live(session, simple_turn(6, 2, "again"))
            assert await p.store.flush(session) is True
        assert await conformance.stored_events("empty") == one_turn_log() + simple_turn(6, 2, "again")

    # ------------------------------------------------------------------------------------------------------
    # Storage level: straight to the backend, no coordinator cursor in front

    async def test_backend_refuses_a_batch_at_a_wrong_seq(self, conformance: ConformanceRig) -> None:
        """A first batch not starting at 0, a restated, gapped or duplicated batch: ``SeqMismatchError``, and
        nothing is written (also when another instance appended since this one last read)."""
        storage = StorageMetadata(meta("seqs"))
        async with conformance.backend() as backend:
            with pytest.raises(SeqMismatchError):
                await backend.append_batch(storage, simple_turn(1, 1), False)
            assert await backend.list() == []
            await backend.append_batch(storage, one_turn_log(), False)
            for bad in (simple_turn(5, 2), simple_turn(7, 2), one_turn_log()):
                with pytest.raises(SeqMismatchError):
                    await backend.append_batch(storage, bad, True)
            async with conformance.backend() as other:
                await other.append_batch(storage, simple_turn(6, 2, "other"), True)
            with pytest.raises(SeqMismatchError):
                await backend.append_batch(storage, simple_turn(6, 2, "stale"), True)
        assert await conformance.stored_events("seqs") == one_turn_log() + simple_turn(6, 2, "other")

    async def test_backend_primitive_cancelled_at_any_checkpoint_is_all_or_nothing(
        self, conformance: ConformanceRig
    ) -> None:
        """A mutating primitive cancelled at its k-th checkpoint stores the whole batch or nothing; a listed
        session always loads, and the same instance keeps working."""
        first, second = one_turn_log(), simple_turn(6, 2)
        async with conformance.backend() as backend:
            for k in range(6):
                storage = StorageMetadata(meta(f"cancel-{k}"))
                for batch, materialized in ((first, False), (second, True)):
                    if materialized and await conformance.stored_events(storage.meta.id) is None:
                        continue
                    with anyio.CancelScope() as scope:

                        async def cancel_after(scope: anyio.CancelScope = scope, k: int = k) -> None:
                            for _ in range(k):
                                await anyio.lowlevel.checkpoint()
                            scope.cancel()

                        async with anyio.create_task_group() as tg:
                            tg.start_soon(cancel_after)
                            await backend.append_batch(storage, batch, materialized)
                    stored = await conformance.stored_events(storage.meta.id)
                    allowed = [None, first] if not materialized else [first, first + second]
                    assert stored in allowed, f"checkpoint {k}: partial write {stored}"
            listed = await conformance.listed_ids()
            async with conformance.open() as p:
                for session_id in listed:
                    loaded = await p.persistence.load(session_id)
                    assert list(loaded.events)[:6] == first
            for session_id in listed:
                stored_now = await conformance.stored_events(session_id)
                assert stored_now is not None
                if len(stored_now) == len(first):
                    await backend.append_batch(StorageMetadata(meta(session_id)), second, True)
                    assert await conformance.stored_events(session_id) == first + second

    def test_killed_inside_first_materialization_never_lists_an_unloadable_session(
        self, conformance: ConformanceRig, process_backend_factory: Callable[[], SessionBackend] | None
    ) -> None:
        """A process SIGKILLed while it materializes sessions (header and first batch) leaves every listed
        session loadable with its whole first batch."""
        factory = self._require_processes(process_backend_factory)
        ctx = multiprocessing.get_context("spawn")
        for round_number in range(3):
            results = ctx.Queue()
            process = ctx.Process(target=churn_materializations, args=(factory, f"kill{round_number}", results))
            try:
                process.start()
                for _ in range(2 + round_number):
                    reported = results.get(True, CHILD_LIMIT)
                    assert reported[0] == "materialized", reported
                # The child is inside its next materialization now (it starts one right after reporting).
                os.kill(process.pid, signal.SIGKILL)  # type: ignore[arg-type]
                process.join(CHILD_LIMIT)
            finally:
                _reap([process])

        async def check() -> None:
            listed = await conformance.listed_ids()
            assert len(listed) >= 2 + 3 + 4
            async with conformance.open() as p:
                for session_id in listed:
                    loaded = await p.persistence.load(session_id)
                    assert list(loaded.events) == one_turn_log(), session_id
                    assert header_to_builtins(loaded.meta)["id"] == session_id

        anyio.run(check)
