"""Lifecycle cases of the conformance kit, second half: compaction and retention (prune), over the part every
lifecycle case shares: the suite hooks (``set_activity``, ``other_backend_factory``, ``lifecycle_required``), the
retention clock and the helpers that store sessions and read their listing.

:class:`~dsh.session_persistence.testing.LifecycleConformance` (the first half: listing and deletion) subclasses
:class:`_RetentionCases` and takes the helpers from here. The shared part lives in this module, not in one of its
own, so the lifecycle cases stack one module over the rig instead of two (``tools/import-graph``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import pytest

from .._backends.listing import SessionListing, SupportsListPage
from .._backends.protocol import (
    SessionBackend,
    StorageMetadata,
    SupportsCompact,
    SupportsDelete,
)
from .._model.errors import (
    LifecycleArgumentError,
    SessionChangedError,
    SessionLiveError,
    SessionNeedsRepairError,
    SessionNotFoundError,
)
from .._model.events import SessionEvent
from .._model.header import SessionHeader, header_to_builtins
from ._logs import WORK, meta, one_turn_log, simple_turn, step_start, turn_start
from ._rig import BackendFactory, ConformanceRig

__all__ = ["DAY_MS", "NOW_MS", "_LifecycleBase", "_RetentionCases", "_ids", "_key", "_listing"]

#: A fixed "now" for retention: 2026-01-31T00:00:00Z, in milliseconds.
NOW_MS = 1_769_817_600_000
DAY_MS = 86_400_000


def _key(header: SessionHeader) -> dict[str, Any]:
    data = header_to_builtins(header)
    data.setdefault("delegationDepth", 0)
    return data


def _ids(rows: Any) -> list[str]:
    return [row.header.id for row in rows]


class _LifecycleBase:
    """What every lifecycle case uses: the hooks a suite may override and the helpers to store sessions."""

    #: Set ``True`` in a suite whose backend must implement every lifecycle primitive.
    lifecycle_required: ClassVar[bool] = False

    @pytest.fixture
    def other_backend_factory(self) -> BackendFactory | None:
        """Override: a factory over another, empty storage (``None`` skips the cross-storage cursor test)."""
        return None

    async def set_activity(self, backend: SessionBackend, session_id: str, updated_at_ms: int) -> None:
        """Override: make ``session_id``'s last activity read as ``updated_at_ms``."""
        pytest.skip("backend cannot set a session's activity time")

    def _need(self, backend: SessionBackend, kind: type) -> None:
        if not isinstance(backend, kind):
            if self.lifecycle_required:
                pytest.fail(f"{type(backend).__name__} must implement {kind.__name__}")
            pytest.skip(f"{type(backend).__name__} does not implement {kind.__name__}")

    async def _store(
        self, conformance: ConformanceRig, sessions: list[tuple[SessionHeader, list[SessionEvent], int]]
    ) -> None:
        """Persist each (header, events, activity ms) through the coordinator, then stamp its activity."""
        async with conformance.open() as p:
            for header, events, _at in sessions:
                await p.persistence.create(header)
                await p.persistence.append(header.id, events)
        async with conformance.backend() as backend:
            for header, _events, at in sessions:
                await self.set_activity(backend, header.id, at)


async def _listing(persistence: Any, session_id: str) -> SessionListing | None:
    if not isinstance(persistence.backend, SupportsListPage):
        return None
    for row in (await persistence.list_page()).entries:
        if row.header.id == session_id:
            row_: SessionListing = row
            return row_
    return None


