"""``BackendConformance``: the storage-contract and host scenarios every backend must pass (with its lifecycle
cases, ``LifecycleConformance``).

A backend package subclasses it and overrides one fixture::

    from dsh.session_persistence.testing import BackendConformance

    class TestJsonlConformance(BackendConformance):
        @pytest.fixture
        def backend_factory(self, tmp_path):
            return lambda: JsonlBackend(tmp_path)

``backend_factory`` returns a zero-argument callable; every call must build a **new backend instance over the
same, initially empty storage** (the kit treats a new instance as a process restart). Optional hooks, each a
method a subclass may override:

* ``inject_torn_tail(backend, session_id)``: leave a never-committed fragment after the last committed batch
  (default: skip the torn-tail tests);
* ``plant_raw(backend, storage, events)``: store a header and events verbatim, bypassing the coordinator's
  checks (default: the backend's own ``append_batch``; override if it validates, or skip);
* ``supports_truncate``: ``None`` (default) detects the optional ``rewrite`` primitive;
* ``process_backend_factory`` (a fixture): a picklable factory building the backend over the same storage in
  another process, for the cross-process writer cases (default ``None``: skipped);
* ``lease_holder_names_pid``: set ``True`` when ``SessionLockedError.holder`` names the holding process.

Write failures are injected by :class:`~dsh.session_persistence.testing.FaultInjectingBackend`, a wrapper that
works for every backend. Every async test runs on asyncio and trio: the class provides its own
``anyio_backend`` fixture (override it to narrow the set). The hypothesis property test imports hypothesis
lazily and is skipped when it is not installed.

The lifecycle cases (:class:`LifecycleConformance`, defined here too) cover paged listing, deletion, compaction and
retention. Those primitives are optional, so a backend without one skips its cases, unless the suite sets
``lifecycle_required = True`` (then a missing primitive fails). Its hooks:

* ``set_activity(backend, session_id, updated_at_ms)``: make the stored session's last activity read as that
  time (file systems stamp with coarse clocks, so the order tests set it; default: skip those tests);
* the ``other_backend_factory`` fixture: a factory over *another* empty storage (another root, another
  database), used to prove a cursor from elsewhere is refused (default ``None``: skip that test).

Both classes live in this one module, so the kit is three modules deep over the rig: this one, the groups of
cases, the rig (``tools/import-graph``).
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from .._backends.listing import SupportsListPage
from .._backends.protocol import SupportsCompact, SupportsDelete, SupportsWriterLease
from .._model.errors import (
    LifecycleArgumentError,
    SessionChangedError,
    SessionCursorError,
    SessionLiveError,
    SessionLockedError,
    SessionNotFoundError,
)
from ._conformance_faults import _FaultAndRaceCases
from ._conformance_live import _LiveCases
from ._conformance_storage import _StorageCases
from ._conformance_writers import _WriterCases
from ._lifecycle_retention import DAY_MS, NOW_MS, _ids, _key, _RetentionCases
from ._logs import WORK, meta, one_turn_log, simple_turn, turn_start
from ._rig import BackendFactory, ConformanceRig

__all__ = ["BackendConformance", "LifecycleConformance"]


class LifecycleConformance(_RetentionCases):
    """Lifecycle cases (collected through ``BackendConformance``): paged listing, deletion, compaction, retention."""

    # ------------------------------------------------------------------------------------------------------
    # paged listing

    async def _five(self, conformance: ConformanceRig) -> None:
        # created order a..e, activity order c, a, e, b, d (most recent first); b and e share one instant.
        ago_s = {"a": 20, "b": 40, "c": 10, "d": 50, "e": 40}
        sessions = [
            (meta(sid, WORK, created_at=1000 + index), one_turn_log(), NOW_MS - ago_s[sid] * 1000)
            for index, sid in enumerate("abcde")
        ]
        await self._store(conformance, sessions)

    async def test_list_page_walks_every_session_once_in_order(self, conformance: ConformanceRig) -> None:
        """Pages of 2 in "recent" order: c a, then b e (a tie, broken by id), then d; the last has no cursor."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsListPage)
        await self._five(conformance)
        async with conformance.open() as p:
            whole = await p.persistence.list_page()
            assert _ids(whole.entries) == ["c", "a", "b", "e", "d"]
            assert whole.next_cursor is None
            pages: list[list[str]] = []
            cursor = None
            for _ in range(5):  # bounded: a cursor that never advances must fail, not hang
                page = await p.persistence.list_page(limit=2, cursor=cursor)
                pages.append(_ids(page.entries))
                cursor = page.next_cursor
                if cursor is None:
                    break
            assert pages == [["c", "a"], ["b", "e"], ["d"]]
            top = await p.persistence.list_page(limit=5)
            assert top.next_cursor is None
            assert [row.updated_at for row in top.entries] == sorted((r.updated_at for r in top.entries), reverse=True)
            assert {_key(row.header)["id"]: _key(row.header) for row in top.entries}["a"] == _key(
                meta("a", WORK, created_at=1000)
            )

    async def test_list_page_created_order(self, conformance: ConformanceRig) -> None:
        """``order="created"`` is newest createdAt first, whatever the activity; paging works the same."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsListPage)
        await self._five(conformance)
        async with conformance.open() as p:
            first = await p.persistence.list_page(limit=3, order="created")
            assert _ids(first.entries) == ["e", "d", "c"]
            assert first.next_cursor is not None
            rest = await p.persistence.list_page(limit=3, order="created", cursor=first.next_cursor)
            assert _ids(rest.entries) == ["b", "a"]
            assert rest.next_cursor is None

    async def test_list_page_filters(self, conformance: ConformanceRig) -> None:
        """cwd (exact), parent and since (activity at or after) filter before the limit."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsListPage)
        other = "/elsewhere/project"
        sessions = [
            (meta("root-1", WORK), one_turn_log(), NOW_MS - 5 * DAY_MS),
            (meta("child-1", WORK, parent_session="root-1"), one_turn_log(), NOW_MS - 1 * DAY_MS),
            (meta("child-2", other, parent_session="root-1"), one_turn_log(), NOW_MS - 2 * DAY_MS),
            (meta("no-cwd"), one_turn_log(), NOW_MS - 3 * DAY_MS),
        ]
        await self._store(conformance, sessions)
        async with conformance.open() as p:
            assert _ids((await p.persistence.list_page(cwd=WORK)).entries) == ["child-1", "root-1"]
            assert _ids((await p.persistence.list_page(cwd=other)).entries) == ["child-2"]
            assert _ids((await p.persistence.list_page(cwd="/no/such/place")).entries) == []
            assert _ids((await p.persistence.list_page(parent="root-1")).entries) == ["child-1", "child-2"]
            since = datetime.fromtimestamp((NOW_MS - 2 * DAY_MS) / 1000, tz=timezone.utc)
            assert _ids((await p.persistence.list_page(since=since)).entries) == ["child-1", "child-2"]
            assert _ids((await p.persistence.list_page(since=NOW_MS - 3 * DAY_MS)).entries) == [
                "child-1",
                "child-2",
                "no-cwd",
            ]
            page = await p.persistence.list_page(limit=1, parent="root-1")
            assert _ids(page.entries) == ["child-1"]
            assert page.next_cursor is not None
            rest = await p.persistence.list_page(limit=1, parent="root-1", cursor=page.next_cursor)
            assert _ids(rest.entries) == ["child-2"]
            assert rest.next_cursor is None

    async def test_list_page_refuses_bad_arguments_and_foreign_cursors(
        self, conformance: ConformanceRig, other_backend_factory: BackendFactory | None
    ) -> None:
        """Bad limits, orders, filters and cursors raise typed errors; a cursor of another query is refused."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsListPage)
        await self._five(conformance)
        async with conformance.open() as p:
            for bad in (0, -1, "3", 2.0, True):
                with pytest.raises(LifecycleArgumentError, match="limit"):
                    await p.persistence.list_page(limit=bad)  # type: ignore[arg-type]
            with pytest.raises(LifecycleArgumentError, match="order"):
                await p.persistence.list_page(order="oldest")
            with pytest.raises(LifecycleArgumentError, match="absolute"):
                await p.persistence.list_page(cwd="relative/dir")
            with pytest.raises(LifecycleArgumentError, match="timezone"):
                await p.persistence.list_page(since=datetime(2026, 1, 1))
            for junk in ("", "not a cursor", "eyJ2IjoyfQ"):
                with pytest.raises(SessionCursorError):
                    await p.persistence.list_page(limit=2, cursor=junk)
            cursor = (await p.persistence.list_page(limit=2)).next_cursor
            assert cursor is not None
            with pytest.raises(SessionCursorError, match="another order or other filters"):
                await p.persistence.list_page(limit=2, cursor=cursor, order="created")
            with pytest.raises(SessionCursorError, match="another order or other filters"):
                await p.persistence.list_page(limit=2, cursor=cursor, cwd=WORK)
            # The limit may change from page to page.
            assert _ids((await p.persistence.list_page(limit=10, cursor=cursor)).entries) == ["b", "e", "d"]
        if other_backend_factory is None:
            pytest.skip("no second storage to take a foreign cursor to")
        other = ConformanceRig(other_backend_factory, conformance._plant)
        async with other.open() as q:
            with pytest.raises(SessionCursorError, match="another storage root"):
                await q.persistence.list_page(limit=2, cursor=cursor)

    # ------------------------------------------------------------------------------------------------------
    # delete

    async def test_delete_is_durable_and_precise(self, conformance: ConformanceRig) -> None:
        """A deleted session is gone after a restart (load, list, list_page); its neighbour is untouched."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsDelete)
        async with conformance.open() as p:
            for sid in ("keep", "drop"):
                await p.persistence.create(meta(sid, WORK))
                await p.persistence.append(sid, one_turn_log())
            await p.persistence.load("drop")  # a cold state in this coordinator must not survive the delete
            await p.persistence.delete("drop")
            with pytest.raises(SessionNotFoundError):
                await p.persistence.load("drop")
            # The same coordinator forgets the id: it can be created afresh right away.
            await p.persistence.create(meta("drop", WORK))
            await p.persistence.append("drop", simple_turn(0, 1))
            assert [e.seq for e in (await p.persistence.load("drop")).events] == [0, 1, 2]
            await p.persistence.delete("drop")
        assert await conformance.stored("drop") is None
        assert await conformance.listed_ids() == ["keep"]
        assert await conformance.stored_events("keep") == one_turn_log()
        async with conformance.open() as p:
            if isinstance(p.backend, SupportsListPage):
                assert _ids((await p.persistence.list_page()).entries) == ["keep"]
            # The id is free again.
            await p.persistence.create(meta("drop", WORK))
            await p.persistence.append("drop", simple_turn(0, 1))
        assert await conformance.stored_events("drop") == simple_turn(0, 1)

    async def test_delete_refusals_change_nothing(self, conformance: ConformanceRig) -> None:
        """Unknown id, live session, stale revision: typed errors, and every stored log is unchanged."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsDelete)
        async with conformance.open() as p:
            await p.persistence.create(meta("cold", WORK))
            await p.persistence.append("cold", one_turn_log())
        before = await conformance.revision("cold")
        async with conformance.open() as p:
            with pytest.raises(SessionNotFoundError):
                await p.persistence.delete("never-stored")
            with pytest.raises(LifecycleArgumentError):
                await p.persistence.delete("")
            with pytest.raises(SessionChangedError):
                await p.persistence.delete("cold", expected_revision="not-the-revision")
            session = p.store.create("live", meta=meta("live", WORK))
            session.append_event(turn_start(0, 1))
            assert await p.store.flush(session) is True
            with pytest.raises(SessionLiveError, match="live"):
                await p.persistence.delete("live")
            assert await conformance.stored_events("live") == [turn_start(0, 1)]
            p.store.dispose(session)
        assert await conformance.revision("cold") == before
        assert await conformance.stored_events("cold") == one_turn_log()

    async def test_a_revision_never_comes_back_after_delete_and_recreate(self, conformance: ConformanceRig) -> None:
        """Deleted, then re-created with the same header and the same batches, a session gets new revisions only:
        a revision read before the delete never matches the new log (a compare-and-swap on it, such as
        ``delete(expected_revision=...)`` or prune's, must not act on a log it never saw)."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsDelete)
        header = meta("again", WORK)
        listed: list[str | None] = []
        read: list[str | None] = []

        async def note() -> None:
            listed.append(await conformance.revision("again"))
            async with conformance.backend() as backend:
                read.append(await backend.read_stored_revision("again"))

        for _round in range(2):
            async with conformance.open() as p:
                await p.persistence.create(header)
                await p.persistence.append("again", one_turn_log())
            await note()
            async with conformance.open() as p:
                await p.persistence.append("again", simple_turn(6, 2))
            await note()
            stale = listed[-1]
            async with conformance.open() as p:
                await p.persistence.delete("again")
        assert None not in listed and None not in read, (listed, read)
        assert len(set(listed)) == len(listed), f"list_snapshots gave a revision back after a re-create: {listed}"
        assert len(set(read)) == len(read), f"read_stored_revision gave a revision back after a re-create: {read}"
        # And the compare-and-swap that a reused revision would fool: a delete with a revision from before.
        async with conformance.open() as p:
            await p.persistence.create(header)
            await p.persistence.append("again", one_turn_log())
            await p.persistence.append("again", simple_turn(6, 2))
            with pytest.raises(SessionChangedError):
                await p.persistence.delete("again", expected_revision=stale)
        assert await conformance.stored_events("again") == one_turn_log() + simple_turn(6, 2)

    async def test_another_writers_lease_refuses_delete_compact_and_prune(self, conformance: ConformanceRig) -> None:
        """A session another writer holds (a second instance over the same storage) is never deleted or
        rewritten: ``SessionLockedError`` names the holder, prune skips it, and the log is unchanged."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsDelete)
            if not isinstance(backend, SupportsWriterLease):
                pytest.skip(f"{type(backend).__name__} has no writer lease")
        async with conformance.open() as p:
            await p.persistence.create(meta("held", WORK))
            await p.persistence.append("held", one_turn_log())
        async with conformance.open() as writer:
            session = writer.store.create("held", seed=one_turn_log(), meta=meta("held", WORK))
            session.append_event(turn_start(len(session.events), 2))
            assert await writer.store.flush(session) is True
            written = list(session.events)
            before = await conformance.revision("held")
            async with conformance.open() as other:
                with pytest.raises(SessionLockedError) as refused:
                    await other.persistence.delete("held")
                assert refused.value.holder
                if isinstance(other.backend, SupportsCompact):
                    with pytest.raises(SessionLockedError):
                        await other.persistence.compact("held")
                if isinstance(other.backend, SupportsListPage):
                    report = await other.persistence.prune(keep_last=0, dry_run=False)
                    assert report.deleted == ()
                    assert [sid for sid, _why in report.skipped] == ["held"]
            assert await conformance.revision("held") == before
            assert await conformance.stored_events("held") == written
            writer.store.dispose(session)


class BackendConformance(_StorageCases, _LiveCases, _FaultAndRaceCases, _WriterCases, LifecycleConformance):
    """Base class of a backend's conformance tests (not collected by itself: its name does not start with Test).

    Its cases come in groups, one module each: the storage contract and read validation, live sessions and torn
    tails, injected failures and races, one writer per session with in-doubt writes and storage-level cases, and
    (from :class:`LifecycleConformance`) deletion, paged listing, retention and compaction; the fixtures and hooks
    a backend overrides are listed in this module's doc.
    """
