"""Storage lines: the typed fast paths of the codec agree with its generic path (events, or the same error text)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dsh.session_persistence import MemoryBackend
from dsh.session_persistence._wire.storage_lines import _batch
from dsh.session_persistence.backend import (
    SeqMismatchError,
    SessionEvent,
    SessionFormatUnsupportedError,
    StorageLineError,
    StorageMetadata,
    check_contiguous,
    check_format_version,
    decode_event,
    decode_storage_line,
    decode_storage_lines,
    decode_storage_lines_from,
    encode_event,
    encode_storage_lines,
    event_to_builtins,
    expand_chunk_row,
    first_seq_gap,
)
from dsh.session_persistence.testing import meta, turn_end, turn_start


def ev(seq: int, etype: str = "turn/start") -> bytes:
    """One valid event line (no LF): a ``turn/start`` or ``turn/end`` of turn 1."""
    return encode_event(turn_end(seq) if etype == "turn/end" else turn_start(seq))


def streamed_log(turns: int) -> list[SessionEvent]:
    """A log with streamed text and tool-call deltas, usage, finish, messages and tool results."""
    wire: list[dict[str, Any]] = []

    def add(etype: str, data: Any, **envelope: Any) -> None:
        wire.append(
            {"type": etype, "seq": len(wire), "time": 1_700_000_000_000 + 7 * len(wire), "data": data, **envelope}
        )

    for turn in range(turns):
        add("turn/start", {"turn": turn})
        user = {
            "id": f"u{turn}",
            "role": "user",
            "content": [{"type": "text", "text": f"task {turn}"}],
            "source": {"kind": "user"},
        }
        add("user/message", user, surfaceOp="append")
        base = {"turn": turn, "step": 0}
        add("step/start", base)
        first = len(wire)
        add("assistant/chunk", {**base, "chunk": {"type": "block-start", "index": 0, "blockType": "text"}})
        for word in ("the ", "quick ", "résumé ", "开发 ", "fox"):
            add("assistant/chunk", {**base, "chunk": {"type": "text-delta", "index": 0, "text": word}})
        for i, part in enumerate(['{"path', '": "a', '.py"}']):
            chunk = {"type": "tool-call-delta", "index": 1, "id": f"c{turn}", "argumentsDelta": part}
            if i == 0:
                chunk["name"] = "read"
            add("assistant/chunk", {**base, "chunk": chunk})
        add("assistant/chunk", {**base, "chunk": {"type": "usage", "usage": {"inputTokens": 9, "outputTokens": 8}}})
        add("assistant/chunk", {**base, "chunk": {"type": "finish", "reason": {"kind": "tool-calls"}}})
        message = {
            "id": f"a{turn}",
            "role": "assistant",
            "content": [{"type": "tool-call", "id": f"c{turn}", "name": "read", "arguments": '{"path": "a.py"}'}],
            "source": {"kind": "model", "provider": "p", "model": "m"},
        }
        add("assistant/message", {**base, "message": message}, surfaceOp="append", sourceEventSeqs=[first, first + 1])
        add("tool/call", {**base, "callId": f"c{turn}", "name": "read", "arguments": '{"path": "a.py"}'})
        result = {
            "id": f"r{turn}",
            "role": "user",
            "content": [{"type": "tool-result", "toolCallId": f"c{turn}", "content": [{"type": "text", "text": "42"}]}],
            "source": {"kind": "tool", "callId": f"c{turn}"},
        }
        add("tool/result", {**base, "message": result}, surfaceOp="append")
        add("step/end", base)
        add("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
    return [decode_event(w) for w in wire]


def _generic_row_events(line: bytes) -> list[Any]:
    """The reference expansion: row -> wire dicts -> ``decode_event`` per member."""
    members = expand_chunk_row(json.loads(line))
    assert members is not None
    return [decode_event(m) for m in members]


@pytest.mark.parametrize(
    ("tag", "extra"),
    [
        ("text-chunks", {"texts": ["a", "", "é开"]}),
        ("reasoning-chunks", {"texts": ["x", "y", "z", "w"]}),
        ("tool-call-chunks", {"id": "c1", "args": ['{"a"', ":", "1}"]}),
        ("tool-call-chunks", {"id": "c1", "name": "read", "args": ["", "{", "}"]}),
    ],
)
def test_row_fast_path_builds_the_same_events_as_the_generic_expansion(tag: str, extra: dict[str, Any]) -> None:
    payload = extra.get("texts", extra.get("args"))
    assert payload is not None
    dt = [3, -1, 2**40][: len(payload) - 1]
    row = {"type": tag, "seq0": 7, "time0": -5, "data": {"turn": 2, "step": 1, "index": 3, "dt": dt, **extra}}
    line = json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode()
    events = decode_storage_line(line)
    expected = _generic_row_events(line)
    assert events == expected
    assert [encode_event(e) for e in events] == [encode_event(e) for e in expected]


@pytest.mark.parametrize("field", ["turn", "step", "index"])
def test_row_with_negative_number_reports_the_member_error(field: str) -> None:
    # Valid as a row (safe ints), invalid as events (counts are non-negative): the member's own error is reported.

    data = {"turn": 0, "step": 0, "index": 0, "dt": [1, 1], "texts": ["a", "b", "c"], field: -1}
    line = json.dumps({"type": "text-chunks", "seq0": 1, "time0": 5, "data": data}).encode()
    with pytest.raises(
        StorageLineError, match=r'invalid session event "assistant/chunk" at seq 1: Expected `int` >= 0'
    ):
        decode_storage_line(line)


def _row_outcome_reference(line: bytes) -> tuple[str, Any]:
    """What the generic path gives: ChunkRowError text, a member's EventValidationError text, or the events."""
    try:
        members = expand_chunk_row(json.loads(line))
        assert members is not None
        return ("ok", [event_to_builtins(decode_event(m)) for m in members])
    except ValueError as exc:
        return ("error", str(exc))


