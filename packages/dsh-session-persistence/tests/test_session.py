"""Session and SessionStore: session-core §7 scenarios 32-53 and the seq-contiguity property."""

from __future__ import annotations

import logging
from typing import Any

import anyio.lowlevel
import pytest
from dsh.session_persistence._host.fork import SessionForkError
from dsh.session_persistence._host.host import Host, hookimpl
from dsh.session_persistence._host.session import Session, SessionStore
from dsh.session_persistence._model.errors import (
    EventValidationError,
    ReentrantAppendError,
    SessionAlreadyExistsError,
    SessionLifecycleError,
)
from dsh.session_persistence._model.events import SessionEvent
from dsh.session_persistence._model.jsonvalue import NotLosslessJsonError
from dsh.session_persistence._wire.codec import event_to_builtins
from hypothesis import given, settings
from hypothesis import strategies as st

USER = {"id": "u1", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}


def assistant_data(turn: int = 1, step: int = 1, text: str = "hello") -> dict[str, Any]:
    return {
        "turn": turn,
        "step": step,
        "message": {
            "id": f"a-{turn}-{step}",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "source": {"kind": "model", "provider": "mock", "model": "mock"},
        },
    }


def closed_turn(session: Session, turn: int = 1) -> None:
    session.append("turn/start", {"turn": turn})
    session.append("user/message", {**USER, "id": f"u-{turn}"})
    session.append("step/start", {"turn": turn, "step": 1})
    session.append("assistant/message", assistant_data(turn))
    session.append("step/end", {"turn": turn, "step": 1})
    session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


@pytest.fixture
def host() -> Host:
    return Host()


@pytest.fixture
def store(host: Host) -> SessionStore:
    return SessionStore(host, clock=lambda: 1000)


# -- append --------------------------------------------------------------------------------------------------


def test_append_assigns_seq_and_time_and_freezes(store: SessionStore) -> None:
    session = store.create("s1")
    data = {"turn": 1}
    event = session.append("turn/start", data)
    data["turn"] = 99
    assert (event.seq, event.time) == (0, 1000)
    assert event_to_builtins(session.events[0])["data"] == {"turn": 1}
    snapshot = session.events
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    assert len(snapshot) == 1 and len(session.events) == 2
    with pytest.raises(AttributeError):
        event.seq = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    "bad",
    [float("nan"), float("inf"), -0.0, {1, 2}, (1, 2), b"x", {1: "a"}, [1, 2**64, 3], print],
    ids=["nan", "inf", "negzero", "set", "tuple", "bytes", "intkey", "bigint", "callable"],
)
def test_append_rejects_non_json_and_leaves_log_unchanged(store: SessionStore, bad: object) -> None:
    session = store.create("s1")
    with pytest.raises(NotLosslessJsonError, match='"user/message"'):
        session.append("user/message", {**USER, "extra": bad})
    assert session.events == ()


def test_append_surface_metadata_rules(store: SessionStore) -> None:
    session = store.create("s1")
    session.append("turn/start", {"turn": 1})
    with pytest.raises(EventValidationError, match="sourceEventSeqs"):
        session.append("user/message", USER, source_event_seqs=[0, -1])
    with pytest.raises(EventValidationError, match="sourceEventSeqs"):
        session.append("user/message", USER, source_event_seqs=[5])
    with pytest.raises(EventValidationError, match="not surface-eligible"):
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}}, source_event_seqs=[0])
    assert len(session.events) == 1
    event = session.append("user/message", USER, source_event_seqs=[0])
    assert event_to_builtins(event)["surfaceOp"] == "append"


def test_unknown_types_are_accepted_live(store: SessionStore) -> None:
    session = store.create("s1")
    event = session.append("plugin/thing", {"x": [1, 2]})
    assert event.type == "plugin/thing" and event_to_builtins(event)["data"] == {"x": [1, 2]}
    event = session.append("plugin/other", None, ignorable=True)
    assert event_to_builtins(event)["ignorable"] is True


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(["turn", "todo", "plugin", "user"]), max_size=30))
def test_seq_is_always_the_index(kinds: list[str]) -> None:
    session = Session("p", clock=lambda: 7)
    turn = 0
    for kind in kinds:
        if kind == "turn":
            turn += 1
            session.append("turn/start", {"turn": turn})
            session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
        elif kind == "todo":
            session.append("todo/write", {"todos": []})
        elif kind == "plugin":
            session.append("plugin/x", {"n": turn})
        else:
            session.append("user/message", USER)
    assert [e.seq for e in session.events] == list(range(len(session.events)))
    assert session.seq == len(session.events)


