"""Conformance cases: the storage contract through the coordinator, format refusal and read validation."""

from __future__ import annotations

import math
from collections.abc import MutableSequence, Sequence
from typing import Any

import anyio
import pytest

from .._host.session import Session
from .._model.codes import TOOL_NOT_STARTED, TOOL_NOT_STARTED_TEXT, TOOL_OUTCOME_UNKNOWN
from .._model.errors import (
    IncompleteInheritedPrefixError,
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionFormatUnsupportedError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
)
from .._model.events import (
    InterruptedReason,
    Message,
    OpaqueEvent,
    TextBlock,
    ToolErrorInfo,
    ToolResult,
    ToolResultBlock,
    TurnEnd,
    UserMessage,
    UserSource,
)
from .._model.header import SESSION_FORMAT_VERSION
from .._wire.codec import event_types
from ._faults import FaultInjectingBackend
from ._logs import (
    WORK,
    assistant_message,
    meta,
    one_turn_log,
    opaque,
    simple_turn,
    step_start,
    tool_call,
    turn_end,
    turn_start,
)
from ._rig import (
    ConformanceRig,
    _ids_of,
    _KitBase,
    _same_header,
    _same_headers,
    _seqs,
)

__all__ = ["_StorageCases"]


class _StorageCases(_KitBase):
    """Conformance cases: the storage contract through the coordinator, format refusal and read validation."""

    # ------------------------------------------------------------------------------------------------------
    # 7.A storage contract

    async def test_round_trip(self, conformance: ConformanceRig) -> None:
        """Create + append, then load in this instance and after a restart."""
        async with conformance.open() as p:
            await p.persistence.create(meta("s1", WORK))
            await p.persistence.append("s1", one_turn_log())
            loaded = await p.persistence.load("s1")
        assert _same_header(loaded.meta, meta("s1", WORK))
        assert loaded.meta.version == SESSION_FORMAT_VERSION
        assert list(loaded.events) == one_turn_log()
        assert loaded.inherited_event_count == 0
        assert await conformance.stored_events("s1") == one_turn_log()
        async with conformance.open() as p:
            reloaded = await p.persistence.load("s1")
        assert _same_header(reloaded.meta, meta("s1", WORK))
        assert list(reloaded.events) == one_turn_log()

    async def test_restart_lists_and_adopts_without_create(self, conformance: ConformanceRig) -> None:
        """A new instance lists the session and appends to it without create/load."""
        async with conformance.open() as p:
            await p.persistence.create(meta("restart", WORK))
            await p.persistence.append("restart", one_turn_log())
        async with conformance.open() as p:
            assert _same_headers(await p.persistence.list(), [meta("restart", WORK)])
            await p.persistence.append("restart", simple_turn(6, 2))
        async with conformance.open() as p:
            loaded = await p.persistence.load("restart")
            snapshots = await p.persistence.list_snapshots()
        assert list(loaded.events) == one_turn_log() + simple_turn(6, 2)
        assert _same_headers([s.header for s in snapshots], [meta("restart", WORK)])

    async def test_header_fields_round_trip(self, conformance: ConformanceRig) -> None:
        """Every optional header field survives list/list_snapshots/load after a restart."""
        header = meta(
            "fields", WORK, parent_session="the-parent", delegation_depth=2, agent_preset="coder", origin="subagent"
        )
        async with conformance.open() as p:
            await p.persistence.create(header)
            await p.persistence.append("fields", one_turn_log())
        async with conformance.open() as p:
            assert _same_headers(await p.persistence.list(), [header])
            assert _same_headers([s.header for s in await p.persistence.list_snapshots()], [header])
            assert _same_header((await p.persistence.load("fields")).meta, header)

    async def test_create_validates_created_at(self, conformance: ConformanceRig) -> None:
        """A bad createdAt is refused and reserves nothing; a valid create of the same id then works."""
        async with conformance.open() as p:
            for bad in (1.5, -1):
                with pytest.raises(TypeError, match="createdAt must be a non-negative safe integer"):
                    await p.persistence.create(meta("created", created_at=bad))  # type: ignore[arg-type]
            await p.persistence.create(meta("created"))
            await p.persistence.append("created", one_turn_log())
            assert (await p.persistence.load("created")).meta.created_at == 1000

    async def test_create_validates_inherited_cut(self, conformance: ConformanceRig) -> None:
        """Seeded needs a cut, unseeded refuses a nonzero one; a seeded cut 0 round-trips."""
        async with conformance.open() as p:
            with pytest.raises(TypeError, match="requires an inherited event count"):
                await p.persistence.create(meta("seeded", is_seeded=True))
            with pytest.raises(TypeError, match="must be 0"):
                await p.persistence.create(meta("unseeded"), inherited_event_count=1)
            with pytest.raises(TypeError, match="non-negative safe integer"):
                await p.persistence.create(meta("seeded", is_seeded=True), inherited_event_count=-1)
            await p.persistence.create(meta("seeded", is_seeded=True), inherited_event_count=0)
            await p.persistence.append("seeded", one_turn_log())
        async with conformance.open() as p:
            loaded = await p.persistence.load("seeded")
        assert loaded.meta.is_seeded is True
        assert loaded.inherited_event_count == 0

    async def test_inherited_prefix_gate(self, conformance: ConformanceRig) -> None:
        """The first materializing batch must reach the cut; a short one leaves nothing listed."""
        async with conformance.open() as p:
            await p.persistence.create(meta("gate", is_seeded=True), inherited_event_count=2)
            with pytest.raises(IncompleteInheritedPrefixError, match="before its inherited prefix is complete"):
                await p.persistence.append("gate", one_turn_log()[:1])
            assert "gate" not in _ids_of(await p.persistence.list())
            assert await conformance.stored("gate") is None
            await p.persistence.append("gate", one_turn_log())
        async with conformance.open() as p:
            loaded = await p.persistence.load("gate")
        assert loaded.inherited_event_count == 2
        assert list(loaded.events) == one_turn_log()

    async def test_interrupted_turn_inspect_never_writes_load_repairs(self, conformance: ConformanceRig) -> None:
        """Inspect shows closers without writing; load commits them and changes the revision."""
        log = [*one_turn_log(), turn_start(6, 2), step_start(7, 2, 1)]
        async with conformance.open() as p:
            await p.persistence.create(meta("open"))
            await p.persistence.append("open", log)
        r0 = await conformance.revision("open")
        assert r0 is not None
        async with conformance.open() as p:
            inspected = await p.persistence.inspect("open")
            assert event_types(inspected.events)[-4:] == ["turn/start", "step/start", "step/end", "turn/end"]
            assert await conformance.revision("open") == r0
            assert await conformance.stored_events("open") == log
            loaded = await p.persistence.load("open")
            assert _seqs(loaded.events) == list(range(10))
            assert event_types(loaded.events)[-4:] == ["turn/start", "step/start", "step/end", "turn/end"]
            last = loaded.events[-1]
            assert isinstance(last, TurnEnd)
            assert last.data.reason == InterruptedReason()
            assert await conformance.revision("open") != r0
            assert await conformance.stored_events("open") == list(loaded.events)
            await p.persistence.append("open", [turn_start(10, 3), turn_end(11, 3)])
        async with conformance.open() as p:
            assert _seqs((await p.persistence.load("open")).events) == list(range(12))

    async def test_repair_tool_not_started(self, conformance: ConformanceRig) -> None:
        """A requested call without a durable tool/call is closed as TOOL_NOT_STARTED."""
        log = [
            *one_turn_log(),
            turn_start(6, 2),
            step_start(7, 2, 1),
            assistant_message(8, "", turn=2, tool_calls=["call-x"]),
        ]
        async with conformance.open() as p:
            await p.persistence.create(meta("not-started"))
            await p.persistence.append("not-started", log)
        async with conformance.open() as p:
            loaded = await p.persistence.load("not-started")
        assert event_types(loaded.events)[9:] == ["tool/result", "step/end", "turn/end"]
        result = loaded.events[9]
        assert isinstance(result, ToolResult)
        assert isinstance(result.data.error, ToolErrorInfo)
        assert result.data.error.code == TOOL_NOT_STARTED
        block = result.data.message.content[0]
        assert isinstance(block, ToolResultBlock)
        assert block.tool_call_id == "call-x"
        assert block.is_error is True
        assert block.content == (TextBlock(text=TOOL_NOT_STARTED_TEXT),)
        assert await conformance.stored_events("not-started") == list(loaded.events)

    async def test_repair_tool_outcome_unknown(self, conformance: ConformanceRig) -> None:
        """A call with a durable tool/call but no result is closed as TOOL_OUTCOME_UNKNOWN."""
        log = [
            *one_turn_log(),
            turn_start(6, 2),
            step_start(7, 2, 1),
            assistant_message(8, "", turn=2, tool_calls=["call-risk"]),
            tool_call(9, "call-risk", turn=2),
        ]
        async with conformance.open() as p:
            await p.persistence.create(meta("unknown-outcome"))
            await p.persistence.append("unknown-outcome", log)
            loaded = await p.persistence.load("unknown-outcome")
        result = loaded.events[10]
        assert isinstance(result, ToolResult)
        assert isinstance(result.data.error, ToolErrorInfo)
        assert (result.data.error.name, result.data.error.code) == ("ToolOutcomeUnknownError", TOOL_OUTCOME_UNKNOWN)
        block = result.data.message.content[0]
        assert isinstance(block, ToolResultBlock)
        text = block.content[0]
        assert isinstance(text, TextBlock)
        assert "retry only if the operation is read-only or idempotent" in text.text
        assert "if it may have side effects, first verify external state or ask the user" in text.text
        session = Session("unknown-outcome", seed=loaded.events)
        results = [m for m in session.derive_messages() if getattr(m.source, "call_id", None) == "call-risk"]
        assert len(results) == 1

    async def test_lazy_create_is_not_listed(self, conformance: ConformanceRig) -> None:
        """Create (and an empty append) writes nothing and lists nothing."""
        async with conformance.open() as p:
            await p.persistence.create(meta("lazy"))
            await p.persistence.append("lazy", [])
            assert "lazy" not in _ids_of(await p.persistence.list())
            assert "lazy" not in [s.header.id for s in await p.persistence.list_snapshots()]
            with pytest.raises(SessionNotFoundError):
                await p.persistence.load("lazy")
        assert await conformance.stored("lazy") is None
        assert await conformance.listed_ids() == []

    async def test_cancelled_scope_does_no_backend_io(self, conformance: ConformanceRig) -> None:
        """An empty store lists nothing; cancelled observations raise cancellation and touch nothing."""
        backend = FaultInjectingBackend(conformance.new_backend())
        async with conformance.open(backend) as p:
            assert await p.persistence.list_snapshots() == []
            assert await p.persistence.list() == []
            calls = dict(backend.calls)
            persistence = p.persistence
            for name, operation in (
                ("list", persistence.list),
                ("list_snapshots", persistence.list_snapshots),
                ("inspect", lambda: persistence.inspect("nope")),
                ("read_from", lambda: persistence.read_from("nope", 0)),
            ):
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    await operation()
                assert scope.cancelled_caught, f"{name} in a cancelled scope did not raise cancellation"
            assert dict(backend.calls) == calls

    async def test_read_from(self, conformance: ConformanceRig) -> None:
        """Detached physical suffixes; beyond the end is empty; no closers; typed argument errors."""
        log = one_turn_log()
        async with conformance.open() as p:
            await p.persistence.create(meta("suffix"))
            await p.persistence.append("suffix", log)
            whole = await p.persistence.read_from("suffix", 0)
            assert (list(whole.events), whole.from_seq, whole.inherited_event_count) == (log, 0, 0)
            assert _same_header(whole.meta, meta("suffix"))
            tail = await p.persistence.read_from("suffix", 3)
            assert list(tail.events) == log[3:]
            assert tail.events[0].seq == 3
            for beyond in (6, 106):
                suffix = await p.persistence.read_from("suffix", beyond)
                assert (list(suffix.events), suffix.from_seq) == ([], beyond)
            await p.persistence.append("suffix", [turn_start(6, 2)])
            assert list((await p.persistence.read_from("suffix", 6)).events) == [turn_start(6, 2)]
            with pytest.raises(SessionNotFoundError):
                await p.persistence.read_from("unknown", 0)
            for bad in (-1, 1.5, True):
                with pytest.raises(TypeError, match="non-negative safe integer"):
                    await p.persistence.read_from("suffix", bad)  # type: ignore[arg-type]

    async def test_revisions(self, conformance: ConformanceRig) -> None:
        """A revision is stable while the log is unchanged and changes with every append."""
        async with conformance.open() as p:
            await p.persistence.create(meta("rev"))
            await p.persistence.append("rev", one_turn_log())

            async def revision() -> str:
                (snapshot,) = [s for s in await p.persistence.list_snapshots() if s.header.id == "rev"]
                assert _same_header(snapshot.header, meta("rev"))
                return snapshot.revision

            r1 = await revision()
            assert await revision() == r1
            await p.persistence.inspect("rev")
            assert await revision() == r1
            await p.persistence.append("rev", simple_turn(6, 2))
            r2 = await revision()
            assert r2 != r1
            await p.persistence.append("rev", simple_turn(9, 3))
            assert await revision() not in (r1, r2)

    async def test_append_seq_mismatch_leaves_storage_unchanged(self, conformance: ConformanceRig) -> None:
        """A restated or gapped batch is refused and nothing changes."""
        async with conformance.open() as p:
            await p.persistence.create(meta("mismatch"))
            await p.persistence.append("mismatch", one_turn_log())
            r0 = await conformance.revision("mismatch")
            with pytest.raises(SeqMismatchError, match="append seq mismatch"):
                await p.persistence.append("mismatch", one_turn_log())
            with pytest.raises(SeqMismatchError, match="expected 6 at index 0, got 7"):
                await p.persistence.append("mismatch", simple_turn(7, 2))
            assert await conformance.revision("mismatch") == r0
            assert await conformance.stored_events("mismatch") == one_turn_log()
            await p.persistence.append("mismatch", simple_turn(6, 2))
        assert await conformance.stored_events("mismatch") == one_turn_log() + simple_turn(6, 2)

    async def test_append_gap_materializes_nothing(self, conformance: ConformanceRig) -> None:
        """A first batch with a seq gap is refused and nothing is materialized."""
        log = one_turn_log()
        async with conformance.open() as p:
            await p.persistence.create(meta("gap"))
            with pytest.raises(SeqMismatchError):
                await p.persistence.append("gap", [log[0], log[2]])
            assert await p.persistence.list() == []
        assert await conformance.stored("gap") is None

    async def test_append_rejects_non_json_data(self, conformance: ConformanceRig) -> None:
        """Values that are not lossless JSON are refused with TypeError; nothing is stored."""
        cyclic: dict[str, Any] = {}
        cyclic["self"] = cyclic
        bad_values: list[object] = [
            math.nan,
            math.inf,
            -math.inf,
            -0.0,
            2**53,
            set(),
            (1, 2),
            b"x",
            object(),
            lambda: None,
            {1: "int key"},
            cyclic,
        ]
        async with conformance.open() as p:
            for index, value in enumerate(bad_values):
                session_id = f"bad-json-{index}"
                await p.persistence.create(meta(session_id))
                batch = [OpaqueEvent(type="plugin/test", seq=0, time=0, data={"value": value}, ignorable=True)]
                with pytest.raises(TypeError, match="losslessly JSON-serializable"):
                    await p.persistence.append(session_id, batch)
            assert await p.persistence.list() == []

    async def test_duplicate_create(self, conformance: ConformanceRig) -> None:
        """Create twice in one instance, and create of a stored id in a new instance, are refused."""
        async with conformance.open() as p:
            await p.persistence.create(meta("dup"))
            with pytest.raises(SessionAlreadyExistsError, match="already exists in this backend"):
                await p.persistence.create(meta("dup"))
            await p.persistence.append("dup", one_turn_log())
        async with conformance.open() as p:
            with pytest.raises(SessionAlreadyExistsError, match="already has a persisted log on disk"):
                await p.persistence.create(meta("dup"))
        assert await conformance.stored_events("dup") == one_turn_log()

    async def test_unknown_id_is_not_found(self, conformance: ConformanceRig) -> None:
        """Load/inspect/read_from of an unknown id raise SessionNotFoundError; the backend says None."""
        async with conformance.open() as p:
            for operation in (p.persistence.load, p.persistence.inspect):
                with pytest.raises(SessionNotFoundError, match='session "ghost" not found') as info:
                    await operation("ghost")
                assert info.value.session_id == "ghost"
                assert isinstance(info.value, LookupError)
        async with conformance.backend() as backend:
            assert await backend.load_stored("ghost") is None
            assert await backend.read_stored_revision("ghost") is None

    async def test_backend_returns_fresh_objects(self, conformance: ConformanceRig) -> None:
        """``load_stored`` returns fresh, unshared objects (the coordinator adopts them in place)."""
        async with conformance.open() as p:
            await p.persistence.create(meta("fresh"))
            await p.persistence.append("fresh", one_turn_log())
        async with conformance.backend() as backend:
            first = await backend.load_stored("fresh")
            assert first is not None
            if isinstance(first.events, MutableSequence):
                first.events.clear()
            second = await backend.load_stored("fresh")
            assert second is not None
            assert second.events == one_turn_log()
            assert second.revision == await backend.read_stored_revision("fresh")

    async def test_loaded_events_are_immutable(self, conformance: ConformanceRig) -> None:
        """Loaded and inspected events are frozen; a later read is unaffected by attempts."""
        async with conformance.open() as p:
            await p.persistence.create(meta("frozen"))
            await p.persistence.append("frozen", one_turn_log())
            for read in (p.persistence.load, p.persistence.inspect):
                view = await read("frozen")
                # An immutable sequence (a tuple, or StoredEvents): nothing a reader holds can be changed in place.
                assert isinstance(view.events, Sequence) and not isinstance(view.events, MutableSequence)
                with pytest.raises(AttributeError):
                    view.events[1].seq = 99  # type: ignore[misc]
                message = view.events[1].data
                with pytest.raises(AttributeError):
                    message.id = "changed"  # type: ignore[union-attr, misc]
            assert list((await p.persistence.load("frozen")).events) == one_turn_log()

    # ------------------------------------------------------------------------------------------------------
    # Format refusal and read validation (planted data)

    async def test_newer_format_is_refused(self, conformance: ConformanceRig) -> None:
        """A header version above ours is refused with an upgrade hint (and the raw path if any)."""
        await conformance.plant(meta("v99", version=99), one_turn_log())
        async with conformance.open() as p:
            for read in (p.persistence.load, p.persistence.inspect):
                with pytest.raises(SessionFormatUnsupportedError, match="newer harness") as info:
                    await read("v99")
                assert "upgrade the harness" in str(info.value)
                location = p.persistence.locate(meta("v99", version=99))
                if location is not None:
                    assert info.value.location == location.path
                    assert location.path in str(info.value)

    async def test_older_format_is_refused(self, conformance: ConformanceRig) -> None:
        """A header version below ours is refused: no upgrade path."""
        await conformance.plant(meta("v-1", version=-1), one_turn_log())
        async with conformance.open() as p:
            with pytest.raises(
                SessionFormatUnsupportedError, match=f"older than the supported v{SESSION_FORMAT_VERSION}"
            ) as info:
                await p.persistence.load("v-1")
        assert "no upgrade path" in str(info.value)

    async def test_unknown_event_type_refused_unless_ignorable(self, conformance: ConformanceRig) -> None:
        """An unknown non-ignorable type is refused on read; an ignorable one is kept verbatim."""
        refused = opaque(6, "future/event", {"x": 1}, ignorable=False)
        kept = opaque(6, "plugin/test", None, ignorable=True)
        await conformance.plant(meta("future"), [*one_turn_log(), refused])
        await conformance.plant(meta("ignorable"), [*one_turn_log(), kept])
        async with conformance.open() as p:
            for read in (p.persistence.load, p.persistence.inspect):
                with pytest.raises(SessionFormatUnsupportedError, match="not marked ignorable") as info:
                    await read("future")
                assert '"future/event"' in str(info.value)
            with pytest.raises(SessionFormatUnsupportedError, match="not marked ignorable"):
                await p.persistence.read_from("future", 0)
            assert (await p.persistence.inspect("ignorable")).events[-1] == kept
            assert list((await p.persistence.read_from("ignorable", 6)).events) == [kept]
            assert list((await p.persistence.load("ignorable")).events) == [*one_turn_log(), kept]

    async def test_stored_invalid_event_is_corruption(self, conformance: ConformanceRig) -> None:
        """A stored event that fails validation makes load/inspect raise corruption, cause chained."""
        # Built as a struct directly: decoding would refuse it, which is exactly what the load must do.
        wrong_role = UserMessage(
            seq=1, time=0, surface_op="append", data=Message(id="u", role="assistant", content=(), source=UserSource())
        )
        await conformance.plant(meta("corrupt"), [turn_start(0, 1), wrong_role, turn_end(2, 1)])
        async with conformance.open() as p:
            for read in (p.persistence.load, p.persistence.inspect):
                with pytest.raises(SessionPersistenceCorruptionError, match="must carry a user message") as info:
                    await read("corrupt")
                assert info.value.__cause__ is not None
        # Nothing was rewritten or dropped: the damaged log is still there, and still refused.
        assert "corrupt" in await conformance.listed_ids()
        async with conformance.open() as p:
            with pytest.raises(SessionPersistenceCorruptionError):
                await p.persistence.load("corrupt")