def _row_outcome(line: bytes) -> tuple[str, Any]:
    try:
        return ("ok", [event_to_builtins(e) for e in decode_storage_line(line)])
    except StorageLineError as exc:
        return ("error", str(exc))


def _row_variants() -> list[dict[str, Any]]:
    big = 2**53 - 1
    bases: list[dict[str, Any]] = [
        {"type": "text-chunks", "seq0": 4, "time0": 10, "data": {"turn": 1, "step": 2, "index": 0, "dt": [1, 2], "texts": ["a", "b", "c"]}},
        {"type": "reasoning-chunks", "seq0": 4, "time0": 10, "data": {"turn": 1, "step": 2, "index": 0, "dt": [0, 0], "texts": ["a", "b", "c"]}},
        {"type": "tool-call-chunks", "seq0": 4, "time0": 10, "data": {"turn": 1, "step": 2, "index": 1, "dt": [1, 1], "id": "c", "args": ["{", "", "}"]}},
        {"type": "tool-call-chunks", "seq0": 4, "time0": 10, "data": {"turn": 1, "step": 2, "index": 1, "dt": [1, 1], "id": "c", "name": "n", "args": ["{", "", "}"]}},
    ]  # fmt: skip
    bad_numbers: list[Any] = [-1, big, big + 1, -big - 1, 1.0, 1.5, True, None, "1", [1]]
    out: list[dict[str, Any]] = []
    for base in bases:
        payload = "args" if "args" in base["data"] else "texts"
        out.append(base)
        for key in ("seq0", "time0"):
            out += [dict(base, **{key: v}) for v in bad_numbers]
        for key in ("turn", "step", "index"):
            out += [dict(base, data=dict(base["data"], **{key: v})) for v in bad_numbers]
        for dt in ([], [1], [1, 2, 3], [True, 1], [1.0, 1], [big, 1], [big + 1, 0], [-big - 1, 0], "12", None):
            out.append(dict(base, data=dict(base["data"], dt=dt)))
        out.append(dict(base, time0=big - 2, data=dict(base["data"], dt=[1, 2])))  # last member's time overflows
        out.append(dict(base, time0=-big, data=dict(base["data"], dt=[-1, 1])))
        out.append(dict(base, seq0=big - 2))  # last member's seq is 2**53
        for members in ([], ["a"], [1, "a", "b"], ["a", None, "b"], "abc", None, [True, "a", "b"]):
            out.append(dict(base, data=dict(base["data"], **{payload: members})))
        for extra in ({"x": 1}, {"name": 5}, {"id": 5}, {"id": None}, {"name": None}):
            out.append(dict(base, data={**base["data"], **extra}))
        out.append(dict(base, data={k: v for k, v in base["data"].items() if k != "turn"}))
        out.append(dict(base, extra=1))
        out.append({k: v for k, v in base.items() if k != "time0"})
        out.append(dict(base, data=[1]))
    return out