class _RetentionCases(_LifecycleBase):
    """Compaction and retention cases (collected through ``LifecycleConformance``)."""

    # ------------------------------------------------------------------------------------------------------
    # compact

    async def test_compact_keeps_everything_but_the_batches(self, conformance: ConformanceRig) -> None:
        """Many batches become one: same header, cut and events after a restart; the revision moves."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsCompact)
        header = meta("seeded", WORK, is_seeded=True, parent_session="p", agent_preset="coder")
        log = one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)
        async with conformance.open() as p:
            await p.persistence.create(header, inherited_event_count=6)
            await p.persistence.append("seeded", log[:6])
            for start in (6, 9):
                await p.persistence.append("seeded", log[start : start + 3])
        before = await conformance.revision("seeded")
        async with conformance.open() as p:
            listed_before = await _listing(p.persistence, "seeded")
            result = await p.persistence.compact("seeded")
            assert (result.session_id, result.event_count, result.revision_before) == ("seeded", 12, before)
            assert result.revision_after is not None and result.revision_after != before
            # Still usable in this coordinator after compaction.
            await p.persistence.append("seeded", simple_turn(12, 4))
            listed_after = await _listing(p.persistence, "seeded")
        stored = await conformance.stored("seeded")
        assert stored is not None
        assert _key(stored.meta) == _key(header)
        assert stored.inherited_event_count == 6
        assert list(stored.events) == log + simple_turn(12, 4)
        if listed_before is not None and listed_after is not None:
            assert listed_after.updated_at >= listed_before.updated_at

    async def test_compact_primitive_refuses_a_stale_revision(self, conformance: ConformanceRig) -> None:
        """The backend's own revision check: a log that moved since it was read is never replaced."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsCompact)
        async with conformance.open() as p:
            await p.persistence.create(meta("moving", WORK))
            await p.persistence.append("moving", one_turn_log())
        stored = await conformance.stored("moving")
        assert stored is not None
        async with conformance.open() as p:
            await p.persistence.append("moving", simple_turn(6, 2))  # the log moves on
        before = await conformance.revision("moving")
        async with conformance.backend() as backend:
            assert isinstance(backend, SupportsCompact)
            storage = StorageMetadata(stored.meta, stored.inherited_event_count)
            with pytest.raises(SessionChangedError):
                await backend.compact(storage, stored.events, stored.revision)
        assert await conformance.revision("moving") == before
        assert await conformance.stored_events("moving") == one_turn_log() + simple_turn(6, 2)

    async def test_compact_does_not_count_as_activity(self, conformance: ConformanceRig) -> None:
        """An old session stays old after compaction (retention must still see its real idle time)."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsCompact)
            self._need(backend, SupportsListPage)
        await self._store(conformance, [(meta("old", WORK), one_turn_log() + simple_turn(6, 2), NOW_MS - DAY_MS)])
        async with conformance.open() as p:
            await p.persistence.compact("old")
            (row,) = (await p.persistence.list_page()).entries
        assert row.updated_at == NOW_MS - DAY_MS

    async def test_compact_refusals_change_nothing(self, conformance: ConformanceRig) -> None:
        """An interrupted turn, a live session and an unknown id are refused; nothing is written."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsCompact)
        open_log = [*one_turn_log(), turn_start(6, 2), step_start(7, 2, 1)]
        async with conformance.open() as p:
            await p.persistence.create(meta("open", WORK))
            await p.persistence.append("open", open_log)
        before = await conformance.revision("open")
        async with conformance.open() as p:
            with pytest.raises(SessionNeedsRepairError):
                await p.persistence.compact("open")
            with pytest.raises(SessionNotFoundError):
                await p.persistence.compact("never-stored")
            session = p.store.create("live", meta=meta("live", WORK))
            session.append_event(turn_start(0, 1))
            assert await p.store.flush(session) is True
            live_before = await conformance.revision("live")
            with pytest.raises(SessionLiveError):
                await p.persistence.compact("live")
            assert await conformance.revision("live") == live_before
            p.store.dispose(session)
        assert await conformance.revision("open") == before
        assert await conformance.stored_events("open") == open_log

    # ------------------------------------------------------------------------------------------------------
    # prune

    async def _aged(self, conformance: ConformanceRig) -> None:
        sessions = [(meta(f"s{age}", WORK), one_turn_log(), NOW_MS - age * DAY_MS) for age in (1, 10, 40, 50, 90)]
        await self._store(conformance, sessions)

    async def test_prune_dry_run_reports_and_changes_nothing(self, conformance: ConformanceRig) -> None:
        """The default is a dry run: it names what would go and every log stays."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsListPage)
        await self._aged(conformance)
        before = {sid: await conformance.revision(sid) for sid in ("s1", "s10", "s40", "s50", "s90")}
        async with conformance.open() as p:
            report = await p.persistence.prune(older_than=timedelta(days=30), now=NOW_MS)
        assert report.dry_run is True
        assert _ids(report.selected) == ["s40", "s50", "s90"]
        assert (report.deleted, report.skipped, report.kept) == ((), (), 2)
        assert {sid: await conformance.revision(sid) for sid in before} == before

    async def test_prune_by_age_and_count(self, conformance: ConformanceRig) -> None:
        """older_than removes idle sessions, keep_last protects the most recent N; only those are deleted."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsListPage)
            self._need(backend, SupportsDelete)
        await self._aged(conformance)
        async with conformance.open() as p:
            report = await p.persistence.prune(older_than=timedelta(days=30), keep_last=3, dry_run=False, now=NOW_MS)
            assert report.deleted == ("s50", "s90")
            assert report.kept == 3
            report = await p.persistence.prune(keep_last=1, dry_run=False, now=NOW_MS)
            assert report.deleted == ("s10", "s40")
        assert await conformance.listed_ids() == ["s1"]
        assert await conformance.stored_events("s1") == one_turn_log()

    async def test_prune_skips_live_sessions(self, conformance: ConformanceRig) -> None:
        """A live session selected by the policy is skipped with its reason, never deleted."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsListPage)
            self._need(backend, SupportsDelete)
        await self._aged(conformance)
        async with conformance.open() as p:
            session = p.store.create("s90", seed=one_turn_log(), meta=meta("s90", WORK))
            # Going live writes (the seed's session/end-seed marker), which moves s90's activity to now. Racing
            # that write, the listing sometimes saw s90 as recent and did not select it. So: let the write land,
            # then age s90 again; the live session then writes nothing more and is selected, deterministically.
            await p.store.flush(session)
            async with conformance.backend() as backend:
                await self.set_activity(backend, "s90", NOW_MS - 90 * DAY_MS)
            report = await p.persistence.prune(older_than=timedelta(days=30), dry_run=False, now=NOW_MS)
            assert [row.id for row in report.selected] == ["s40", "s50", "s90"], "the live session was selected"
            assert report.deleted == ("s40", "s50")
            assert [sid for sid, _why in report.skipped] == ["s90"]
            assert "live" in report.skipped[0][1]
            p.store.dispose(session)
        assert sorted(await conformance.listed_ids()) == ["s1", "s10", "s90"]

    async def test_prune_refuses_nonsense_policies(self, conformance: ConformanceRig) -> None:
        """No policy, a non-positive age, a negative count: typed errors, nothing deleted."""
        async with conformance.backend() as backend:
            self._need(backend, SupportsListPage)
        await self._aged(conformance)
        async with conformance.open() as p:
            bad: list[dict[str, Any]] = [
                {},
                {"older_than": timedelta(0)},
                {"older_than": timedelta(days=-1)},
                {"older_than": 30},
                {"keep_last": -1},
                {"keep_last": "2"},
            ]
            for kwargs in bad:
                with pytest.raises(LifecycleArgumentError):
                    await p.persistence.prune(dry_run=False, now=NOW_MS, **kwargs)
        assert len(await conformance.listed_ids()) == 5
