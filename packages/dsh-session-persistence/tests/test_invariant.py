"""The optional invariant companion (dsh.session_persistence.invariant): session-core §2.2 on every append."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from dsh.session_persistence import Host, SessionStore
from dsh.session_persistence.invariant import (
    ENTRY_POINT_GROUP,
    NAME,
    InvariantViolation,
    InvariantViolationError,
    NoRuntimeInvariant,
    TurnInvariantCompanion,
    find_companion,
    load_invariant_companions,
    register,
    watch_new_hosts,
)

ASSISTANT = {
    "id": "a-1-1",
    "role": "assistant",
    "content": [{"type": "text", "text": "hello"}],
    "source": {"kind": "model", "provider": "mock", "model": "mock"},
}
COMPLETED = {"kind": "completed"}


def closed_turn(session: Any, turn: int = 1) -> None:
    session.append("turn/start", {"turn": turn})
    session.append("step/start", {"turn": turn, "step": 1})
    session.append("assistant/message", {"turn": turn, "step": 1, "message": {**ASSISTANT, "id": f"a-{turn}"}})
    session.append("step/end", {"turn": turn, "step": 1})
    session.append("turn/end", {"turn": turn, "reason": COMPLETED})


@pytest.fixture
def host() -> Host:
    return Host()


@pytest.fixture
def companion(host: Host) -> TurnInvariantCompanion:
    return register(host)


@pytest.fixture
def store(host: Host) -> SessionStore:
    return SessionStore(host, clock=lambda: 1000)


def test_step_start_without_turn_start_is_reported_and_the_append_stands(
    companion: TurnInvariantCompanion, store: SessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    session = store.create("broken")
    session.append("user/message", {"id": "u", "role": "user", "content": [], "source": {"kind": "user"}})
    with caplog.at_level(logging.ERROR, logger="dsh.session_persistence.invariant"):
        event = session.append("step/start", {"turn": 1, "step": 1})
    assert session.events[-1] is event and event.seq == 1  # not undone
    [violation] = companion.violations
    assert (violation.session_id, violation.seq, violation.rule) == ("broken", 1, "turn-mismatch")
    assert "step/start names turn 1 but the open turn is None" in violation.message
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert 'session "broken": seq 1 breaks turn/step rule turn-mismatch' in record.getMessage()
    with pytest.raises(InvariantViolationError) as info:
        companion.assert_clean()
    assert info.value.violations == (violation,)
    assert 'session "broken": seq 1 breaks turn/step rule turn-mismatch' in str(info.value)


def test_a_second_turn_start_is_reported(companion: TurnInvariantCompanion, store: SessionStore) -> None:
    session = store.create("twice")
    session.append("turn/start", {"turn": 1})
    session.append("turn/start", {"turn": 2})
    assert len(session.events) == 2
    assert [(v.session_id, v.seq, v.rule) for v in companion.violations] == [("twice", 1, "turn-open")]


def test_a_well_formed_log_records_nothing(companion: TurnInvariantCompanion, store: SessionStore) -> None:
    session = store.create("fine")
    closed_turn(session, 1)
    closed_turn(session, 2)
    session.append("user/message", {"id": "u", "role": "user", "content": [], "source": {"kind": "user"}})
    assert companion.violations == ()
    companion.assert_clean()


def test_only_the_offending_session_is_named(companion: TurnInvariantCompanion, store: SessionStore) -> None:
    good, bad = store.create("good"), store.create("bad")
    good.append("turn/start", {"turn": 1})
    bad.append("step/end", {"turn": 1, "step": 1})
    good.append("step/start", {"turn": 1, "step": 1})
    assert [(v.session_id, v.seq) for v in companion.violations] == [("bad", 0)]


def test_validator_is_seeded_from_the_sessions_events(companion: TurnInvariantCompanion, store: SessionStore) -> None:
    # A resumed/forked session carries history: turn 1 is closed, so the next turn must be 2.
    source = store.create("source")
    closed_turn(source, 1)
    child = store.fork(source)
    child.append("turn/start", {"turn": 1})
    assert [(v.session_id, v.seq, v.rule) for v in companion.violations] == [("session-1", 6, "turn-number")]


def test_registered_after_creation_seeds_on_first_sight(host: Host, store: SessionStore) -> None:
    session = store.create("late")
    session.append("turn/start", {"turn": 1})
    companion = register(host)
    session.append("turn/start", {"turn": 2})
    assert [(v.seq, v.rule) for v in companion.violations] == [(1, "turn-open")]


def test_one_report_per_break_then_truncation_reseeds(companion: TurnInvariantCompanion, store: SessionStore) -> None:
    session = store.create("s")
    session.append("turn/start", {"turn": 1})
    session.append("turn/start", {"turn": 1})  # seq 1: the break
    session.append("turn/end", {"turn": 7, "reason": COMPLETED})  # would cascade; suspended instead
    assert [(v.seq, v.rule) for v in companion.violations] == [(1, "turn-open")]
    session.truncate(1)
    session.append("turn/end", {"turn": 1, "reason": COMPLETED})  # fine again after the re-seed
    assert len(companion.violations) == 1
    session.append("step/start", {"turn": 2, "step": 1})
    assert [(v.seq, v.rule) for v in companion.violations] == [(1, "turn-open"), (2, "turn-mismatch")]


def test_clear_and_dispose(companion: TurnInvariantCompanion, store: SessionStore) -> None:
    session = store.create("s")
    session.append("turn/end", {"turn": 1, "reason": COMPLETED})
    assert companion.violations
    companion.clear()
    companion.assert_clean()
    store.dispose(session)
    again = store.create("s")  # a new session under a reused id starts from a fresh validator
    closed_turn(again)
    companion.assert_clean()


def test_register_is_idempotent_and_refuses_a_foreign_plugin_name(host: Host) -> None:
    first = register(host)
    assert register(host) is first
    assert find_companion(host) is first
    other = Host()
    other.register(object(), name=NAME)
    with pytest.raises(TypeError, match="is taken"):
        register(other)
    assert find_companion(other) is None


def test_the_companion_is_optional_entry_points_do_not_load_it() -> None:
    host = Host()
    host.load_entrypoints()
    assert find_companion(host) is None


def test_load_invariant_companions_registers_every_installed_package(host: Host) -> None:
    loaded = load_invariant_companions(host)
    assert {"session-persistence", "session-checkpoint-policy", "session-persistence-jsonl"} <= set(loaded)
    assert loaded["session-persistence"] is find_companion(host)
    for name in ("session-checkpoint-policy", "session-persistence-jsonl"):
        plugin = loaded[name]
        assert isinstance(plugin, NoRuntimeInvariant)
        assert plugin.reason.startswith("no runtime invariant: ")
        assert plugin.package == "dsh-" + name
        assert host.get_plugin(f"{name}-invariant") is plugin
    assert load_invariant_companions(host) == loaded  # idempotent
    assert ENTRY_POINT_GROUP == "dsh.session.invariants"


def test_watch_new_hosts_registers_on_hosts_built_inside_only() -> None:
    before = Host()
    with watch_new_hosts() as watch:
        inside = Host()
        store = SessionStore(inside)
        store.create("w").append("step/end", {"turn": 1, "step": 1})
    after = Host()
    assert find_companion(before) is None and find_companion(after) is None
    assert watch.companions == [find_companion(inside)]
    assert watch.violations == (InvariantViolation("w", 0, "turn-mismatch", watch.violations[0].message),)
    with pytest.raises(InvariantViolationError, match='session "w": seq 0'):
        watch.assert_clean()


def test_a_conftest_fixture_built_on_the_watch_fails_the_test(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest
        from dsh.session_persistence.invariant import watch_new_hosts

        @pytest.fixture(autouse=True)
        def turn_invariants():
            with watch_new_hosts() as watch:
                yield watch
            watch.assert_clean()
        """
    )
    pytester.makepyfile(
        """
        from dsh.session_persistence import Host, SessionStore

        def test_broken_order():
            session = SessionStore(Host()).create("x")
            session.append("step/start", {"turn": 1, "step": 1})

        def test_fine():
            session = SessionStore(Host()).create("y")
            session.append("turn/start", {"turn": 1})
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(['*session "x": seq 0 breaks turn/step rule turn-mismatch*'])
