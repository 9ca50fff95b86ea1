"""The one-pass validator over packed chunk runs (DESIGN §12.2): a run is checked as one unit, with exactly the
verdict and the error text the expanded events get.
"""

from __future__ import annotations

from typing import Any

from dsh.session_persistence._model.stored_events import PackedRun
from dsh.session_persistence._model.validator import TurnValidator
from dsh.session_persistence._wire.stored_log import validate_stored
from dsh.session_persistence.backend import SessionEvent, StoredEvents, decode_stored_batch, encode_storage_lines
from dsh.session_persistence.testing import event, meta, step_end, step_start, turn_end, turn_start, user_message
from hypothesis import given, settings
from hypothesis import strategies as st


def chunk(seq: int, kind: str, turn: int, step: int, k: int) -> SessionEvent:
    if kind == "tool-call-delta":
        body: dict[str, Any] = {"type": kind, "index": 0, "id": "c1", "argumentsDelta": f"a{k}"}
    else:
        body = {"type": kind, "index": 0, "text": f"t{k}"}
    return event(seq, "assistant/chunk", {"turn": turn, "step": step, "chunk": body})


_kinds = st.sampled_from(["text-delta", "reasoning-delta", "tool-call-delta"])


@st.composite
def logs(draw: st.DrawFn) -> list[SessionEvent]:
    """Turns of steps streaming chunk runs, valid or with one rule broken somewhere (a run naming another turn or
    step, a run outside a step, a missing step/end or turn/end, a seq skipped or repeated)."""
    # At most one rule is broken, at the chosen chance to break one (a second break would usually hide the first).
    target = draw(st.integers(0, 40) | st.just(-1))
    chances = [0]

    def odd() -> bool:
        chances[0] += 1
        return chances[0] - 1 == target

    events: list[SessionEvent] = []
    cursor = [0]  # the next seq; a break shifts it for good (a gap, a repeat, a jump back)

    def seq() -> int:
        if odd():
            cursor[0] = max(0, cursor[0] + draw(st.sampled_from([1, -1, 2, -3])))
        cursor[0] += 1
        return cursor[0] - 1

    for turn in range(1, draw(st.integers(1, 3)) + 1):
        events.append(turn_start(seq(), turn))
        events.append(user_message(seq(), "hi"))
        for step in range(1, draw(st.integers(0, 3)) + 1):
            if not odd():
                events.append(step_start(seq(), turn, step))
            for _ in range(draw(st.integers(0, 3))):
                kind = draw(_kinds)
                run_turn = turn + draw(st.sampled_from([0, 1, -1])) if odd() else turn
                run_step = step + draw(st.sampled_from([0, 1, -1])) if odd() else step
                for k in range(draw(st.integers(1, 6))):
                    events.append(chunk(seq(), kind, run_turn, run_step, k))
            if not odd():
                events.append(step_end(seq(), turn, step))
        if (draw(st.integers(0, 3)) or turn == 1) and not odd():
            events.append(turn_end(seq(), turn))
    # A log may end anywhere (a crash mid-turn leaves a valid, interrupted log), also right after a packed run.
    return events[: draw(st.integers(0, len(events)) | st.just(len(events)))]


def verdict(events: Any) -> tuple[str, str, tuple[Any, ...] | None]:
    """What ``validate_stored`` says of a whole stored log, and the validator's state when it accepts."""
    try:
        validator = validate_stored("s", meta("s"), 0, events, None)
    except Exception as exc:
        return type(exc).__name__, str(exc), None
    assert validator is not None
    return "ok", "", _state(validator)


def _state(validator: TurnValidator) -> tuple[Any, ...]:
    return tuple(
        (name, sorted(value) if isinstance(value, set) else getattr(validator, name))
        for name in TurnValidator.__slots__
        for value in [getattr(validator, name)]
    )


def packed_form(events: list[SessionEvent]) -> StoredEvents:
    """The events as a load reads them: one stored batch each, decoded with their runs left packed."""
    parts = []
    for at in range(0, len(events), 7):  # several batches, so runs split at batch ends too
        batch = events[at : at + 7]
        decoded, _contiguous = decode_stored_batch(encode_storage_lines(batch, pack_chunks=True), batch[0].seq)
        parts.append(decoded)
    return StoredEvents.concat(parts)


@given(logs())
@settings(max_examples=400)
def test_packed_and_expanded_logs_get_the_same_verdict_and_message(events: list[SessionEvent]) -> None:
    packed = packed_form(events)
    assert verdict(packed) == verdict(list(events))


@given(logs())
@settings(max_examples=200)
def test_the_one_pass_accepts_a_packed_log_exactly_when_it_accepts_the_expanded_one(events: list[SessionEvent]) -> None:
    packed = packed_form(events)
    on_packed, on_list = TurnValidator(), TurnValidator()
    try:
        accepted_packed = on_packed._check_log(packed._segments(), PackedRun)
    except Exception:
        accepted_packed = False
    try:
        accepted_list = on_list._check_log(events)
    except Exception:
        accepted_list = False
    assert accepted_packed == accepted_list
    if accepted_list:
        assert _state(on_packed) == _state(on_list)


def _streamed(turn_of_run: int = 1, step_of_run: int = 1, gap: int = 0) -> list[SessionEvent]:
    events = [turn_start(0, 1), step_start(1, 1, 1)]
    events += [chunk(2 + k, "text-delta", turn_of_run, step_of_run, k) for k in range(5)]
    events += [chunk(7 + k + gap, "text-delta", 1, 1, 9) for k in range(1)]
    events += [step_end(8 + gap, 1, 1), turn_end(9 + gap, 1)]
    return events


def test_a_valid_run_is_checked_without_expanding_it() -> None:
    packed = packed_form(_streamed())
    runs = [item for item in packed._segments() if isinstance(item, PackedRun)]
    assert runs and all(run._events is None for run in runs)
    assert verdict(packed)[0] == "ok"
    assert all(run._events is None for run in runs)


def test_a_run_outside_its_step_is_named_as_its_first_member() -> None:
    name, message, _ = verdict(packed_form(_streamed(step_of_run=2)))
    assert name == "SessionPersistenceCorruptionError"
    assert "assistant/chunk names step 2 but the open step is 1 (seq 2, rule step-mismatch)" in message
    name, message, _ = verdict(packed_form(_streamed(turn_of_run=3)))
    assert "assistant/chunk names turn 3 but the open turn is 1 (seq 2, rule turn-mismatch)" in message


def test_a_gap_after_a_run_is_named_as_for_the_expanded_log() -> None:
    events = _streamed(gap=1)
    assert verdict(packed_form(events)) == verdict(events)
    assert "stored event at index 7 has seq 8" in verdict(events)[1]


def test_a_gap_before_a_final_run_is_named_as_for_the_expanded_log() -> None:
    # Nothing follows the run, so only the run's own first seq shows the gap.
    events = [turn_start(0, 1), step_start(1, 1, 1), *(chunk(3 + k, "text-delta", 1, 1, k) for k in range(4))]
    packed = packed_form(events)
    assert any(isinstance(item, PackedRun) for item in packed._segments())
    assert verdict(packed) == verdict(events)
    assert "stored event at index 2 has seq 3" in verdict(packed)[1]
