"""The incremental turn/step validator: session-core §7 scenario 60."""

from __future__ import annotations

from typing import Any

import pytest
from dsh.session_persistence._model.errors import TurnInvariantError
from dsh.session_persistence._model.events import OpaqueEvent, SessionEvent
from dsh.session_persistence._model.repair import TOOL_NOT_STARTED
from dsh.session_persistence._model.validator import TurnValidator, validate_turns
from dsh.session_persistence._wire.codec import decode_event
from dsh.session_persistence._wire.contiguity import first_seq_gap
from dsh.session_persistence._wire.versions import first_refused_unknown
from hypothesis import given, settings
from hypothesis import strategies as st


def log(*specs: tuple[str, Any]) -> list[SessionEvent]:
    events = []
    for seq, (etype, data) in enumerate(specs):
        extra = {"surfaceOp": "append"} if etype in ("user/message", "tool/result", "assistant/message") else {}
        events.append(decode_event({"type": etype, "seq": seq, "time": 0, "data": data, **extra}))
    return events


def result_data(call_id: str, step: int = 1, code: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "turn": 1,
        "step": step,
        "message": {
            "id": "r",
            "role": "user",
            "content": [{"type": "tool-result", "toolCallId": call_id, "content": [], "isError": code is not None}],
            "source": {"kind": "tool", "callId": call_id},
        },
    }
    if code is not None:
        data["error"] = {"name": "ToolNotStartedError", "code": code}
    return data


