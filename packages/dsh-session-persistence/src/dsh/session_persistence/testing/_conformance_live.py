"""Conformance cases: live sessions through the store, optional capabilities, torn tails."""

from __future__ import annotations

import os

import pytest

from .._backends.protocol import RawArtifact, SessionLocation
from .._host.host import Host
from .._host.session import Session
from .._model.errors import (
    LiveTurnOpenError,
    SessionIdCollisionError,
    SessionNotFoundError,
    SessionPersistenceError,
    UnsupportedOperationError,
)
from .._model.events import AssistantChunk, EndSeed, SessionEvent
from .._wire.codec import encode_event, event_types
from ._logs import (
    WORK,
    meta,
    one_turn_log,
    opaque,
    simple_turn,
    step_end,
    step_start,
    turn_end,
    turn_start,
)
from ._rig import (
    NEVER_MS,
    ConformanceRig,
    _append_live,
    _KitBase,
    _same_header,
    _same_headers,
    _seqs,
)

__all__ = ["_LiveCases"]


class _LiveCases(_KitBase):
    """Conformance cases: live sessions through the store, optional capabilities, torn tails."""

    # ------------------------------------------------------------------------------------------------------
    # 7.B live sessions through the store

    async def test_live_session_flush_persists(self, conformance: ConformanceRig) -> None:
        """A live session's events are durable after store.flush."""
        async with conformance.open() as p:
            session = p.store.create("live", meta=meta("live", WORK))
            _append_live(session, one_turn_log())
            assert await p.store.flush(session) is True
            assert await conformance.stored_events("live") == one_turn_log()
            loaded = await p.persistence.load("live")
        assert list(loaded.events) == one_turn_log()
        assert loaded.meta.cwd == WORK

    async def test_write_behind_then_flush(self, conformance: ConformanceRig) -> None:
        """Nothing is written while the window is open; flush writes exactly what was appended."""
        async with conformance.open(delay_ms=NEVER_MS) as p:
            session = p.store.create("behind", meta=meta("behind"))
            _append_live(session, one_turn_log()[:3])
            assert await conformance.stored("behind") is None
            assert await p.store.flush(session) is True
            assert await conformance.stored_events("behind") == one_turn_log()[:3]
            _append_live(session, one_turn_log()[3:])
            assert await p.store.flush(session) is True
            assert await p.store.flush(session) is True
        assert await conformance.stored_events("behind") == one_turn_log()

    async def test_load_of_live_open_turn_refused_then_disposal_drains(self, conformance: ConformanceRig) -> None:
        """Load refuses a live open turn; after the turn closes and disposal, the log loads balanced."""
        log = one_turn_log()
        async with conformance.open() as p:
            session = p.store.create("turning", meta=meta("turning"))
            _append_live(session, log[:1])
            await p.store.flush(session)
            with pytest.raises(LiveTurnOpenError, match="while its live turn is open"):
                await p.persistence.load("turning")
            _append_live(session, log[1:])
            await p.store.flush(session)
            p.store.dispose(session)
            loaded = await p.persistence.load("turning")
        assert list(loaded.events) == log
        assert await conformance.stored_events("turning") == log

    async def test_live_session_without_events_is_not_found(self, conformance: ConformanceRig) -> None:
        """A live session with no events has nothing to load."""
        async with conformance.open() as p:
            p.store.create("empty", meta=meta("empty"))
            with pytest.raises(SessionNotFoundError):
                await p.persistence.load("empty")
        assert await conformance.stored("empty") is None

    async def test_fork_child_keeps_its_cut(self, conformance: ConformanceRig) -> None:
        """A seeded live session stores seed + end-seed with its cut; reads report the cut."""
        header = meta("child", WORK, is_seeded=True, parent_session="root")
        async with conformance.open() as p:
            session = p.store.create("child", seed=one_turn_log(), meta=header, inherited_event_count=6)
            assert await p.store.flush(session) is True
            loaded = await p.persistence.load("child")
            assert loaded.inherited_event_count == 6
            assert list(loaded.events[:6]) == one_turn_log()
            assert isinstance(loaded.events[6], EndSeed)
            revision = await conformance.revision("child")
            assert await p.store.flush(session) is True
            assert await conformance.revision("child") == revision
            assert (await p.persistence.inspect("child")).inherited_event_count == 6
            p.store.dispose(session)
        async with conformance.open() as p:
            reloaded = await p.persistence.load("child")
            suffix = await p.persistence.read_from("child", 3)
        assert reloaded.meta.is_seeded is True
        assert reloaded.inherited_event_count == 6
        assert list(reloaded.events) == list(loaded.events)
        assert (suffix.from_seq, suffix.events[0].seq, suffix.inherited_event_count) == (3, 3, 6)

    async def test_resume_in_a_new_instance(self, conformance: ConformanceRig) -> None:
        """Load in a new process, continue the session live, and persist the continuation."""
        async with conformance.open() as p:
            session = p.store.create("resumed", meta=meta("resumed"))
            _append_live(session, one_turn_log())
            await p.store.flush(session)
            p.store.dispose(session)
        async with conformance.open() as p:
            loaded = await p.persistence.load("resumed")
            session = p.store.create("resumed", seed=loaded.events, meta=loaded.meta)
            assert await p.store.flush(session) is True
            _append_live(session, simple_turn(7, 2))
            assert await p.store.flush(session) is True
        async with conformance.open() as p:
            final = await p.persistence.load("resumed")
        assert _seqs(final.events) == list(range(10))
        assert isinstance(final.events[6], EndSeed)
        assert list(final.events[7:]) == simple_turn(7, 2)

    async def test_close_drains_unflushed_events(self, conformance: ConformanceRig) -> None:
        """Closing the coordinator writes what the window still held."""
        async with conformance.open(delay_ms=NEVER_MS) as p:
            session = p.store.create("drained", meta=meta("drained"))
            _append_live(session, one_turn_log()[:3])
        assert await conformance.stored_events("drained") == one_turn_log()[:3]

    async def test_hot_reload_adopts_live_session(self, conformance: ConformanceRig) -> None:
        """A new coordinator on a running host adopts the live session and its unflushed suffix."""
        host = Host()
        async with conformance.open(host=host) as p:
            session = p.store.create("hot", meta=meta("hot"))
            _append_live(session, one_turn_log())
            await p.store.flush(session)
        _append_live(session, simple_turn(6, 2))
        async with conformance.open(host=host) as p:
            assert await p.store.flush(session) is True
        assert await conformance.stored_events("hot") == one_turn_log() + simple_turn(6, 2)

    async def test_live_session_colliding_with_stored_log(self, conformance: ConformanceRig) -> None:
        """A new live session over another process's stored id fails its flush; storage untouched."""
        async with conformance.open() as p:
            await p.persistence.create(meta("collide"))
            await p.persistence.append("collide", one_turn_log())
        # The refused events stay buffered, so the coordinator's final drain reports the collision again.
        async with conformance.open(drain_failure=SessionIdCollisionError) as p:
            session = p.store.create("collide", meta=meta("collide"))
            _append_live(session, simple_turn(0, 1, "intruder"))
            with pytest.raises(SessionIdCollisionError, match="id collision"):
                await p.store.flush(session)
        assert await conformance.stored_events("collide") == one_turn_log()

    async def test_disposed_empty_session_id_is_reusable(self, conformance: ConformanceRig) -> None:
        """An empty session flushed and disposed leaves the id free for a new session."""
        async with conformance.open() as p:
            first = p.store.create("reuse", meta=meta("reuse"))
            await p.store.flush(first)
            p.store.dispose(first)
            second = p.store.create("reuse", meta=meta("reuse"))
            assert await p.store.flush(second) is True
            _append_live(second, [turn_start(0, 1), turn_end(1, 1)])
            await p.store.flush(second)
            assert _seqs((await p.persistence.load("reuse")).events) == [0, 1]

    async def test_disposal_without_flush_drains(self, conformance: ConformanceRig) -> None:
        """Disposal drains eventually; a later same-id session collides with the stored log."""
        # The successor's init keeps failing, so the coordinator's final drain reports the collision again.
        async with conformance.open(delay_ms=NEVER_MS, drain_failure=SessionIdCollisionError) as p:
            session = p.store.create("retire", meta=meta("retire"))
            _append_live(session, [turn_start(0, 1), turn_end(1, 1)])
            p.store.dispose(session)
            # load waits for the pending retirement (the final drain) before it reads storage.
            assert _seqs((await p.persistence.load("retire")).events) == [0, 1]
            assert await conformance.stored_events("retire") == [turn_start(0, 1), turn_end(1, 1)]
            successor = p.store.create("retire", meta=meta("retire"))
            with pytest.raises(SessionIdCollisionError):
                await p.store.flush(successor)
        assert await conformance.stored_events("retire") == [turn_start(0, 1), turn_end(1, 1)]

    # ------------------------------------------------------------------------------------------------------
    # Optional capabilities

    async def test_ensure_materialized(self, conformance: ConformanceRig) -> None:
        """An empty live session becomes durable and listed (or the capability error is clear)."""
        async with conformance.open() as p:
            session = p.store.create("header-only", meta=meta("header-only"))
            if not callable(getattr(p.backend, "materialize_header", None)):
                with pytest.raises(UnsupportedOperationError, match="cannot materialize an empty session"):
                    await p.persistence.ensure_materialized(session)
                return
            await p.persistence.ensure_materialized(session)
            await p.persistence.ensure_materialized(session)
            assert _same_headers(await p.persistence.list(), [meta("header-only")])
            loaded = await p.persistence.load("header-only")
            assert _same_header(loaded.meta, meta("header-only"))
            assert (loaded.inherited_event_count, list(loaded.events)) == (0, [])
        assert await conformance.stored_events("header-only") == []
        assert await conformance.listed_ids() == ["header-only"]

    async def test_truncate(self, conformance: ConformanceRig) -> None:
        """Durable turn-tail deletion first, then the live cut; bounds and ownership checked."""
        async with conformance.open() as p:
            session = p.store.create("cut", meta=meta("cut"))
            _append_live(session, one_turn_log() + simple_turn(6, 2))
            await p.store.flush(session)
            if not self._truncate_supported(p.backend):
                with pytest.raises(UnsupportedOperationError, match="does not support destructive session deletion"):
                    await p.persistence.truncate(session, 6)
                return
            r0 = await conformance.revision("cut")
            with pytest.raises(ValueError, match="outside the writable log prefix"):
                await p.persistence.truncate(session, 100)
            with pytest.raises(SessionPersistenceError, match="not owned by this persistence coordinator"):
                await p.persistence.truncate(Session("stranger", header=meta("stranger")), 0)
            await p.persistence.truncate(session, 6)
            assert await conformance.stored_events("cut") == one_turn_log()
            assert await conformance.revision("cut") != r0
            session.truncate(6)
            _append_live(session, simple_turn(6, 2, "again"))
            await p.store.flush(session)
        assert await conformance.stored_events("cut") == one_turn_log() + simple_turn(6, 2, "again")

    async def test_read_raw(self, conformance: ConformanceRig) -> None:
        """Raw artifacts when supported (None when absent), else the capability error."""
        async with conformance.open() as p:
            await p.persistence.create(meta("raw", WORK))
            await p.persistence.append("raw", one_turn_log())
            if not getattr(p.backend, "supports_raw_artifacts", False):
                assert p.persistence.supports_raw_artifacts is False
                with pytest.raises(UnsupportedOperationError, match="does not expose raw artifacts"):
                    await p.persistence.read_raw("raw")
                return
            raw = await p.persistence.read_raw("raw")
            assert isinstance(raw, RawArtifact)
            assert _same_header(raw.meta, meta("raw", WORK))
            assert raw.inherited_event_count == 0
            assert raw.filename
            assert "one-turn-assistant" in raw.content
            assert await p.persistence.read_raw("absent") is None

    async def test_read_raw_is_the_stored_text(self, conformance: ConformanceRig) -> None:
        """The raw artifact is the text the backend stores, not a rendering of it: every stored event's wire
        line (``encode_event``; packed ``assistant/chunk`` rows aside) is in it byte for byte and in seq order,
        a later batch is in the next read, and nothing of another session is."""
        # Non-ASCII text, a line separator and a payload whose key order is not sorted: a re-encoding (other
        # separators, ASCII escapes, sorted keys) of what is stored cannot reproduce these bytes.
        marker = "raw-\u00e9t\u00e9 \u2603 \u2028 line"
        log = [
            *one_turn_log(),
            opaque(6, "x-kit/raw-probe", {"zeta": [1, 2.5, "\u00e9"], "alpha": marker}, ignorable=True),
        ]
        async with conformance.open() as p:
            if not getattr(p.backend, "supports_raw_artifacts", False):
                pytest.skip(f"{type(p.backend).__name__} does not expose raw artifacts")
            for sid, events in (("raw", log), ("raw-other", simple_turn(0, 1, "other-session-only-text"))):
                await p.persistence.create(meta(sid, WORK))
                await p.persistence.append(sid, events)
            await _assert_raw_holds_stored_lines(conformance, p.persistence, "raw")
            await p.persistence.append("raw", simple_turn(7, 2, "a later batch"))
            raw = await _assert_raw_holds_stored_lines(conformance, p.persistence, "raw")
            assert "other-session-only-text" not in raw.content, "read_raw returned another session's text"

    async def test_locate_is_a_pure_hint(self, conformance: ConformanceRig) -> None:
        """Locate does no I/O and creates nothing; a location is an absolute path."""
        async with conformance.open() as p:
            location = p.persistence.locate(meta("where", WORK))
            if location is not None:
                assert isinstance(location, SessionLocation)
                assert os.path.isabs(location.path)
            assert await p.persistence.list() == []
        assert await conformance.stored("where") is None

    # ------------------------------------------------------------------------------------------------------
    # Torn tails (needs ``inject_torn_tail``)

    async def test_torn_tail_inspect_leaves_it_load_repairs(self, conformance: ConformanceRig) -> None:
        """Inspect leaves a torn tail alone; load truncates it, closes the turn; appends continue."""
        log = [*one_turn_log(), turn_start(6, 2), step_start(7, 2, 1)]
        async with conformance.open() as p:
            await p.persistence.create(meta("torn"))
            await p.persistence.append("torn", log)
        async with conformance.backend() as backend:
            await self.inject_torn_tail(backend, "torn")
        torn = await conformance.stored("torn")
        assert torn is not None
        assert torn.torn_marker is not None, "inject_torn_tail left no torn marker"
        assert torn.events == log
        async with conformance.open() as p:
            inspected = await p.persistence.inspect("torn")
            assert _seqs(inspected.events) == list(range(10))
            after_inspect = await conformance.stored("torn")
            assert after_inspect is not None and after_inspect.torn_marker is not None
            assert after_inspect.revision == torn.revision
            loaded = await p.persistence.load("torn")
            assert _seqs(loaded.events) == list(range(10))
            assert event_types(loaded.events)[-2:] == ["step/end", "turn/end"]
            repaired = await conformance.stored("torn")
            assert repaired is not None and repaired.torn_marker is None
            assert repaired.events == list(loaded.events)
            await p.persistence.append("torn", [turn_start(10, 3), turn_end(11, 3)])
        async with conformance.open() as p:
            assert _seqs((await p.persistence.load("torn")).events) == list(range(12))

    async def test_torn_tail_after_balanced_log_is_dropped(self, conformance: ConformanceRig) -> None:
        """A torn tail after a balanced log: load drops it and adds nothing; committed events are kept."""
        async with conformance.open() as p:
            await p.persistence.create(meta("torn-closed"))
            await p.persistence.append("torn-closed", one_turn_log())
        async with conformance.backend() as backend:
            await self.inject_torn_tail(backend, "torn-closed")
        async with conformance.open() as p:
            assert list((await p.persistence.load("torn-closed")).events) == one_turn_log()
        stored = await conformance.stored("torn-closed")
        assert stored is not None and stored.torn_marker is None
        assert stored.events == one_turn_log()

    async def test_torn_tail_hot_reload_truncates_only(self, conformance: ConformanceRig) -> None:
        """Adopting a live session over a torn tail truncates it and never closes the live turn."""
        host = Host()
        async with conformance.open(host=host) as p:
            session = p.store.create("torn-live", meta=meta("torn-live"))
            _append_live(session, [turn_start(0, 1), step_start(1, 1, 1)])
            await p.store.flush(session)
        async with conformance.backend() as backend:
            await self.inject_torn_tail(backend, "torn-live")
        async with conformance.open(host=host) as p:
            _append_live(session, [step_end(2, 1, 1), turn_end(3, 1)])
            assert await p.store.flush(session) is True
        stored = await conformance.stored("torn-live")
        assert stored is not None and stored.torn_marker is None
        assert stored.events == [turn_start(0, 1), step_start(1, 1, 1), step_end(2, 1, 1), turn_end(3, 1)]


async def _assert_raw_holds_stored_lines(
    conformance: ConformanceRig, persistence: object, session_id: str
) -> RawArtifact:
    """``read_raw`` holds the wire line of every stored event verbatim, in seq order; returns the artifact."""
    stored: list[SessionEvent] | None = await conformance.stored_events(session_id)
    assert stored, f'nothing stored for "{session_id}"'
    raw = await persistence.read_raw(session_id)  # type: ignore[attr-defined]
    assert isinstance(raw, RawArtifact)
    position = 0
    for event in stored:
        if type(event) is AssistantChunk:
            continue  # a backend may pack runs of deltas into chunk rows
        line = encode_event(event).decode()
        found = raw.content.find(line, position)
        assert found >= 0, (
            f"read_raw does not hold the stored bytes of event {event.seq} verbatim (at or after offset "
            f"{position}): expected {line!r} in {raw.content!r}"
        )
        position = found + len(line)
    return raw