@pytest.mark.parametrize("row", _row_variants())
def test_row_fast_path_agrees_with_the_generic_path(row: dict[str, Any]) -> None:
    # decode_storage_line builds valid rows' events directly; every row (valid or not) must give the generic path's
    # events or the generic path's error text.
    line = json.dumps(row, separators=(",", ":")).encode()
    assert _row_outcome(line) == _row_outcome_reference(line)


def _per_line(frame: bytes) -> list[Any] | None:
    try:
        return [e for line in frame.split(b"\n")[:-1] for e in decode_storage_line(line)]
    except StorageLineError:
        return None


def _wire(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _surface(seq: int, **override: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "assistant/message",
        "seq": seq,
        "time": 5,
        "surfaceOp": "append",
        "sourceEventSeqs": [0, 1],
        "data": {
            "turn": 1,
            "step": 0,
            "message": {
                "id": "a1",
                "role": "assistant",
                "content": [{"type": "text", "text": "hi"}],
                "source": {"kind": "model", "provider": "p", "model": "m"},
            },
        },
    }
    event.update(override)
    return event


def _continue(seq: int) -> dict[str, Any]:
    """A ``turn/continue`` without its ``ignorable`` mark (a type older readers do not know must carry it)."""
    return {"type": "turn/continue", "seq": seq, "time": 1, "data": {"turn": 2, "interruptedTurn": 1}}


def _odd_lines() -> list[bytes]:
    user = {"id": "u1", "role": "user", "content": [{"type": "text", "text": "x"}], "source": {"kind": "user"}}
    lines = [_wire(row) for row in _row_variants()]
    lines += [
        ev(3),
        ev(3, "turn/end"),
        _wire(_surface(9)),
        _wire(_surface(9, sourceEventSeqs=[])),
        _wire(_surface(9, sourceEventSeqs=[1, 1])),
        _wire(_surface(9, sourceEventSeqs=[9])),
        _wire(_surface(9, sourceEventSeqs=(3, 2**53))),
        _wire(_surface(9, surfaceOp="replace")),
        _wire({k: v for k, v in _surface(9).items() if k != "sourceEventSeqs"}),
        _wire(_surface(9, data={"turn": 1, "step": 0, "message": user})),
        _wire({"type": "user/message", "seq": 2, "time": 1, "surfaceOp": "append", "data": user}),
        _wire({"type": "x/unknown", "seq": 2, "time": 1, "data": {}, "ignorable": True}),
        *(_wire({**_continue(2), **mark}) for mark in ({}, {"ignorable": False}, {"ignorable": True})),
        b'{"type":"text-chunks","type":"turn/start","seq":1,"time":1,"data":{"turn":0}}',
        b'{"seq0":1,"type":"text-chunks","time0":2,"data":{"turn":0,"step":0,"index":0,"dt":[1],"texts":["a","b"]}}',
        b" " + ev(3) + b" ",
        ev(3) + b" " + ev(4),
        b"",
        b"   ",
        b"{",
        b"[1]",
    ]
    return lines


def test_the_odd_lines_reach_the_batch_post_checks() -> None:
    # The surface variants must be well-formed enough to decode typed, or the post-checks are never exercised.
    assert _batch(_wire(_surface(9)) + b"\n") is not None
    assert _batch(_wire(_surface(9, sourceEventSeqs=[1, 1])) + b"\n") is None
    user = {"id": "u1", "role": "user", "content": [{"type": "text", "text": "x"}], "source": {"kind": "user"}}
    assert _batch(_wire(_surface(9, data={"turn": 1, "step": 0, "message": user})) + b"\n") is None


@pytest.mark.parametrize("line", _odd_lines())
def test_batch_fast_path_of_one_line_is_the_per_line_result_or_declines(line: bytes) -> None:
    got = _batch(line + b"\n")
    if got is not None:
        assert [encode_event(e) for e in got] == [encode_event(e) for e in decode_storage_line(line)]


@pytest.mark.parametrize("line", _odd_lines())
def test_batch_decode_of_one_line_is_the_per_line_result_or_its_error(line: bytes) -> None:
    try:
        expected: tuple[str, Any] = ("ok", [encode_event(e) for e in decode_storage_line(line)])
    except StorageLineError as exc:
        expected = ("error", (str(exc), 1))
    try:
        got: tuple[str, Any] = ("ok", [encode_event(e) for e in decode_storage_lines(line + b"\n")])
    except StorageLineError as exc:
        got = ("error", (str(exc), exc.line))
    assert got == expected


@pytest.mark.parametrize("with_row", [False, True])
def test_a_batch_refuses_an_unmarked_ignorable_type_like_its_line_does(with_row: bool) -> None:
    # The batch path once took a turn/continue without "ignorable": true that the per-line path refuses.
    row = _wire(_row_variants()[0]) + b"\n" if with_row else b""
    first = len(decode_storage_lines(row)) if row else 0
    frame = row + _wire(_continue(first)) + b"\n"
    assert _batch(frame) is None
    with pytest.raises(StorageLineError, match="must be marked ignorable") as info:
        decode_storage_lines(frame)
    assert info.value.line == (2 if with_row else 1)
    marked = row + _wire({**_continue(first), "ignorable": True}) + b"\n"
    assert _batch(marked) == _per_line(marked)


def test_batch_fast_path_declines_data_that_splits_lines_differently() -> None:
    # A value spanning two lines, or two values on one line next to a blank one: never accepted as a batch.
    assert _batch(b'{"type":"turn/start","seq":0,\n"time":1,"data":{"turn":0}}\n') is None
    assert _batch(ev(0) + b" " + ev(1) + b"\n\n") is None
    assert _batch(ev(0)) is None  # no final LF
    frame = ev(0) + b"\n" + ev(1) + b"\n"
    assert _batch(frame) == _per_line(frame)


def test_batch_decode_names_the_first_bad_line_and_a_missing_final_lf() -> None:
    with pytest.raises(StorageLineError, match="JSON is malformed") as info:
        decode_storage_lines(ev(0) + b"\n{oops\n" + ev(2) + b"\n")
    assert info.value.line == 2
    with pytest.raises(StorageLineError, match="without a terminating LF") as info:
        decode_storage_lines(ev(0) + b"\n" + ev(1))
    assert info.value.line == 2
    assert decode_storage_lines(b"") == []


def test_batch_decode_of_a_realistic_log_equals_the_per_line_path() -> None:
    for pack in (True, False):
        frame = encode_storage_lines(streamed_log(turns=4), pack_chunks=pack)
        assert (b"text-chunks" in frame) is pack
        fast = _batch(frame)
        assert fast is not None
        assert fast == _per_line(frame) == decode_storage_lines(frame)


def test_storage_lines_round_trip_packed_and_plain() -> None:
    log = streamed_log(turns=3)
    for pack in (True, False):
        assert decode_storage_lines(encode_storage_lines(log, pack_chunks=pack)) == log
    assert encode_storage_lines([], pack_chunks=True) == b""


def test_first_seq_gap_and_check_contiguous() -> None:
    log = [turn_start(3), turn_end(4)]
    assert first_seq_gap(log, 3) is None
    assert first_seq_gap([], 7) is None
    assert first_seq_gap(log, 2) == 0
    assert first_seq_gap([turn_start(0), turn_end(2)]) == 1
    check_contiguous("s", 3, log)
    with pytest.raises(SeqMismatchError, match=r'append seq mismatch for "s": expected 4 at index 0, got 3'):
        check_contiguous("s", 4, log)


async def test_memory_backend_refuses_a_gapped_batch_itself(anyio_backend: object) -> None:
    # Defense in depth below the coordinator: the backend's own append checks contiguity.
    backend = MemoryBackend()
    storage = StorageMetadata(meta("gap"))
    with pytest.raises(SeqMismatchError):
        await backend.append_batch(storage, [turn_start(1)], False)
    await backend.append_batch(storage, [turn_start(0)], False)
    with pytest.raises(SeqMismatchError, match="expected 1 at index 0, got 2"):
        await backend.append_batch(storage, [turn_end(2)], True)


def test_format_refusal_names_a_damaged_id_as_json() -> None:
    # A header read raw may carry any JSON id: it is shown as JSON (null, true), the way it is stored.
    with pytest.raises(SessionFormatUnsupportedError, match=r'session "null" uses log format v99, but this harness'):
        check_format_version(None, 99, "/p")
    with pytest.raises(SessionFormatUnsupportedError, match=r'session "true" uses log format v-1, older than'):
        check_format_version(True, -1.0)
    check_format_version("s", 0)  # the current version passes
    check_format_version("s", "0")  # not a number: left to header validation


def _contiguous_reference(events: list[SessionEvent], first_seq: int) -> bool:
    return [e.seq for e in events] == list(range(first_seq, first_seq + len(events)))


@pytest.mark.parametrize("line", _odd_lines())
@pytest.mark.parametrize("first_seq", [0, 3, 4, 9])
def test_decode_from_reports_contiguity_like_the_seqs_say(line: bytes, first_seq: int) -> None:
    # Fast path (line by line) and per-line fallback alike: the flag is exactly "seqs are first_seq, first_seq+1...".
    def outcome(decode: Any) -> tuple[str, Any]:
        try:
            return ("ok", decode())
        except StorageLineError as exc:
            return ("error", (str(exc), exc.line))

    plain = outcome(lambda: decode_storage_lines(line + b"\n"))
    got = outcome(lambda: decode_storage_lines_from(line + b"\n", first_seq))
    if plain[0] == "error":
        assert got == plain
    else:
        assert got == ("ok", (plain[1], _contiguous_reference(plain[1], first_seq)))


def test_decode_from_follows_contiguity_across_rows_and_events() -> None:
    events = streamed_log(turns=3)
    for pack in (True, False):
        frame = encode_storage_lines(events, pack_chunks=pack)
        assert decode_storage_lines_from(frame, 0) == (events, True)
        assert decode_storage_lines_from(frame, 1) == (events, False)
        lines = frame.split(b"\n")[:-1]
        for cut in range(1, len(lines)):  # a batch starting at any line: contiguous from that line's first seq
            tail = b"\n".join(lines[cut:]) + b"\n"
            decoded = decode_storage_lines(tail)
            assert decode_storage_lines_from(tail, decoded[0].seq) == (decoded, True)
        dropped = b"\n".join(lines[:2] + lines[3:]) + b"\n"  # one line missing in the middle: a gap
        assert decode_storage_lines_from(dropped, 0)[1] is False