# -- observers -----------------------------------------------------------------------------------------------


def test_observer_failures_are_isolated(host: Host, store: SessionStore, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, int]] = []

    class Raising:
        @hookimpl
        def session_event(self, session: Session, event: SessionEvent) -> None:
            raise RuntimeError("observer broke")

    class Reentrant:
        @hookimpl
        def session_event(self, session: Session, event: SessionEvent) -> None:
            if event.type == "turn/start":
                session.append("plugin/echo", {})

    class Recorder:
        @hookimpl
        def session_event(self, session: Session, event: SessionEvent) -> None:
            seen.append((event.type, event.seq))

    host.register(Recorder())
    host.register(Raising())
    host.register(Reentrant())
    session = store.create("s1")
    with caplog.at_level(logging.WARNING):
        event = session.append("turn/start", {"turn": 1})
    assert event.seq == 0 and len(session.events) == 1
    assert seen == [("turn/start", 0)]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("observer broke" in m for m in messages) == 1
    assert sum("session append cannot reenter while another append is being published" in m for m in messages) == 1
    assert all('session "s1": session/event listener threw' in m for m in messages)


def test_reentrant_append_error_type() -> None:
    session = Session("s", clock=lambda: 1)
    errors: list[BaseException] = []

    def observer(s: Session, e: SessionEvent) -> None:
        try:
            s.append("plugin/x", {})
        except ReentrantAppendError as exc:
            errors.append(exc)

    session._observer = observer
    session.append("plugin/y", {})
    assert len(errors) == 1 and len(session.events) == 1


# -- seeds ---------------------------------------------------------------------------------------------------


def test_seed_must_be_contiguous() -> None:
    seed = [
        {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}},
        {"type": "turn/end", "seq": 5, "time": 1, "data": {"turn": 1, "reason": {"kind": "completed"}}},
    ]
    with pytest.raises(EventValidationError, match="contiguous"):
        Session("s", seed=seed)


@pytest.mark.parametrize(
    "envelope",
    [
        {"type": "plugin/x", "seq": 0, "time": 1, "data": {}, "extra": 1},
        {"type": 7, "seq": 0, "time": 1, "data": {}},
        {"type": "plugin/x", "seq": "0", "time": 1, "data": {}},
        {"type": "plugin/x", "seq": 0.5, "time": 1, "data": {}},
        {"type": "plugin/x", "seq": -1, "time": 1, "data": {}},
        {"type": "plugin/x", "seq": 0, "time": "1", "data": {}},
        {"type": "plugin/x", "seq": 0, "time": 0.5, "data": {}},
        {"type": "plugin/x", "seq": 0, "time": 1},
        {"type": "plugin/x", "seq": 0, "time": 1, "data": {}, "ignorable": False},
        {"type": "plugin/x", "seq": 0, "time": 1, "data": {}, "ignorable": "yes"},
    ],
)
def test_seed_envelope_rejections(envelope: dict[str, Any]) -> None:
    with pytest.raises(EventValidationError, match="invalid event envelope"):
        Session("s", seed=[envelope])


def test_seed_ignorable_kept() -> None:
    session = Session("s", seed=[{"type": "plugin/x", "seq": 0, "time": 1, "data": {"a": 1}, "ignorable": True}])
    assert event_to_builtins(session.events[0]) == {
        "type": "plugin/x",
        "seq": 0,
        "time": 1,
        "data": {"a": 1},
        "ignorable": True,
    }


