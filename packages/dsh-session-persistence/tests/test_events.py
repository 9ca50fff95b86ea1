"""The event model: two-phase decode, wire names, unknown types, surface rules, exact round trips."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from dsh.session_persistence._model.errors import EventValidationError
from dsh.session_persistence._model.events import EVENT_TYPES, OpaqueEvent, ToolCall
from dsh.session_persistence._wire.codec import (
    decode_event,
    decode_event_line,
    encode_event,
    event_to_builtins,
)
from dsh.session_persistence._wire.versions import first_refused_unknown
from hypothesis import given, settings
from hypothesis import strategies as st

SAMPLES: list[dict[str, Any]] = [
    {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}},
    {"type": "turn/end", "seq": 0, "time": -5, "data": {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "hook", "reason": "x"}}}},
    {"type": "turn/end", "seq": 0, "time": 1, "data": {"turn": 1, "reason": {"kind": "error", "error": {"message": "m", "code": "UNKNOWN", "status": 500}}}},
    {"type": "step/start", "seq": 3, "time": 1, "data": {"turn": 1, "step": 2}},
    {"type": "step/end", "seq": 3, "time": 1, "data": {"turn": 1, "step": 2}},
    {"type": "user/message", "seq": 0, "time": 1, "surfaceOp": "append", "data": {"id": "u", "role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image", "attachment": {"mime": "image/png", "ref": "a"}}], "source": {"kind": "plugin", "plugin": "p"}}},
    {"type": "assistant/chunk", "seq": 0, "time": 1, "data": {"turn": 1, "step": 1, "chunk": {"type": "tool-call-delta", "index": 1, "id": "c", "name": "t", "argumentsDelta": "{"}}},
    {"type": "assistant/chunk", "seq": 0, "time": 1, "data": {"turn": 1, "step": 1, "chunk": {"type": "finish", "reason": {"kind": "stop"}, "replayState": {"opaque": [1]}}}},
    {"type": "assistant/chunk", "seq": 0, "time": 1, "data": {"turn": 1, "step": 1, "chunk": {"type": "block-end", "index": 0, "block": {"type": "reasoning", "text": "hmm"}}}},
    {"type": "assistant/message", "seq": 4, "time": 1, "surfaceOp": "append", "sourceEventSeqs": [], "data": {"turn": 1, "step": 1, "message": {"id": "a", "role": "assistant", "content": [{"type": "tool-call", "id": "c", "name": "t", "arguments": "{}"}], "source": {"kind": "model", "provider": "p", "model": "m"}}, "usage": {"inputTokens": 3, "outputTokens": 4, "cacheReadTokens": 1}, "interrupted": True}},
    {"type": "tool/call", "seq": 0, "time": 1, "data": {"turn": 1, "step": 1, "callId": "c", "name": "t", "arguments": "{\"a\": 1}"}},
    {"type": "tool/result", "seq": 6, "time": 1, "surfaceOp": "append", "sourceEventSeqs": [5], "data": {"turn": 1, "step": 1, "message": {"id": "r", "role": "user", "content": [{"type": "tool-result", "toolCallId": "c", "content": [{"type": "text", "text": "ok"}]}], "source": {"kind": "tool", "callId": "c"}}, "meta": {"anything": [None, 1.5]}}},
    {"type": "request/header", "seq": 0, "time": 1, "data": {"header": {"config": {"provider": "p", "model": "m", "temperature": 0.5, "maxTokens": 100, "stop": ["x"]}, "adapterDefaults": {"maxTokens": True}, "system": "be brief", "tools": [{"name": "t"}]}, "reason": "initial"}},
    {"type": "request/context", "seq": 0, "time": 1, "data": {"provider": "p", "model": "m", "contextWindow": 1000}},
    {"type": "session/end-seed", "seq": 0, "time": 1, "data": {}},
    {"type": "todo/write", "seq": 0, "time": 1, "data": {"todos": [{"content": "x", "status": "in_progress"}]}},
    {"type": "plugin/thing", "seq": 0, "time": 1, "data": None, "ignorable": True},
    {"type": "turn/continue", "seq": 0, "time": 1, "ignorable": True, "data": {"turn": 2, "interruptedTurn": 1}},
    {"type": "tool/reconcile", "seq": 0, "time": 1, "ignorable": True, "data": {"callId": "c", "name": "pay", "resultSeq": 7, "outcome": "unknown", "detail": "down"}},
    {"type": "tool/reconcile", "seq": 0, "time": 1, "ignorable": True, "data": {"callId": "c", "name": "pay", "resultSeq": 7, "outcome": "happened", "message": {"id": "m", "role": "user", "content": [{"type": "tool-result", "toolCallId": "c", "content": [{"type": "text", "text": "ok"}]}], "source": {"kind": "tool", "callId": "c"}}}},
]  # fmt: skip


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s["type"])
def test_round_trip_is_exact(sample: dict[str, Any]) -> None:
    event = decode_event(sample)
    assert event.type == sample["type"]
    assert event_to_builtins(event) == sample
    assert msgspec.json.decode(encode_event(event)) == sample
    assert decode_event_line(encode_event(event)) == event
    assert decode_event_line(msgspec.json.encode(sample)) == event


def test_wire_names_are_camel_case() -> None:
    event = decode_event(next(s for s in SAMPLES if s["type"] == "tool/call"))
    assert isinstance(event, ToolCall)
    assert event.data.call_id == "c"
    assert b'"callId"' in encode_event(event)


def test_every_known_type_has_a_sample() -> None:
    assert set(EVENT_TYPES) <= {s["type"] for s in SAMPLES}


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1, "extra": 1}}, "turn/start"),
        ({"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": "1"}}, "turn/start"),
        ({"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1.0}}, "turn/start"),
        ({"type": "turn/end", "seq": 0, "time": 1, "data": {"turn": 1, "reason": {"kind": "exploded"}}}, "turn/end"),
        ({"type": "request/header", "seq": 0, "time": 1, "data": {"header": {"config": {"provider": "", "model": "m"}}, "reason": "initial"}}, "request/header"),
        ({"type": "request/header", "seq": 0, "time": 1, "data": {"header": {"config": {"provider": "p", "model": "m"}}, "reason": "fallback"}}, "request/header"),
        ({"type": "turn/start", "seq": 2**53, "time": 1, "data": {"turn": 1}}, "seq"),
        ({"type": "user/message", "seq": 0, "time": 1, "surfaceOp": {"op": "replace", "start": 0, "end": 0}, "data": {}}, "replace"),
        ({"type": "user/message", "seq": 0, "time": 1, "surfaceOp": "invalid", "data": {}}, "invalid surfaceOp"),
        ({"type": "tool/result", "seq": 3, "time": 1, "surfaceOp": "append", "sourceEventSeqs": [], "data": {}}, "sourceEventSeqs"),
        ({"type": "tool/result", "seq": 3, "time": 1, "surfaceOp": "append", "sourceEventSeqs": [1, 1], "data": {}}, "sourceEventSeqs"),
        ({"type": "plugin/x", "seq": 3, "time": 1, "surfaceOp": "append", "data": {}}, "not surface-eligible"),
    ],
)  # fmt: skip
def test_rejections_are_specific(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(EventValidationError, match=message):
        decode_event(obj)
    with pytest.raises(EventValidationError, match=message):
        decode_event_line(msgspec.json.encode(obj))


def test_unknown_types_are_opaque_and_refusal_is_the_readers_choice() -> None:
    known = decode_event(SAMPLES[0])
    kept = decode_event({"type": "future/x", "seq": 1, "time": 1, "data": {"a": 1}, "ignorable": True})
    refused = decode_event_line(b'{"type":"future/y","seq":2,"time":1,"data":[1]}')
    assert isinstance(kept, OpaqueEvent) and isinstance(refused, OpaqueEvent)
    assert first_refused_unknown([known, kept]) is None
    assert first_refused_unknown([known, kept, refused]) is refused


def test_bad_json_line() -> None:
    with pytest.raises(EventValidationError, match="invalid event line"):
        decode_event_line(b"{not json")


json_scalars = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=5)
json_values = st.recursive(
    json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=8
)


@settings(max_examples=100, deadline=None)
@given(
    text=st.text(max_size=20),
    seq=st.integers(1, 2**53 - 1),
    time=st.integers(-(2**53) + 1, 2**53 - 1),
    meta=json_values,
    call_id=st.text(min_size=1, max_size=8),
)
def test_fast_and_slow_decoders_agree(text: str, seq: int, time: int, meta: Any, call_id: str) -> None:
    obj = {
        "type": "tool/result",
        "seq": seq,
        "time": time,
        "surfaceOp": "append",
        "sourceEventSeqs": [seq - 1],
        "data": {
            "turn": 1,
            "step": 1,
            "message": {
                "id": "r",
                "role": "user",
                "content": [
                    {"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text", "text": text}]}
                ],
                "source": {"kind": "tool", "callId": call_id},
            },
            "meta": meta,
        },
    }
    line = msgspec.json.encode(obj)
    event = decode_event_line(line)
    assert event == decode_event(msgspec.json.decode(line))
    assert event_to_builtins(event) == obj


def _result_at(seq: int, seqs: object) -> dict[str, Any]:
    message = {
        "id": "r",
        "role": "user",
        "content": [{"type": "tool-result", "toolCallId": "c", "content": []}],
        "source": {"kind": "tool", "callId": "c"},
    }
    data = {"turn": 1, "step": 1, "message": message}
    return {"type": "tool/result", "seq": seq, "time": 1, "surfaceOp": "append", "sourceEventSeqs": seqs, "data": data}


@pytest.mark.parametrize(
    "seqs",
    [
        [True],
        [1.0],
        [0, 2.0],
        [3],
        [0, 4],
        [-1],
        [0, -1],
        [0, 2, 0],
        [2, 2],
        [2**53],
        ["1"],
        [None],
        [[1]],
        {"a": 1},
        1,
    ],
)
def test_source_event_seqs_rejections(seqs: object) -> None:
    # Members must be exact non-negative ints below the event's seq, without repeats (fast path and loop agree).
    obj = _result_at(3, seqs)
    with pytest.raises(EventValidationError, match='"tool/result" carries invalid sourceEventSeqs'):
        decode_event(obj)
    with pytest.raises(EventValidationError, match="sourceEventSeqs"):
        decode_event_line(msgspec.json.encode(obj))


def test_source_event_seqs_accepted() -> None:
    for seqs in ([0], [2, 0, 1], list(range(300))):
        obj = _result_at(300, seqs)
        event = decode_event(obj)
        assert event.source_event_seqs == tuple(seqs)  # type: ignore[union-attr]
        assert decode_event_line(msgspec.json.encode(obj)) == event


def _outcome(func: Any, *args: Any) -> tuple[str, Any]:
    try:
        event = func(*args)
    except Exception as exc:  # the type and the exact text must match
        return (type(exc).__name__, str(exc))
    return ("ok", event_to_builtins(event))


def _build_cases() -> list[tuple[str, int, object, Any, list[Any] | None, bool]]:
    cases: list[tuple[str, int, object, Any, list[Any] | None, bool]] = []
    for sample in SAMPLES:
        seqs = sample.get("sourceEventSeqs")
        for ignorable in (False, True):
            cases.append((sample["type"], sample["seq"], sample["time"], sample["data"], seqs, ignorable))
    message = SAMPLES[5]["data"]
    result = SAMPLES[11]["data"]
    cases += [
        ("turn/start", 0, 1, {"turn": -1}, None, False),
        ("turn/start", 0, 1, {"turn": 1, "extra": 1}, None, False),
        ("turn/start", 0, 1, [1], None, False),
        ("turn/start", 0, 1, {"turn": 1}, [0], False),
        ("turn/start", 0, 1.5, {"turn": 1}, None, False),
        ("turn/start", 0, 2**53, {"turn": 1}, None, False),
        ("turn/start", 0, -(2**53), {"turn": 1}, None, False),
        ("turn/start", 0, -(2**53) + 1, {"turn": 1}, None, False),
        ("turn/start", 0, True, {"turn": 1}, None, False),
        ("turn/start", 2**53, 1, {"turn": 1}, None, False),
        ("user/message", 0, 1, {**message, "role": "assistant"}, None, False),
        ("user/message", 2, 1, message, [0, 0], False),
        ("user/message", 2, 1, message, [], False),
        ("user/message", 2, 1, message, [2], False),
        ("user/message", 2, 1, message, [1.0], False),
        ("tool/result", 6, 1, {**result, "message": {**result["message"], "source": {"kind": "user"}}}, [5], False),
        ("tool/result", 6, 1, {**result, "turn": "1"}, [5], False),
        ("plugin/x", 0, 1, {"a": [1]}, None, False),
        ("plugin/x", 0, 1, {"a": [1]}, [0], True),
        ("", 0, 1, {}, None, False),
    ]
    return cases


@pytest.mark.parametrize("case", _build_cases())
def test_build_event_matches_decoding_the_append_envelope(case: tuple[Any, ...]) -> None:
    # Session.append builds known events directly; the result (or the error and its text) must be what
    # decode_event gives for the envelope the append describes.
    from dsh.session_persistence._wire.codec import append_envelope, build_event

    etype, seq, time, data, seqs, ignorable = case
    expected = _outcome(decode_event, append_envelope(etype, seq, time, data, seqs, ignorable))
    assert _outcome(build_event, etype, seq, time, data, seqs, ignorable) == expected


def test_known_events_are_not_tracked_by_the_cycle_collector() -> None:
    # Deliberate (see _events._Value): a log's structs must not make every GC pass walk the whole log.
    import gc

    for sample in SAMPLES:
        event = decode_event(sample)
        if type(event) is not OpaqueEvent:
            assert not gc.is_tracked(event), sample["type"]
            assert not gc.is_tracked(event.data), sample["type"]
