"""``BackendConformance``: the storage-contract and host scenarios every backend must pass.

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
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from typing import Any, ClassVar

import anyio
import pytest

from .._backend import RawArtifact, SessionBackend, SessionLocation, StorageMetadata
from .._errors import (
    IncompleteInheritedPrefixError,
    LiveTurnOpenError,
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionFormatUnsupportedError,
    SessionIdCollisionError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionStorageError,
    SessionWriteInDoubtError,
    UnsupportedOperationError,
)
from .._event_codec import event_types
from .._events import (
    EndSeed,
    InterruptedReason,
    Message,
    OpaqueEvent,
    SessionEvent,
    TextBlock,
    ToolErrorInfo,
    ToolResult,
    ToolResultBlock,
    TurnEnd,
    UserMessage,
    UserSource,
)
from .._header import SESSION_FORMAT_VERSION, SessionHeader, header_to_builtins
from .._host import Host
from .._repair import TOOL_NOT_STARTED, TOOL_NOT_STARTED_TEXT, TOOL_OUTCOME_UNKNOWN
from .._session import Session
from ._conformance_writers import WriterConformance
from ._faults import FaultInjectingBackend, InjectedFault
from ._lifecycle_conformance import LifecycleConformance
from ._logs import (
    WORK,
    assistant_message,
    meta,
    one_turn_log,
    opaque,
    simple_turn,
    step_end,
    step_start,
    tool_call,
    turn_end,
    turn_start,
)
from ._rig import NEVER_MS, BackendFactory, ConformanceRig, Opened, backend_name_and_options
from .fixtures import ANYIO_BACKENDS

__all__ = ["BackendConformance"]

_ids = itertools.count()


def _seqs(events: Sequence[SessionEvent]) -> list[int]:
    return [e.seq for e in events]


def _append_live(session: Session, events: Sequence[SessionEvent]) -> None:
    for e in events:
        session.append_event(e)


def _header_key(header: SessionHeader) -> dict[str, Any]:
    # Absent and 0 both mean "top level"; a backend may always write the depth (JSONL does, spec/jsonl.md).
    key = header_to_builtins(header)
    key.setdefault("delegationDepth", 0)
    return key


def _same_header(left: SessionHeader, right: SessionHeader) -> bool:
    """Header equality modulo ``delegationDepth`` absent == 0."""
    return _header_key(left) == _header_key(right)


def _same_headers(left: Sequence[SessionHeader], right: Sequence[SessionHeader]) -> bool:
    return [_header_key(h) for h in left] == [_header_key(h) for h in right]


def _ids_of(headers: Sequence[Any]) -> list[str]:
    return [h.id for h in headers]


class BackendConformance(WriterConformance, LifecycleConformance):
    """Base class of a backend's conformance tests (not collected by itself: its name does not start with Test).

    The one-writer, in-doubt and storage-level cases come from
    :class:`~dsh.session_persistence.testing._conformance_writers.WriterConformance`; deletion, paged listing,
    retention and compaction from the lifecycle mixin.
    """

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    #: ``None`` detects the optional ``rewrite`` primitive; set ``False`` to assert the unsupported error.
    supports_truncate: ClassVar[bool | None] = None
    #: Examples the hypothesis property test runs per async backend.
    property_max_examples: ClassVar[int] = 25

    # ------------------------------------------------------------------------------------------------------
    # Fixtures and hooks a subclass provides or overrides

    @pytest.fixture(scope="class", params=ANYIO_BACKENDS)
    @classmethod
    def anyio_backend(cls, request: pytest.FixtureRequest) -> Any:
        """Every async test runs on asyncio (debug mode) and trio."""
        return request.param

    @pytest.fixture
    def backend_factory(self) -> BackendFactory:
        """Override: return a zero-argument callable building a new backend instance over one empty storage."""
        pytest.fail(f"{type(self).__name__} must override the backend_factory fixture")

    @pytest.fixture
    def conformance(self, backend_factory: BackendFactory) -> ConformanceRig:
        """The rig every kit test uses (built from ``backend_factory`` and ``plant_raw``)."""
        return ConformanceRig(backend_factory, self.plant_raw)

    async def inject_torn_tail(self, backend: SessionBackend, session_id: str) -> None:
        """Override: append a never-committed fragment after the stored log of ``session_id``."""
        pytest.skip("backend cannot inject torn tails")

    async def plant_raw(
        self, backend: SessionBackend, storage: StorageMetadata, events: Sequence[SessionEvent]
    ) -> None:
        """Store ``storage`` and ``events`` verbatim (headers and events a reader must refuse).

        The default uses the backend's own first-batch ``append_batch``; override it if the backend validates
        what it writes, or skip.
        """
        await backend.append_batch(storage, list(events), False)

    def _truncate_supported(self, backend: SessionBackend) -> bool:
        if self.supports_truncate is None:
            return callable(getattr(backend, "rewrite", None))
        return self.supports_truncate

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
                assert isinstance(view.events, tuple)
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

    # ------------------------------------------------------------------------------------------------------
    # Injected write failures (FaultInjectingBackend)

    async def test_failed_append_changes_nothing_and_can_be_retried(self, conformance: ConformanceRig) -> None:
        """A failed first batch materializes nothing; a failed later batch leaves the cursor; retries succeed.

        The failure surfaces as a :class:`SessionStorageError` with the backend's error chained (never a bare
        ``OSError``), after the coordinator read the stored state back and found nothing of the batch.
        """
        backend = FaultInjectingBackend(conformance.new_backend())
        async with conformance.open(backend) as p:
            await p.persistence.create(meta("retry"))
            backend.fail_appends(1)
            with pytest.raises(SessionStorageError) as info:
                await p.persistence.append("retry", one_turn_log())
            assert isinstance(info.value.__cause__, InjectedFault)
            assert await p.persistence.list() == []
            assert await conformance.stored("retry") is None
            await p.persistence.append("retry", one_turn_log())
            backend.fail_appends(1)
            with pytest.raises(SessionStorageError):
                await p.persistence.append("retry", simple_turn(6, 2))
            assert await conformance.stored_events("retry") == one_turn_log()
            await p.persistence.append("retry", simple_turn(6, 2))
        assert await conformance.stored_events("retry") == one_turn_log() + simple_turn(6, 2)

    async def test_failed_flush_retains_events_until_retry(self, conformance: ConformanceRig) -> None:
        """A failed flush loses nothing acknowledged and keeps the batch; the next flush writes it in order."""
        backend = FaultInjectingBackend(conformance.new_backend())
        async with conformance.open(backend, delay_ms=NEVER_MS) as p:
            session = p.store.create("retained", meta=meta("retained"))
            _append_live(session, one_turn_log())
            await p.store.flush(session)
            backend.fail_appends(1)
            _append_live(session, simple_turn(6, 2))
            with pytest.raises(SessionStorageError):
                await p.store.flush(session)
            assert await conformance.stored_events("retained") == one_turn_log()
            _append_live(session, simple_turn(9, 3))
            assert await p.store.flush(session) is True
            assert backend.append_failures == 1
        assert await conformance.stored_events("retained") == one_turn_log() + simple_turn(6, 2) + simple_turn(9, 3)

    async def test_background_write_failure_is_retained(self, conformance: ConformanceRig) -> None:
        """A failed background write keeps its events; an explicit flush writes them, nothing lost or doubled."""
        backend = FaultInjectingBackend(conformance.new_backend())
        async with conformance.open(backend, delay_ms=1) as p:
            session = p.store.create("background", meta=meta("background"))
            backend.fail_appends(1)
            _append_live(session, one_turn_log())

            with anyio.fail_after(10):  # a safety net, never a timing assertion
                await backend.wait_for_append_failures(1)
            assert await p.store.flush(session) is True
        assert await conformance.stored_events("background") == one_turn_log()

    async def test_lost_acknowledgement_after_durable_write(self, conformance: ConformanceRig) -> None:
        """A batch the backend made durable survives a crash that lost the acknowledgement."""
        backend = FaultInjectingBackend(conformance.new_backend())
        async with conformance.open(backend, delay_ms=NEVER_MS, drain_failure=SessionStorageError) as p:
            session = p.store.create("unacked", meta=meta("unacked"))
            _append_live(session, one_turn_log())
            await p.store.flush(session)
            backend.fail_appends(1, when="after")
            backend.fail_reads(None)  # and the process is gone: the read-back cannot settle it either
            backend.fail_appends(None)
            _append_live(session, simple_turn(6, 2))
            with pytest.raises(SessionWriteInDoubtError):
                await p.store.flush(session)
        async with conformance.open() as p:
            loaded = await p.persistence.load("unacked")
        assert list(loaded.events) == one_turn_log() + simple_turn(6, 2)

    # ------------------------------------------------------------------------------------------------------
    # Concurrency and same-id races

    async def test_concurrent_appends_across_sessions(self, conformance: ConformanceRig) -> None:
        """Appends to different sessions run concurrently; each log stays whole and contiguous."""
        ids = [f"parallel-{n}" for n in range(8)]
        expected = {sid: [e for t in range(4) for e in simple_turn(3 * t, t + 1, f"{sid}-{t}")] for sid in ids}
        async with conformance.open() as p:

            async def writer(sid: str) -> None:
                await p.persistence.create(meta(sid))
                log = expected[sid]
                for start in range(0, len(log), 3):
                    await p.persistence.append(sid, log[start : start + 3])

            async with anyio.create_task_group() as tg:
                for sid in ids:
                    tg.start_soon(writer, sid)
        assert sorted(await conformance.listed_ids()) == sorted(ids)
        for sid in ids:
            assert await conformance.stored_events(sid) == expected[sid]

    async def test_concurrent_live_sessions_flush(self, conformance: ConformanceRig) -> None:
        """Live sessions flushing at the same time never mix or lose events."""
        async with conformance.open() as p:
            sessions = [p.store.create(f"live-{n}", meta=meta(f"live-{n}")) for n in range(5)]

            async def run(session: Session) -> None:
                for turn in range(1, 4):
                    _append_live(session, simple_turn(session.seq, turn, f"{session.id}-{turn}"))
                    await p.store.flush(session)

            async with anyio.create_task_group() as tg:
                for session in sessions:
                    tg.start_soon(run, session)
        for session in sessions:
            assert await conformance.stored_events(session.id) == list(session.events)

    async def test_same_id_race_between_instances(self, conformance: ConformanceRig) -> None:
        """Two processes materialize one id: the first wins, the second gets an error, nothing is overwritten."""
        winner = one_turn_log()
        loser = simple_turn(0, 1, "loser")
        async with conformance.open() as first, conformance.open() as second:
            await first.persistence.create(meta("race"))
            await second.persistence.create(meta("race"))
            await first.persistence.append("race", winner)
            with pytest.raises(SessionPersistenceError):
                await second.persistence.append("race", loser)
        assert await conformance.stored_events("race") == winner
        assert await conformance.listed_ids() == ["race"]

    async def test_same_id_concurrent_race(self, conformance: ConformanceRig) -> None:
        """Two processes materialize one id at the same time: exactly one wins and its log is stored whole."""
        batches = {"a": one_turn_log(), "b": simple_turn(0, 1, "other")}
        outcomes: dict[str, BaseException | None] = {}
        async with conformance.open() as a, conformance.open() as b:
            opened = {"a": a, "b": b}

            async def materialize(name: str) -> None:
                try:
                    await opened[name].persistence.append("contended", batches[name])
                except SessionPersistenceError as exc:
                    outcomes[name] = exc
                else:
                    outcomes[name] = None

            for p in opened.values():
                await p.persistence.create(meta("contended"))
            async with anyio.create_task_group() as tg:
                tg.start_soon(materialize, "a")
                tg.start_soon(materialize, "b")
        winners = [name for name, error in outcomes.items() if error is None]
        assert len(winners) == 1, f"expected exactly one winner, got outcomes {outcomes}"
        assert await conformance.stored_events("contended") == batches[winners[0]]

    async def test_same_id_live_race(self, conformance: ConformanceRig) -> None:
        """Two live sessions with one id in two processes: one flush wins, the other fails, no mixing."""
        logs = {"a": one_turn_log(), "b": simple_turn(0, 1, "other")}
        outcomes: dict[str, BaseException | None] = {}
        async with conformance.open() as a, conformance.open() as b:
            opened: dict[str, Opened] = {"a": a, "b": b}
            sessions = {name: p.store.create("twin", meta=meta("twin")) for name, p in opened.items()}
            for name, session in sessions.items():
                _append_live(session, logs[name])

            async def flush(name: str) -> None:
                try:
                    await opened[name].store.flush(sessions[name])
                except SessionPersistenceError as exc:
                    outcomes[name] = exc
                else:
                    outcomes[name] = None

            async with anyio.create_task_group() as tg:
                tg.start_soon(flush, "a")
                tg.start_soon(flush, "b")
            winners = [name for name, error in outcomes.items() if error is None]
            assert len(winners) == 1, f"expected exactly one winner, got outcomes {outcomes}"
            for name, p in opened.items():
                if name not in winners:
                    p.drain_failure = SessionPersistenceError  # its refused events stay buffered
        assert await conformance.stored_events("twin") == logs[winners[0]]

    async def test_same_id_header_materialization_race(self, conformance: ConformanceRig) -> None:
        """Two processes materialize the same empty session: one header is stored, the other is refused."""
        first_meta = meta("hdr-race", WORK)
        async with conformance.open() as a, conformance.open() as b:
            if not callable(getattr(a.backend, "materialize_header", None)):
                pytest.skip("backend has no materialize_header")
            first = a.store.create("hdr-race", meta=first_meta)
            second = b.store.create("hdr-race", meta=meta("hdr-race", WORK, created_at=2000))
            # Both processes finish initializing (each sees no artifact) before either materializes. Without
            # this the test would race: a process that initializes after the header exists legitimately adopts
            # it (same cwd and cut: hot-reload adoption), which is not the conflict this test is about.
            await a.store.flush(first)
            await b.store.flush(second)
            await a.persistence.ensure_materialized(first)
            with pytest.raises(SessionPersistenceError):
                await b.persistence.ensure_materialized(second)
        stored = await conformance.stored("hdr-race")
        assert stored is not None and _same_header(stored.meta, first_meta)
        assert await conformance.listed_ids() == ["hdr-race"]

    # ------------------------------------------------------------------------------------------------------
    # Property: seq contiguity and round trip over random batch splits (hypothesis, imported lazily)

    def test_property_random_batch_splits_round_trip(self, conformance: ConformanceRig, anyio_backend: Any) -> None:
        """Any split of a log into batches stores it whole and contiguous; a restart reads it back exactly."""
        pytest.importorskip("hypothesis")
        from hypothesis import given, settings
        from hypothesis import strategies as st

        json_scalar = st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**53) + 1, 2**53 - 1),
            st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0 or math.copysign(1, f) > 0),
            st.text(max_size=12),
        )
        json_value = st.recursive(
            json_scalar,
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
            max_leaves=8,
        )
        entry = st.one_of(st.text(max_size=24).map(lambda t: ("turn", t)), json_value.map(lambda v: ("blob", v)))
        name, options = backend_name_and_options(anyio_backend)

        async def round_trip(session_id: str, log: list[SessionEvent], cuts: list[int], from_seq: int) -> None:
            bounds = [0, *cuts, len(log)]
            async with conformance.open() as p:
                await p.persistence.create(meta(session_id))
                for start, stop in itertools.pairwise(bounds):
                    await p.persistence.append(session_id, log[start:stop])
            stored = await conformance.stored_events(session_id)
            assert stored is not None
            assert _seqs(stored) == list(range(len(log)))
            assert stored == log
            async with conformance.open() as p:
                loaded = await p.persistence.load(session_id)
                suffix = await p.persistence.read_from(session_id, from_seq)
            assert list(loaded.events) == log
            assert list(suffix.events) == log[from_seq:]

        with anyio.from_thread.start_blocking_portal(name, options) as portal:

            @settings(max_examples=self.property_max_examples, deadline=None, database=None)
            @given(entries=st.lists(entry, min_size=1, max_size=8), data=st.data())
            def check(entries: list[tuple[str, Any]], data: Any) -> None:
                log: list[SessionEvent] = []
                for kind, value in entries:
                    if kind == "turn":
                        log += simple_turn(len(log), sum(isinstance(e, TurnEnd) for e in log) + 1, value)
                    else:
                        log.append(
                            OpaqueEvent(type="plugin/blob", seq=len(log), time=7, data={"v": value}, ignorable=True)
                        )
                cuts = sorted(data.draw(st.sets(st.integers(1, len(log) - 1))) if len(log) > 1 else set())
                from_seq = data.draw(st.integers(0, len(log) + 2))
                portal.call(round_trip, f"prop-{next(_ids)}", log, cuts, from_seq)

            check()
