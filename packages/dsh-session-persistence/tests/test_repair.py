"""Crash repair: session-core §7 scenarios 1-13 and the repair-balance property."""

from __future__ import annotations

from typing import Any

import msgspec
from dsh.session_persistence._model.events import SessionEvent
from dsh.session_persistence._model.repair import (
    TOOL_NOT_STARTED_TEXT,
    TOOL_OUTCOME_UNKNOWN_TEXT,
    has_open_turn,
    interrupted_turn_closers,
)
from dsh.session_persistence._model.validator import validate_turns
from dsh.session_persistence._wire.codec import decode_event, event_to_builtins
from hypothesis import given, settings
from hypothesis import strategies as st


def ev(etype: str, seq: int, data: Any, time: int = 0, **extra: Any) -> SessionEvent:
    return decode_event({"type": etype, "seq": seq, "time": time, "data": data, **extra})


def assistant(seq: int, turn: int, step: int, *call_ids: str, time: int = 0) -> SessionEvent:
    content: list[dict[str, Any]] = [{"type": "text", "text": "working"}]
    content += [{"type": "tool-call", "id": c, "name": "t", "arguments": "{}"} for c in call_ids]
    message = {
        "id": f"a-{seq}",
        "role": "assistant",
        "content": content,
        "source": {"kind": "model", "provider": "mock", "model": "mock"},
    }
    return ev("assistant/message", seq, {"turn": turn, "step": step, "message": message}, time, surfaceOp="append")


def result(seq: int, turn: int, step: int, call_id: str) -> SessionEvent:
    message = {
        "id": f"r-{seq}",
        "role": "user",
        "content": [{"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text", "text": "ok"}]}],
        "source": {"kind": "tool", "callId": call_id},
    }
    return ev("tool/result", seq, {"turn": turn, "step": step, "message": message}, surfaceOp="append")


def call(seq: int, turn: int, step: int, call_id: str) -> SessionEvent:
    return ev("tool/call", seq, {"turn": turn, "step": step, "callId": call_id, "name": "t", "arguments": "{}"})


def wire(events: list[SessionEvent]) -> list[dict[str, Any]]:
    return [event_to_builtins(e) for e in events]


def test_balanced_logs_need_no_closers() -> None:
    assert interrupted_turn_closers([]) == []
    log = [ev("turn/start", 0, {"turn": 1}), ev("turn/end", 1, {"turn": 1, "reason": {"kind": "completed"}})]
    assert interrupted_turn_closers(log) == []
    assert not has_open_turn(log)


def test_open_turn_gets_interrupted_turn_end() -> None:
    closers = wire(interrupted_turn_closers([ev("turn/start", 0, {"turn": 1})]))
    assert closers == [
        {"type": "turn/end", "seq": 1, "time": 0, "data": {"turn": 1, "reason": {"kind": "interrupted"}}}
    ]


def test_open_step_is_closed_before_the_turn() -> None:
    log = [ev("turn/start", 0, {"turn": 1}), ev("step/start", 1, {"turn": 1, "step": 1})]
    closers = interrupted_turn_closers(log)
    assert [(c.type, c.seq) for c in closers] == [("step/end", 2), ("turn/end", 3)]
    assert event_to_builtins(closers[0])["data"] == {"turn": 1, "step": 1}


def _turn2_with_call() -> list[SessionEvent]:
    return [ev("turn/start", 0, {"turn": 2}), ev("step/start", 1, {"turn": 2, "step": 1}), assistant(2, 2, 1, "call-1")]


def test_requested_call_without_tool_call_is_not_started() -> None:
    closers = interrupted_turn_closers(_turn2_with_call())
    assert [(c.type, c.seq) for c in closers] == [("tool/result", 3), ("step/end", 4), ("turn/end", 5)]
    out = event_to_builtins(closers[0])
    assert out["surfaceOp"] == "append"
    assert "sourceEventSeqs" not in out
    data = out["data"]
    assert (data["turn"], data["step"]) == (2, 1)
    assert data["error"] == {"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"}
    message = data["message"]
    assert message["source"] == {"kind": "tool", "callId": "call-1"}
    assert message["id"] == "interrupted-tool-result-call-1-3"
    assert message["content"] == [
        {
            "type": "tool-result",
            "toolCallId": "call-1",
            "isError": True,
            "content": [{"type": "text", "text": TOOL_NOT_STARTED_TEXT}],
        }
    ]
    assert TOOL_NOT_STARTED_TEXT == (
        "The tool call was interrupted before the Harness recorded it as started. Retry it if it is still needed."
    )


def test_answered_call_needs_no_result() -> None:
    log = [*_turn2_with_call(), result(3, 2, 1, "call-1")]
    assert [c.type for c in interrupted_turn_closers(log)] == ["step/end", "turn/end"]


def test_closed_step_with_unanswered_call_only_closes_turn() -> None:
    log = [*_turn2_with_call(), ev("step/end", 3, {"turn": 2, "step": 1})]
    closers = interrupted_turn_closers(log)
    assert [(c.type, c.seq) for c in closers] == [("turn/end", 4)]


def test_only_the_open_turn_is_repaired() -> None:
    log = [
        ev("turn/start", 0, {"turn": 1}),
        ev("step/start", 1, {"turn": 1, "step": 1}),
        assistant(2, 1, 1, "old-call"),
        call(3, 1, 1, "old-call"),
        result(4, 1, 1, "old-call"),
        ev("step/end", 5, {"turn": 1, "step": 1}),
        ev("turn/end", 6, {"turn": 1, "reason": {"kind": "completed"}}),
        ev("turn/start", 7, {"turn": 2}),
        ev("step/start", 8, {"turn": 2, "step": 1}),
        assistant(9, 2, 1, "new-call"),
    ]
    results = [c for c in interrupted_turn_closers(log) if c.type == "tool/result"]
    assert [event_to_builtins(r)["data"]["message"]["source"]["callId"] for r in results] == ["new-call"]