def test_seed_surface_rules() -> None:
    with pytest.raises(EventValidationError, match="requires a surfaceOp marker"):
        Session("s", seed=[{"type": "user/message", "seq": 0, "time": 1, "data": USER}])
    with pytest.raises(EventValidationError, match=r"invalid seed event .* not surface-eligible"):
        Session("s", seed=[{"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}, "surfaceOp": "append"}])


def test_seed_non_json_names_index() -> None:
    with pytest.raises(NotLosslessJsonError, match="seed event at index 0 is not losslessly JSON-serializable"):
        Session("s", seed=[{"type": "plugin/x", "seq": 0, "time": 1, "data": {"x": float("nan")}}])


def test_replay_appends_one_end_seed(store: SessionStore) -> None:
    original = store.create("orig")
    closed_turn(original)
    original.append("plugin/note", {"n": 1})
    replay = Session("r", seed=list(original.events), clock=lambda: 5)
    assert replay.events[: len(original.events)] == original.events
    assert [e.type for e in replay.events[len(original.events) :]] == ["session/end-seed"]
    assert replay.first_live_seq == len(original.events)
    assert replay.derive_messages() == original.derive_messages()
    again = Session("r2", seed=list(replay.events))
    assert again.events == replay.events
    assert again.first_live_seq == len(replay.events)


def test_empty_seed_and_no_seed() -> None:
    seeded = Session("s", seed=[])
    assert [(e.type, e.seq) for e in seeded.events] == [("session/end-seed", 0)]
    assert seeded.first_live_seq == 0
    assert Session("t").events == ()
    reseeded = Session("u", seed=list(seeded.events))
    assert reseeded.events == seeded.events and reseeded.first_live_seq == 1


def test_seed_runs_the_turn_validator() -> None:
    seed = [
        {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}},
        {"type": "turn/start", "seq": 1, "time": 1, "data": {"turn": 2}},
    ]
    with pytest.raises(ValueError, match="still open"):
        Session("s", seed=seed)


def test_non_message_events_never_change_history(store: SessionStore) -> None:
    session = store.create("s")
    closed_turn(session)
    before = session.derive_messages()
    session.append("turn/start", {"turn": 2})
    session.append("step/start", {"turn": 2, "step": 1})
    session.append("assistant/chunk", {"turn": 2, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x"}})
    session.append("plugin/x", {})
    assert session.derive_messages() == before
    assert [m.id for m in before] == ["u-1", "a-1-1"]


# -- header --------------------------------------------------------------------------------------------------


def test_header_is_copied_and_validated(store: SessionStore) -> None:
    meta: dict[str, Any] = {"createdAt": 5, "cwd": "/work"}
    session = store.create("s1", meta=meta)
    meta["cwd"] = "/elsewhere"
    assert session.header.cwd == "/work" and session.header.created_at == 5
    with pytest.raises(ValueError, match="does not match session id"):
        store.create("s2", meta={"id": "other"})
    with pytest.raises(ValueError, match="header version"):
        store.create("s3", meta={"version": 2})
    with pytest.raises(ValueError, match="absolute path"):
        store.create("s4", meta={"cwd": "relative/dir"})
    for field, value, message in [
        ("createdAt", 1.5, "createdAt must be a non-negative safe integer"),
        ("createdAt", -1, "createdAt must be a non-negative safe integer"),
        ("parentSession", 3, "parentSession must be a string"),
        ("origin", "other", 'origin must be "subagent"'),
        ("delegationDepth", -1, "delegationDepth must be a non-negative safe integer"),
        ("agentPreset", 7, "agentPreset must be a string"),
        ("isSeeded", "yes", "isSeeded must be a boolean"),
    ]:
        with pytest.raises(ValueError, match=message):
            store.create("bad", meta={field: value})
    assert [s.id for s in store.list()] == ["s1"]


def test_minimal_header(store: SessionStore) -> None:
    session = store.create("s")
    from dsh.session_persistence._model.header import header_to_builtins

    assert header_to_builtins(session.header) == {"version": 1, "id": "s", "createdAt": 1000, "isSeeded": False}


def test_seeded_header_rules() -> None:
    with pytest.raises(ValueError, match="requires an explicit constructor seed"):
        Session("s", header={"id": "s", "createdAt": 1, "isSeeded": True}, inherited_event_count=0)
    with pytest.raises(ValueError, match="requires an inherited event count"):
        Session("s", header={"id": "s", "createdAt": 1, "isSeeded": True}, seed=[])
    with pytest.raises(ValueError, match="exceeds its event log"):
        Session("s", header={"id": "s", "createdAt": 1, "isSeeded": True}, seed=[], inherited_event_count=1)
    with pytest.raises(ValueError, match="inherited event count must be 0"):
        Session("s", inherited_event_count=2)


# -- store ---------------------------------------------------------------------------------------------------


def test_store_create_mints_ids_and_rejects_duplicates(store: SessionStore) -> None:
    store.create("session-1")
    minted = store.create()
    assert minted.id == "session-2"
    with pytest.raises(SessionAlreadyExistsError, match='session "session-2" already exists'):
        store.create("session-2")
    assert [s.id for s in store.list()] == ["session-1", "session-2"]


def test_created_veto_rolls_back(host: Host, store: SessionStore) -> None:
    disposed: list[str] = []

    class Veto:
        @hookimpl
        def session_created(self, session: Session) -> None:
            raise RuntimeError("no")

        @hookimpl
        def session_disposed(self, session: Session) -> None:
            disposed.append(session.id)

    host.register(Veto())
    with pytest.raises(RuntimeError, match="no"):
        store.create("vetoed")
    assert store.get("vetoed") is None and disposed == ["vetoed"]


@pytest.mark.anyio
async def test_flush_runs_all_and_raises_first_registered(host: Host, store: SessionStore) -> None:
    calls: list[str] = []

    def flusher(name: str, fail: bool) -> object:
        class Flush:
            @hookimpl
            def session_flush(self, session: Session) -> Any:
                async def run() -> None:
                    calls.append(name)
                    if fail:
                        raise RuntimeError(name)

                return run()

        return Flush()

    session = store.create("s")
    assert await store.flush(session) is False
    host.register(flusher("first", True))
    host.register(flusher("second", True))
    host.register(flusher("third", False))
    with pytest.raises(RuntimeError, match=r"^first$"):
        await store.flush(session)
    assert sorted(calls) == ["first", "second", "third"]
    other = Session("detached")
    with pytest.raises(SessionLifecycleError, match='session "detached" is not live in this store'):
        await store.flush(other)


@pytest.mark.anyio
async def test_flush_with_one_running_implementation_still_awaits_it_and_raises_first_registered(
    host: Host, store: SessionStore
) -> None:
    """Implementations that settled when called (``None``, or raised) beside one that runs: the running one is still
    awaited to its end, and the failure raised is the first-registered one, settled or not."""
    calls: list[str] = []

    class Settles:
        def __init__(self, fail: bool) -> None:
            self.fail = fail

        @hookimpl
        def session_flush(self, session: Session) -> None:
            calls.append(f"settled:{self.fail}")
            if self.fail:
                raise RuntimeError("settled")

    class Runs:
        def __init__(self, fail: bool) -> None:
            self.fail = fail

        @hookimpl
        def session_flush(self, session: Session) -> Any:
            async def run() -> None:
                await anyio.lowlevel.checkpoint()
                calls.append(f"ran:{self.fail}")
                if self.fail:
                    raise RuntimeError("ran")

            return run()

    session = store.create("s")
    host.register(Settles(False))
    host.register(Runs(True))
    with pytest.raises(RuntimeError, match=r"^ran$"):
        await store.flush(session)
    host.register(Settles(True))
    with pytest.raises(RuntimeError, match=r"^ran$"):  # the running one registered before the settled failure
        await store.flush(session)
    assert calls == ["settled:False", "ran:True", "settled:False", "settled:True", "ran:True"]


def test_dispose(host: Host, store: SessionStore) -> None:
    disposed: list[str] = []

    class Watch:
        @hookimpl
        def session_disposed(self, session: Session) -> None:
            disposed.append(session.id)

    host.register(Watch())
    session = store.create("s")
    store.dispose(session)
    assert store.get("s") is None and disposed == ["s"]
    with pytest.raises(SessionLifecycleError):
        store.dispose(session)


# -- fork ----------------------------------------------------------------------------------------------------


def test_fork_empty_source(store: SessionStore) -> None:
    source = store.create("src", meta={"cwd": "/w"})
    child = store.fork(source, child_id="child")
    assert [e.type for e in child.events] == ["session/end-seed"]
    assert child.header.parent_session == "src" and child.header.cwd == "/w" and child.header.is_seeded
    assert child.inherited_event_count == 0


def test_fork_after_closed_turn_and_log_only_event(store: SessionStore) -> None:
    source = store.create("src")
    closed_turn(source)
    source.append("plugin/note", {})
    child = store.fork(source, child_id="child")
    assert child.events[: len(source.events)] == source.events
    assert child.events[-1].type == "session/end-seed"
    assert child.inherited_event_count == len(source.events)


def test_fork_boundary_inside_later_open_turn(store: SessionStore) -> None:
    source = store.create("src")
    closed_turn(source)
    closed_turn(source, 2)
    source.append("turn/start", {"turn": 3})
    child = store.fork(source, boundary=5, child_id="child")
    assert [m.id for m in child.derive_messages()] == ["u-1", "a-1-1"]
    with pytest.raises(SessionForkError, match="ends inside open turn 3") as info:
        store.fork(source, child_id="c2")
    assert info.value.code == "OPEN_TURN"


@pytest.mark.parametrize("boundary", [-1, 0.5, 2**53])
def test_fork_boundary_type_errors(store: SessionStore, boundary: Any) -> None:
    source = store.create("src")
    closed_turn(source)
    with pytest.raises(SessionForkError, match="non-negative safe integer") as info:
        store.fork(source, boundary=boundary)
    assert info.value.code == "INVALID_BOUNDARY"


def test_fork_boundary_range_errors(store: SessionStore) -> None:
    empty = store.create("empty")
    with pytest.raises(SessionForkError, match=r'does not exist in session "empty" \(last seq: none\)'):
        store.fork(empty, boundary=0)
    source = store.create("src")
    closed_turn(source)
    with pytest.raises(SessionForkError, match=r"does not exist .* \(last seq: 5\)"):
        store.fork(source, boundary=6)
    assert [s.id for s in store.list()] == ["empty", "src"]


def test_fork_errors_are_persistence_errors_and_still_value_errors(store: SessionStore) -> None:
    """A fork refusal is caught by ``except SessionPersistenceError`` (the library's one base) and, as before, by
    ``except ValueError``; the public name is the same class."""
    import dsh.session_persistence as public

    assert public.SessionForkError is SessionForkError
    source = store.create("src")
    source.append("turn/start", {"turn": 1})
    for base in (public.SessionPersistenceError, ValueError):
        with pytest.raises(base) as info:
            store.fork(source, child_id="child")
        assert type(info.value) is SessionForkError and info.value.code == "OPEN_TURN"
    with pytest.raises(public.SessionPersistenceError) as missing:
        store.fork("missing")
    assert isinstance(missing.value, SessionForkError) and missing.value.code == "SESSION_NOT_FOUND"


def test_fork_source_resolution(store: SessionStore) -> None:
    with pytest.raises(SessionForkError) as info:
        store.fork("missing")
    assert info.value.code == "SESSION_NOT_FOUND"
    with pytest.raises(SessionForkError) as info:
        store.fork(Session("ghost"))
    assert info.value.code == "SESSION_NOT_FOUND"
    store.create("live")
    with pytest.raises(SessionForkError) as info:
        store.fork(Session("live"))
    assert info.value.code == "SESSION_NOT_LIVE"
    src = store.create("src")
    src.append("turn/start", {"turn": 1})
    store.create("taken")
    with pytest.raises(SessionAlreadyExistsError):
        store.fork(src, child_id="taken")


def test_truncate_respects_inherited_prefix(store: SessionStore) -> None:
    source = store.create("src")
    closed_turn(source)
    child = store.fork(source, child_id="child")
    closed_turn(child, 2)
    with pytest.raises(ValueError, match="outside the writable log prefix"):
        child.truncate(3)
    child.truncate(7)
    assert child.seq == 7
    event = child.append("turn/start", {"turn": 2})
    assert event.seq == 7