TS1 = ("turn/start", {"turn": 1})
TE1 = ("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
SS11 = ("step/start", {"turn": 1, "step": 1})
SE11 = ("step/end", {"turn": 1, "step": 1})


def expect(rule: str, *specs: tuple[str, Any]) -> None:
    with pytest.raises(TurnInvariantError) as info:
        validate_turns(log(*specs))
    assert info.value.rule == rule, info.value


def test_turn_rules() -> None:
    with pytest.raises(TurnInvariantError, match="still open"):
        validate_turns(log(TS1, ("turn/start", {"turn": 2})))
    with pytest.raises(TurnInvariantError, match="does not match open turn 1"):
        validate_turns(log(TS1, ("turn/end", {"turn": 2, "reason": {"kind": "completed"}})))
    with pytest.raises(TurnInvariantError, match="expected turn 2, got 3"):
        validate_turns(log(TS1, TE1, ("turn/start", {"turn": 3})))
    expect("turn-end-step", TS1, SS11, TE1)


def test_step_rules() -> None:
    expect("step-number", TS1, ("step/start", {"turn": 1, "step": 2}))
    expect("step-open", TS1, SS11, ("step/start", {"turn": 1, "step": 2}))
    expect("step-mismatch", TS1, SS11, ("step/end", {"turn": 1, "step": 2}))
    expect("turn-mismatch", TS1, ("step/start", {"turn": 2, "step": 1}))
    validate_turns(log(TS1, SS11, SE11, ("step/start", {"turn": 1, "step": 2})))


def test_events_outside_turns() -> None:
    expect("outside-turn", ("request/context", {"provider": "p", "model": "m"}))
    validate_turns(
        log(
            ("user/message", {"id": "u", "role": "user", "content": [], "source": {"kind": "user"}}),
            ("plugin/anything", {}),
            ("session/end-seed", {}),
        )
    )


def test_tool_results() -> None:
    call = ("tool/call", {"turn": 1, "step": 1, "callId": "c", "name": "t", "arguments": "{}"})
    validate_turns(log(TS1, SS11, call, ("tool/result", result_data("c")), SE11, TE1))
    validate_turns(log(TS1, SS11, ("tool/result", result_data("x", code=TOOL_NOT_STARTED)), SE11, TE1))
    expect("result-without-call", TS1, SS11, ("tool/result", result_data("x")))
    expect(
        "result-without-call",
        TS1,
        SS11,
        call,
        SE11,
        ("step/start", {"turn": 1, "step": 2}),
        ("tool/result", result_data("c", step=2)),
    )


def test_incremental_use_matches_batch() -> None:
    events = log(TS1, SS11, SE11, TE1)
    validator = TurnValidator()
    for event in events:
        validator.check(event)
    assert validator.open_turn is None
    with pytest.raises(TurnInvariantError, match="not greater than the previous seq"):
        validator.check(events[0])


def _chunk(turn: int, step: int) -> tuple[str, Any]:
    return ("assistant/chunk", {"turn": turn, "step": step, "chunk": {"type": "text-delta", "index": 0, "text": "x"}})


@pytest.mark.parametrize(
    ("specs", "rule", "bad_seq"),
    [
        ((TS1, SS11, _chunk(1, 1), _chunk(1, 2)), "step-mismatch", 3),
        ((TS1, SS11, _chunk(1, 1), _chunk(2, 1)), "turn-mismatch", 3),
        ((TS1, _chunk(1, 1)), "step-mismatch", 1),
        ((_chunk(1, 1),), "turn-mismatch", 0),
        ((TS1, SS11, _chunk(1, 1), SE11, _chunk(1, 1)), "step-mismatch", 4),
        ((TS1, SS11, _chunk(1, 1), SE11, TE1, _chunk(1, 1)), "turn-mismatch", 5),
    ],
)
def test_chunk_runs_batch_matches_incremental(specs: tuple[tuple[str, Any], ...], rule: str, bad_seq: int) -> None:
    # validate_turns inlines the chunk case; it must reject exactly what check() rejects, with the same error.
    events = log(*specs)

    def incrementally() -> None:
        validator = TurnValidator()
        for event in events:
            validator.check(event)

    with pytest.raises(TurnInvariantError) as incremental:
        incrementally()
    with pytest.raises(TurnInvariantError) as batch:
        validate_turns(events)
    assert (batch.value.rule, batch.value.seq, str(batch.value)) == (rule, bad_seq, str(incremental.value))


def test_chunk_seq_order_is_checked_in_batch() -> None:
    events = log(TS1, SS11, _chunk(1, 1), _chunk(1, 1))
    with pytest.raises(TurnInvariantError, match="not greater than the previous seq") as info:
        validate_turns([*events, events[2]])
    assert info.value.rule == "seq-order"
    assert validate_turns(events).open_turn == 1


# ---------------------------------------------------------------------------------------------------------------
# _check_log: the one-pass check of a whole stored log agrees with the separate checks


def _spec_event(seq: int, spec: tuple[str, Any]) -> SessionEvent:
    etype, data = spec
    if etype == "x/unknown":  # ignorable: the separate checks pass it
        return decode_event({"type": etype, "seq": seq, "time": 0, "data": {}, "ignorable": True})
    if etype == "x/refused":  # not ignorable: refused as a format the build cannot read
        return decode_event({"type": etype, "seq": seq, "time": 0, "data": {}})
    extra = {"surfaceOp": "append"} if etype in ("user/message", "tool/result", "assistant/message") else {}
    return decode_event({"type": etype, "seq": seq, "time": 0, "data": data, **extra})


_SPECS = st.one_of(
    st.integers(1, 2).map(lambda t: ("turn/start", {"turn": t})),
    st.integers(1, 2).map(lambda t: ("turn/end", {"turn": t, "reason": {"kind": "completed"}})),
    st.tuples(st.integers(1, 2), st.integers(1, 2)).map(lambda ts: ("step/start", {"turn": ts[0], "step": ts[1]})),
    st.tuples(st.integers(1, 2), st.integers(1, 2)).map(lambda ts: ("step/end", {"turn": ts[0], "step": ts[1]})),
    st.tuples(st.integers(1, 2), st.integers(1, 2)).map(lambda ts: _chunk(*ts)),
    st.sampled_from(["a", "b"]).map(
        lambda c: ("tool/call", {"turn": 1, "step": 1, "callId": c, "name": "t", "arguments": "{}"})
    ),
    st.sampled_from(["a", "b"]).map(lambda c: ("tool/result", result_data(c))),
    st.just(("x/unknown", {})),
    st.just(("x/refused", {})),
)
# A valid prefix makes the later events meet open turns and steps, so both outcomes are common.
_PREFIX = (TS1, SS11, _chunk(1, 1), _chunk(1, 1))


def _state(validator: TurnValidator) -> tuple[Any, ...]:
    return tuple(getattr(validator, slot) for slot in sorted(TurnValidator.__slots__))


def _separately(events: list[SessionEvent]) -> TurnValidator | None:
    """What validate_stored's separate checks say: the validator after all of them passed, else ``None``."""
    if first_seq_gap(events) is not None or first_refused_unknown(events) is not None:
        return None
    try:
        return validate_turns(events)
    except TurnInvariantError:
        return None


@settings(max_examples=300, deadline=None)
@given(
    specs=st.lists(_SPECS, max_size=12),
    prefixed=st.booleans(),
    seq_shift=st.one_of(st.none(), st.tuples(st.integers(0, 15), st.sampled_from([-1, 1, 2]))),
)
def test_check_log_accepts_exactly_what_the_separate_checks_accept(
    specs: list[tuple[str, Any]], prefixed: bool, seq_shift: tuple[int, int] | None
) -> None:
    all_specs = [*(_PREFIX if prefixed else ()), *specs]
    seqs = list(range(len(all_specs)))
    if seq_shift is not None and seq_shift[0] < len(seqs):
        at, delta = seq_shift
        seqs[at:] = [s + delta for s in seqs[at:]]  # a gap, a repeat or a step back from there on
    events = [_spec_event(max(seq, 0), spec) for seq, spec in zip(seqs, all_specs, strict=True)]
    expected = _separately(events)
    fast = TurnValidator()
    try:
        accepted = fast._check_log(events)
    except TurnInvariantError:
        accepted = False
    if accepted:
        assert expected is not None, "_check_log accepted a log a separate check refuses"
        assert _state(fast) == _state(expected)
    elif expected is not None:
        # Declining is allowed only for an OpaqueEvent (ignorable unknowns pass the separate checks).
        assert any(type(e) is OpaqueEvent for e in events)


def test_check_log_takes_the_fast_path_on_a_streamed_log_and_declines_a_gap() -> None:
    events = log(TS1, SS11, _chunk(1, 1), _chunk(1, 1), SE11, TE1)
    validator = TurnValidator()
    assert validator._check_log(events)
    assert _state(validator) == _state(validate_turns(events))
    gapped = [*events[:3], *log(TS1, SS11, _chunk(1, 1), _chunk(1, 1), SE11, TE1)[4:]]
    assert not TurnValidator()._check_log(gapped)
    used = TurnValidator()
    used.check(events[0])
    assert not used._check_log(events[1:])  # contiguity is from seq 0: only a fresh validator
