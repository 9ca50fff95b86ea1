"""The turn validator on the 0.3 resume shapes: ``turn/continue`` and ``tool/reconcile``.

Hypothesis builds whole sessions the way the resume paths write them (turns that complete or are cut by a crash
and closed by the real repair function, findings between turns for the unknown-outcome calls, continuations of
the turn just cut) and checks the validator accepts every one, incrementally and in one pass; then it breaks one
such log in one of the ways a continuation or a finding can be malformed and checks the named rule refuses it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from dsh.session_persistence._host.reconcile import Reconciliation, UnknownCall, reconcile_data, unknown_calls
from dsh.session_persistence._model.errors import EventValidationError, TurnInvariantError
from dsh.session_persistence._model.events import SessionEvent
from dsh.session_persistence._model.repair import interrupted_turn_closers
from dsh.session_persistence._model.validator import TurnValidator, validate_turns
from dsh.session_persistence._wire.codec import decode_event, decode_event_line, event_to_builtins
from hypothesis import given, settings
from hypothesis import strategies as st

SURFACE = ("user/message", "tool/result", "assistant/message")
IGNORABLE = ("turn/continue", "tool/reconcile")


class Log:
    """Builds a log event by event (seq = index), as the loop and the repair write it."""

    def __init__(self) -> None:
        self.events: list[SessionEvent] = []
        self.turn = 0

    def add(self, etype: str, data: dict[str, Any]) -> None:
        envelope: dict[str, Any] = {"type": etype, "seq": len(self.events), "time": 0, "data": data}
        if etype in SURFACE:
            envelope["surfaceOp"] = "append"
        if etype in IGNORABLE:
            envelope["ignorable"] = True
        self.events.append(decode_event(envelope))

    def turn_of(self, calls: int, cut: bool, continues: int | None) -> None:
        self.turn += 1
        turn = self.turn
        self.add("turn/start", {"turn": turn})
        if continues is not None:
            self.add("turn/continue", {"turn": turn, "interruptedTurn": continues})
        self.add("step/start", {"turn": turn, "step": 1})
        if continues is None:
            user = {"id": f"u{turn}", "role": "user", "content": [], "source": {"kind": "user"}}
            self.add("user/message", user)
        ids = [f"c{turn}-{n}" for n in range(calls)]
        blocks = [{"type": "tool-call", "id": i, "name": "pay", "arguments": "{}"} for i in ids]
        source = {"kind": "model", "provider": "p", "model": "m"}
        message = {"id": f"a{turn}", "role": "assistant", "content": blocks, "source": source}
        self.add("assistant/message", {"turn": turn, "step": 1, "message": message})
        for call_id in ids:
            self.add("tool/call", {"turn": turn, "step": 1, "callId": call_id, "name": "pay", "arguments": "{}"})
            if cut:
                break  # the crash: the first call is recorded, its result never is
            block = {"type": "tool-result", "toolCallId": call_id, "content": []}
            result = {
                "id": f"r{call_id}",
                "role": "user",
                "content": [block],
                "source": {"kind": "tool", "callId": call_id},
            }
            self.add("tool/result", {"turn": turn, "step": 1, "message": result})
        if cut:
            self.events.extend(interrupted_turn_closers(self.events))
            return
        self.add("step/end", {"turn": turn, "step": 1})
        self.add("turn/end", {"turn": turn, "reason": {"kind": "completed"}})

    def reconcile(self, call: UnknownCall, outcome: str) -> None:
        finding = {
            "happened": Reconciliation.happened("done"),
            "not-happened": Reconciliation.did_not_happen("absent"),
            "unknown": Reconciliation.cannot_tell("down"),
        }[outcome]
        self.add("tool/reconcile", reconcile_data(call, finding, len(self.events)))


# One step of a session: (calls in the turn, cut by a crash, continue the interrupted turn, findings' outcomes).
_TURN = st.tuples(
    st.integers(0, 3), st.booleans(), st.booleans(), st.lists(st.sampled_from(["happened", "not-happened", "unknown"]))
)


def build(plan: list[tuple[int, bool, bool, list[str]]]) -> Log:
    log = Log()
    interrupted: int | None = None
    for calls, cut, cont, outcomes in plan:
        for call, outcome in zip(unknown_calls(log.events), outcomes, strict=False):
            log.reconcile(call, outcome)
        log.turn_of(calls, cut, interrupted if cont and interrupted is not None else None)
        interrupted = log.turn if cut else None
    return log


@settings(max_examples=200, deadline=None)
@given(st.lists(_TURN, min_size=1, max_size=5))
def test_every_log_the_resume_paths_write_validates(plan: list[tuple[int, bool, bool, list[str]]]) -> None:
    events = build(plan).events
    validate_turns(events)
    assert TurnValidator()._check_log(events)
    # The wire round trip keeps every new event a known, ignorable type.
    for event in events:
        if event.type in IGNORABLE:
            assert decode_event(event_to_builtins(event)) == event and event.ignorable is True


def _first(log: Log, etype: str) -> int:
    return next(i for i, e in enumerate(log.events) if e.type == etype)


def _replace(log: Log, index: int, **changes: Any) -> list[SessionEvent]:
    raw = event_to_builtins(log.events[index])
    raw["data"].update(changes)
    return [*log.events[:index], decode_event(raw), *log.events[index + 1 :]]


def _move_before(events: list[SessionEvent], index: int, target: int) -> list[SessionEvent]:
    """``events`` with event ``index`` moved to position ``target`` (seqs renumbered)."""
    order = [e for i, e in enumerate(events) if i != index]
    order.insert(target, events[index])
    out = []
    for seq, event in enumerate(order):
        raw = event_to_builtins(event)
        raw["seq"] = seq
        out.append(decode_event(raw))
    return out


def _crashed_and_continued() -> Log:
    log = Log()
    log.turn_of(2, cut=True, continues=None)
    [call] = unknown_calls(log.events)
    log.reconcile(call, "happened")
    log.turn_of(1, cut=False, continues=1)
    return log


MALFORMED = {
    "names another turn": lambda log: _replace(log, _first(log, "turn/continue"), interruptedTurn=0),
    "names itself": lambda log: _replace(log, _first(log, "turn/continue"), turn=1),
    "not right after turn/start": lambda log: _move_before(
        log.events, _first(log, "turn/continue"), _first(log, "turn/continue") + 1
    ),
    "finding inside a turn": lambda log: _move_before(
        log.events, _first(log, "tool/reconcile"), _first(log, "tool/reconcile") - 1
    ),
    "finding for the wrong result": lambda log: _replace(log, _first(log, "tool/reconcile"), resultSeq=0),
    "finding for a call never unknown": lambda log: _replace(log, _first(log, "tool/reconcile"), callId="c9"),
    "happened without a message": lambda log: _drop_message(log),
    "unknown with a message": lambda log: _replace(log, _first(log, "tool/reconcile"), outcome="unknown"),
}
RULES = {
    "names another turn": "continue-target",
    "names itself": "continue-turn",
    "not right after turn/start": "continue-position",
    "finding inside a turn": "reconcile-in-turn",
    "finding for the wrong result": "reconcile-target",
    "finding for a call never unknown": "reconcile-target",
    "happened without a message": "reconcile-message",
    "unknown with a message": "reconcile-message",
}


def _drop_message(log: Log) -> list[SessionEvent]:
    index = _first(log, "tool/reconcile")
    raw = event_to_builtins(log.events[index])
    del raw["data"]["message"]
    return [*log.events[:index], decode_event(raw), *log.events[index + 1 :]]


@pytest.mark.parametrize("defect", sorted(MALFORMED))
def test_malformed_continuations_and_findings_are_refused(defect: str) -> None:
    log = _crashed_and_continued()
    validate_turns(log.events)
    with pytest.raises(TurnInvariantError) as raised:
        validate_turns(MALFORMED[defect](log))
    assert raised.value.rule == RULES[defect]


def test_a_continuation_of_a_completed_turn_and_a_second_conclusive_finding_are_refused() -> None:
    log = Log()
    log.turn_of(1, cut=False, continues=None)
    log.turn_of(1, cut=False, continues=1)
    with pytest.raises(TurnInvariantError) as raised:
        validate_turns(log.events)
    assert raised.value.rule == "continue-target"
    twice = _crashed_and_continued()
    call = UnknownCall("c1-0", "pay", "{}", _first(twice, "tool/result"))
    again = Log()
    again.events = twice.events[: _first(twice, "tool/reconcile") + 1]  # crash, repair, one conclusive finding
    again.reconcile(call, "not-happened")
    with pytest.raises(TurnInvariantError) as raised:
        validate_turns(again.events)
    assert raised.value.rule == "reconcile-target"


@given(st.lists(st.sampled_from(["happened", "not-happened", "unknown"]), min_size=1, max_size=4))
def test_findings_conclude_once_and_unknown_ones_may_repeat(outcomes: list[str]) -> None:
    log = Log()
    log.turn_of(1, cut=True, continues=None)
    concluded = False
    for outcome in outcomes:
        calls = unknown_calls(log.events)
        if concluded:
            assert calls == []
            break
        log.reconcile(calls[0], outcome)
        concluded = outcome != "unknown"
    validate_turns(log.events)


@pytest.mark.parametrize("etype", IGNORABLE)
def test_the_new_types_must_be_written_ignorable(etype: str) -> None:
    log = _crashed_and_continued()
    raw = event_to_builtins(log.events[_first(log, etype)])
    del raw["ignorable"]
    with pytest.raises(EventValidationError, match="must be marked ignorable"):
        decode_event(raw)
    with pytest.raises(EventValidationError, match="must be marked ignorable"):
        decode_event_line(json.dumps(raw))  # the typed fast path too