def test_partially_answered_calls() -> None:
    log = [
        ev("turn/start", 0, {"turn": 1}),
        ev("step/start", 1, {"turn": 1, "step": 1}),
        assistant(2, 1, 1, "call-a", "call-b"),
        result(3, 1, 1, "call-a"),
    ]
    results = [event_to_builtins(c) for c in interrupted_turn_closers(log) if c.type == "tool/result"]
    assert [r["data"]["message"]["source"]["callId"] for r in results] == ["call-b"]


def test_recorded_call_is_outcome_unknown() -> None:
    log = [*_turn2_with_call(), call(3, 2, 1, "call-1")]
    closers = interrupted_turn_closers(log)
    out = event_to_builtins(closers[0])
    assert out["sourceEventSeqs"] == [3]
    assert out["data"]["error"] == {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"}
    text = out["data"]["message"]["content"][0]["content"][0]["text"]
    assert text == TOOL_OUTCOME_UNKNOWN_TEXT
    assert "retry only if the operation is read-only or idempotent" in text
    assert "first verify external state or ask the user" in text
    assert text.endswith("Do not retry blindly.")


def test_orphan_tool_call_gets_no_result() -> None:
    log = [ev("turn/start", 0, {"turn": 1}), ev("step/start", 1, {"turn": 1, "step": 1}), call(2, 1, 1, "orphan")]
    assert [c.type for c in interrupted_turn_closers(log)] == ["step/end", "turn/end"]


def test_closers_reuse_last_time_and_ids_carry_seq() -> None:
    log = [
        ev("turn/start", 0, {"turn": 1}, time=10),
        ev("step/start", 1, {"turn": 1, "step": 1}, time=20),
        assistant(2, 1, 1, "c1", "c2", time=42),
    ]
    closers = interrupted_turn_closers(log)
    assert {c.time for c in closers} == {42}
    ids = [event_to_builtins(c)["data"]["message"]["id"] for c in closers if c.type == "tool/result"]
    assert ids == ["interrupted-tool-result-c1-3", "interrupted-tool-result-c2-4"]
    assert [c.seq for c in closers] == [3, 4, 5, 6]
    assert [c.type for c in closers] == ["tool/result", "tool/result", "step/end", "turn/end"]


def test_trailing_log_only_events_set_seq_and_time() -> None:
    log = [
        ev("turn/start", 0, {"turn": 1}, time=1),
        ev("todo/write", 1, {"todos": [{"content": "x", "status": "pending"}]}, time=99),
    ]
    closers = interrupted_turn_closers(log)
    assert [(c.type, c.seq, c.time) for c in closers] == [("turn/end", 2, 99)]


def test_reused_call_id_keeps_position_but_loses_call_seq() -> None:
    log = [
        ev("turn/start", 0, {"turn": 1}),
        ev("step/start", 1, {"turn": 1, "step": 1}),
        assistant(2, 1, 1, "x", "y"),
        call(3, 1, 1, "x"),
        assistant(4, 1, 1, "x"),
    ]
    results = [event_to_builtins(c) for c in interrupted_turn_closers(log) if c.type == "tool/result"]
    assert [r["data"]["message"]["source"]["callId"] for r in results] == ["x", "y"]
    assert results[0]["data"]["error"]["code"] == "TOOL_NOT_STARTED"


# ---------------------------------------------------------------------------------------------------------------
# Property: repair output always passes the turn validator (repair balance).


@st.composite
def valid_logs(draw: st.DrawFn) -> list[SessionEvent]:
    """A valid log whose final turn may be cut anywhere (a crash)."""
    events: list[SessionEvent] = []
    turns = draw(st.integers(0, 3))
    for turn in range(1, turns + 1):
        events.append(ev("turn/start", len(events), {"turn": turn}))
        for step in range(1, draw(st.integers(0, 3)) + 1):
            events.append(ev("step/start", len(events), {"turn": turn, "step": step}))
            calls = [f"c{turn}-{step}-{i}" for i in range(draw(st.integers(0, 3)))]
            events.append(assistant(len(events), turn, step, *calls))
            for c in calls:
                if draw(st.booleans()):
                    events.append(call(len(events), turn, step, c))
                    if draw(st.booleans()):
                        events.append(result(len(events), turn, step, c))
            events.append(ev("step/end", len(events), {"turn": turn, "step": step}))
        events.append(ev("turn/end", len(events), {"turn": turn, "reason": {"kind": "completed"}}))
    cut = draw(st.integers(0, len(events)))
    return events[:cut]


@settings(max_examples=200, deadline=None)
@given(valid_logs())
def test_repair_output_always_validates_and_balances(log: list[SessionEvent]) -> None:
    closers = interrupted_turn_closers(log)
    repaired = log + closers
    validate_turns(repaired)
    assert not has_open_turn(repaired)
    assert [e.seq for e in repaired] == list(range(len(repaired)))
    assert interrupted_turn_closers(repaired) == []
    # Every model-requested call of the repaired final turn is answered exactly once.
    if closers:
        assert closers[-1].type == "turn/end"
    # Round trip of the closers through JSON is exact.
    for closer in closers:
        assert decode_event(msgspec.json.decode(msgspec.json.encode(closer))) == closer
