"""Packed chunk rows (spec session-core §6, scenarios 54-59)."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from dsh.session_persistence._model.jsonvalue import MAX_SAFE_INTEGER
from dsh.session_persistence._wire.chunk_rows import (
    CHUNK_ROW_TAGS,
    MIN_RUN,
    ChunkRowError,
    expand_chunk_row,
    expand_chunk_rows,
    pack_chunk_rows,
    row_member_count,
)
from dsh.session_persistence._wire.codec import decode_event, encode_event
from hypothesis import example, given
from hypothesis import strategies as st

Event = dict[str, Any]


def _chunk_event(seq: int, time: int, chunk: dict[str, Any], turn: int = 1, step: int = 1) -> Event:
    return {"type": "assistant/chunk", "seq": seq, "time": time, "data": {"turn": turn, "step": step, "chunk": chunk}}


def text(seq: int, time: int, t: str, *, kind: str = "text-delta", index: int = 0, **kw: int) -> Event:
    return _chunk_event(seq, time, {"type": kind, "index": index, "text": t}, **kw)


def tool(seq: int, time: int, args: str, *, id: str = "call-1", name: str | None = None, index: int = 0) -> Event:
    chunk: dict[str, Any] = {"type": "tool-call-delta", "index": index, "id": id}
    if name is not None:
        chunk["name"] = name
    chunk["argumentsDelta"] = args
    return _chunk_event(seq, time, chunk)


def json_round_trip(values: object) -> Any:
    return msgspec.json.decode(msgspec.json.encode(values))


def round_trips(batch: list[Event]) -> list[object]:
    packed = pack_chunk_rows(batch)
    decoded = expand_chunk_rows(json_round_trip(packed))
    assert decoded == batch
    return decoded


def test_constants() -> None:
    assert MIN_RUN == 3
    assert frozenset({"text-chunks", "reasoning-chunks", "tool-call-chunks"}) == CHUNK_ROW_TAGS


# --- scenario 54 -----------------------------------------------------------------------------------


def test_five_text_deltas_pack_into_one_row_byte_for_byte() -> None:
    batch = [text(k, 1000 + 10 * k, f"t{k}") for k in range(5)]
    packed = pack_chunk_rows(batch)
    assert packed == [
        {
            "type": "text-chunks",
            "seq0": 0,
            "time0": 1000,
            "data": {"turn": 1, "step": 1, "index": 0, "dt": [10, 10, 10, 10], "texts": ["t0", "t1", "t2", "t3", "t4"]},
        }
    ]
    assert msgspec.json.encode(packed[0]) == (
        b'{"type":"text-chunks","seq0":0,"time0":1000,"data":{"turn":1,"step":1,"index":0,'
        b'"dt":[10,10,10,10],"texts":["t0","t1","t2","t3","t4"]}}'
    )
    assert row_member_count(packed[0]) == 5
    decoded = expand_chunk_rows(json_round_trip(packed))
    assert decoded == batch
    # byte-for-byte: the expanded events re-encode exactly like the originals
    assert [msgspec.json.encode(e) for e in decoded] == [msgspec.json.encode(e) for e in batch]


def test_reasoning_run_and_named_tool_run_get_their_own_tags() -> None:
    batch = [text(k, 50, f"r{k}", kind="reasoning-delta") for k in range(3)]
    batch += [tool(3 + k, 60 + k, f'{{"a{k}"', name="read_file", index=1) for k in range(4)]
    packed = pack_chunk_rows(batch)
    assert [row["type"] for row in packed] == ["reasoning-chunks", "tool-call-chunks"]
    assert packed[0]["data"] == {"turn": 1, "step": 1, "index": 0, "dt": [0, 0], "texts": ["r0", "r1", "r2"]}
    assert packed[1] == {
        "type": "tool-call-chunks",
        "seq0": 3,
        "time0": 60,
        "data": {
            "turn": 1,
            "step": 1,
            "index": 1,
            "dt": [1, 1, 1],
            "id": "call-1",
            "name": "read_file",
            "args": ['{"a0"', '{"a1"', '{"a2"', '{"a3"'],
        },
    }
    assert list(packed[1]["data"]) == ["turn", "step", "index", "dt", "id", "name", "args"]
    decoded = round_trips(batch)
    # Expanded members come in the events' own wire form (the struct's field order: a named tool-call delta has its
    # name after argumentsDelta), the form the typed readers decode the same row to.
    assert [msgspec.json.encode(e) for e in decoded] == [encode_event(decode_event(e)) for e in batch]


def test_nameless_tool_run_has_no_name_key_anywhere() -> None:
    batch = [tool(k, 7, f"x{k}") for k in range(3)]
    (row,) = pack_chunk_rows(batch)
    assert row["type"] == "tool-call-chunks"
    assert "name" not in row["data"]
    assert list(row["data"]) == ["turn", "step", "index", "dt", "id", "args"]
    decoded = round_trips(batch)
    for event in decoded:
        assert "name" not in event["data"]["chunk"]  # type: ignore[index]


# --- scenario 55 -----------------------------------------------------------------------------------


def _verbatim_cases() -> list[tuple[str, list[Event]]]:
    t = text
    cases: list[tuple[str, list[Event]]] = [
        ("run of 2", [t(0, 0, "a"), t(1, 0, "b")]),
        ("seq gap", [t(0, 0, "a"), t(1, 0, "b"), t(3, 0, "c"), t(4, 0, "d")]),
        ("kind switch", [t(0, 0, "a"), t(1, 0, "b"), t(2, 0, "c", kind="reasoning-delta"), t(3, 0, "d")]),
        ("index switch", [t(0, 0, "a"), t(1, 0, "b"), t(2, 0, "c", index=1), t(3, 0, "d", index=1)]),
        ("step switch", [t(0, 0, "a"), t(1, 0, "b"), t(2, 0, "c", step=2), t(3, 0, "d", step=2)]),
        ("turn switch", [t(0, 0, "a"), t(1, 0, "b"), t(2, 0, "c", turn=2), t(3, 0, "d", turn=2)]),
        ("id switch", [tool(0, 0, "a"), tool(1, 0, "b"), tool(2, 0, "c", id="call-2"), tool(3, 0, "d", id="call-2")]),
        (
            "name presence switch",
            [tool(0, 0, "a"), tool(1, 0, "b"), tool(2, 0, "c", name="n"), tool(3, 0, "d", name="n")],
        ),
        (
            "name value switch",
            [
                tool(0, 0, "a", name="m"),
                tool(1, 0, "b", name="m"),
                tool(2, 0, "c", name="n"),
                tool(3, 0, "d", name="n"),
            ],
        ),
    ]
    extra_key = [t(0, 0, "a"), t(1, 0, "b"), t(2, 0, "c")]
    extra_key[1]["ignorable"] = True
    cases.append(("extra envelope key", extra_key))
    non_string = [t(0, 0, "a"), t(1, 0, "b"), t(2, 0, "c")]
    non_string[1]["data"]["chunk"]["text"] = 5
    cases.append(("non-string text", non_string))
    cases.append(("fractional time", [t(0, 0, "a"), t(1, 0.5, "b"), t(2, 1, "c")]))  # type: ignore[arg-type]
    far = [t(0, -MAX_SAFE_INTEGER, "a"), t(1, -MAX_SAFE_INTEGER, "b"), t(2, MAX_SAFE_INTEGER, "c")]
    far.append(t(3, MAX_SAFE_INTEGER, "d"))
    cases.append(("time gap beyond safe range", far))
    return cases


@pytest.mark.parametrize(("name", "batch"), _verbatim_cases(), ids=[n for n, _ in _verbatim_cases()])
def test_broken_or_short_runs_are_stored_verbatim(name: str, batch: list[Event]) -> None:
    packed = pack_chunk_rows(batch)
    assert packed == batch
    assert all(out is original for out, original in zip(packed, batch, strict=True))
    assert expand_chunk_rows(packed) == batch


@pytest.mark.parametrize(
    "mutate",
    [
        lambda e: e.__setitem__("surfaceOp", "append"),
        lambda e: e.__setitem__("seq", -1),
        lambda e: e.__setitem__("seq", True),
        lambda e: e.__setitem__("time", 2**53),
        lambda e: e["data"].__setitem__("extra", 1),
        lambda e: e["data"].__setitem__("turn", 1.0),
        lambda e: e["data"].__setitem__("step", "1"),
        lambda e: e["data"]["chunk"].__setitem__("index", 0.0),
        lambda e: e["data"]["chunk"].__setitem__("extra", 1),
        lambda e: e.__setitem__("type", "assistant/message"),
        lambda e: e.__setitem__("data", None),
    ],
)
def test_any_non_whitelisted_member_stays_verbatim(mutate: Any) -> None:
    batch = [text(k, k, f"t{k}") for k in range(3)]
    mutate(batch[1])
    packed = pack_chunk_rows(batch)
    assert packed == batch


@pytest.mark.parametrize(
    "chunk",
    [
        {"type": "block-start", "index": 0, "kind": "text"},
        {"type": "block-end", "index": 0},
        {"type": "usage", "inputTokens": 1},
        {"type": "finish", "reason": "stop"},
        {"type": "future-delta", "index": 0, "text": "x"},
        {"type": "tool-call-delta", "index": 0, "id": "c", "name": 5, "argumentsDelta": "x"},
        {"type": "tool-call-delta", "index": 0, "id": 1, "argumentsDelta": "x"},
    ],
)
def test_boundary_and_unknown_chunks_are_never_packed(chunk: dict[str, Any]) -> None:
    batch = [_chunk_event(k, 0, copy.deepcopy(chunk)) for k in range(4)]
    assert pack_chunk_rows(batch) == batch


def test_runs_pack_on_both_sides_of_a_boundary_chunk_and_min_run_is_exact() -> None:
    batch = [text(k, k, "a") for k in range(3)]
    batch.append(_chunk_event(3, 3, {"type": "block-end", "index": 0}))
    batch += [text(4 + k, 4 + k, "b", index=1) for k in range(2)]  # a run of 2 stays verbatim
    packed = pack_chunk_rows(batch)
    assert [p["type"] for p in packed] == ["text-chunks", "assistant/chunk", "assistant/chunk", "assistant/chunk"]
    assert packed[1:] == batch[3:]
    round_trips(batch)


def test_packing_is_stateless_per_batch() -> None:
    batch = [text(k, k, "x") for k in range(4)]
    assert pack_chunk_rows(batch[:2]) == batch[:2]
    assert pack_chunk_rows(batch[2:]) == batch[2:]
    assert [r["type"] for r in pack_chunk_rows(batch)] == ["text-chunks"]


# --- scenario 56 -----------------------------------------------------------------------------------


def test_negative_dt_round_trips() -> None:
    batch = [text(0, 1000, "a"), text(1, 990, "b"), text(2, 995, "c")]
    (row,) = pack_chunk_rows(batch)
    assert row["time0"] == 1000
    assert row["data"]["dt"] == [-10, 5]
    round_trips(batch)


def test_full_safe_range_times_round_trip() -> None:
    batch = [text(0, MAX_SAFE_INTEGER, "a"), text(1, 0, "b"), text(2, -MAX_SAFE_INTEGER + 1, "c")]
    (row,) = pack_chunk_rows(batch)
    assert row["data"]["dt"] == [-MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER + 1]
    round_trips(batch)


# --- scenario 57 -----------------------------------------------------------------------------------


def _good_text_row() -> dict[str, Any]:
    return {
        "type": "text-chunks",
        "seq0": 4,
        "time0": 100,
        "data": {"turn": 1, "step": 1, "index": 0, "dt": [1, 1], "texts": ["a", "b", "c"]},
    }


def _good_tool_row() -> dict[str, Any]:
    return {
        "type": "tool-call-chunks",
        "seq0": 0,
        "time0": 0,
        "data": {"turn": 1, "step": 1, "index": 0, "dt": [0, 0], "id": "c", "name": "n", "args": ["a", "b", "c"]},
    }


def _with(row: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    row = copy.deepcopy(row)
    target = row
    *parents, last = path.split(".")
    for p in parents:
        target = target[p]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return row


_DELETE = object()

_MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("non-object data", _with(_good_text_row(), "data", [1]), "data must be an object"),
    ("extra envelope key", _with(_good_text_row(), "extra", 1), "envelope must be exactly"),
    ("seq0 -1", _with(_good_text_row(), "seq0", -1), "seq0 must be a non-negative safe integer"),
    ("time0 inf", _with(_good_text_row(), "time0", float("inf")), "time0 must be a safe integer"),
    ("time0 1.5", _with(_good_text_row(), "time0", 1.5), "time0 must be a safe integer"),
    (
        "wrong payload key",
        _with(_with(_good_text_row(), "data.texts", _DELETE), "data.args", ["a", "b", "c"]),
        "data must be exactly {turn, step, index, dt, texts}",
    ),
    ("non-string member", _with(_good_text_row(), "data.texts", ["a", 1, "c"]), "texts must be a non-empty list"),
    ("empty members", _with(_with(_good_text_row(), "data.texts", []), "data.dt", []), "non-empty list of strings"),
    ("dt arity", _with(_good_text_row(), "data.dt", [1]), "dt length 1 does not match 3 members"),
    ("NaN gap", _with(_good_text_row(), "data.dt", [1, float("nan")]), "dt must be a list of safe integers"),
    ("0.5 gap", _with(_good_text_row(), "data.dt", [0.5, 1]), "dt must be a list of safe integers"),
    ("seq leaves safe range", _with(_good_text_row(), "seq0", MAX_SAFE_INTEGER - 1), "member seqs must stay safe"),
    ("time leaves safe range", _with(_good_text_row(), "time0", MAX_SAFE_INTEGER - 1), "member times must stay safe"),
    ("non-numeric turn", _with(_good_text_row(), "data.turn", "1"), "turn/step/index must be safe integers"),
    ("tool row without id", _with(_good_tool_row(), "data.id", _DELETE), "data must be exactly {turn, step, index"),
    ("tool row non-string id", _with(_good_tool_row(), "data.id", 7), "id (and name when present) must be strings"),
    ("tool row non-string name", _with(_good_tool_row(), "data.name", None), "id (and name when present)"),
]


def test_there_are_17_reference_malformed_cases() -> None:
    assert len(_MALFORMED) == 17


@pytest.mark.parametrize(("row", "why"), [(r, w) for _, r, w in _MALFORMED], ids=[n for n, _, _ in _MALFORMED])
def test_malformed_rows_are_refused(row: dict[str, Any], why: str) -> None:
    tag = row["type"]
    prefix = f"malformed {tag} storage row: "
    with pytest.raises(ChunkRowError) as info:
        expand_chunk_row(row)
    assert str(info.value).startswith(prefix)
    assert why in str(info.value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(ChunkRowError, match=f"^malformed {tag} storage row: "):
        expand_chunk_rows([{"type": "x"}, row])
    with pytest.raises(ChunkRowError):
        row_member_count(row)


@pytest.mark.parametrize(
    ("row", "why"),
    [
        (_with(_good_text_row(), "seq0", True), "seq0"),
        (_with(_good_text_row(), "time0", -(2**53)), "time0"),
        (_with(_good_text_row(), "data.step", 1.0), "turn/step/index"),
        (_with(_good_text_row(), "data.index", None), "turn/step/index"),
        (_with(_good_text_row(), "data.dt", "1,1"), "dt must be a list"),
        (_with(_good_text_row(), "data.dt", [1, 2**53]), "dt must be a list of safe integers"),
        (_with(_good_text_row(), "data.texts", "abc"), "texts must be a non-empty list"),
        (_with(_good_text_row(), "seq0", _DELETE), "envelope must be exactly"),
        (_with(_good_tool_row(), "data.args", ["a", None, "c"]), "args must be a non-empty list"),
        (_with(_good_tool_row(), "data.extra", 1), "data must be exactly {turn, step, index, dt, id, name?, args}"),
        (_with(_good_tool_row(), "data", "x"), "data must be an object"),
        ({**_good_text_row(), "type": "reasoning-chunks", "data": {}}, "data must be exactly"),
    ],
)
def test_more_malformed_rows(row: dict[str, Any], why: str) -> None:
    with pytest.raises(ChunkRowError, match=f"^malformed {row['type']} storage row: .*") as info:
        expand_chunk_row(row)
    assert why in info.value.why


def test_valid_rows_at_the_edges_of_the_safe_range_expand() -> None:
    row = _with(_good_text_row(), "seq0", MAX_SAFE_INTEGER - 2)
    row = _with(row, "time0", MAX_SAFE_INTEGER - 2)
    events = expand_chunk_row(row)
    assert events is not None
    assert [e["seq"] for e in events] == [MAX_SAFE_INTEGER - 2, MAX_SAFE_INTEGER - 1, MAX_SAFE_INTEGER]
    assert [e["time"] for e in events] == [MAX_SAFE_INTEGER - 2, MAX_SAFE_INTEGER - 1, MAX_SAFE_INTEGER]


def test_single_member_row_is_valid_on_read() -> None:
    row = {
        "type": "text-chunks",
        "seq0": 9,
        "time0": 5,
        "data": {"turn": 2, "step": 3, "index": 4, "dt": [], "texts": [""]},
    }
    assert expand_chunk_row(row) == [text(9, 5, "", index=4, turn=2, step=3)]
    assert row_member_count(row) == 1


def test_expanded_events_share_nothing_with_the_row() -> None:
    row = _good_tool_row()
    events = expand_chunk_row(row)
    assert events is not None
    events[0]["data"]["chunk"]["id"] = "changed"
    events[0]["data"]["turn"] = 99
    assert events[1]["data"]["chunk"]["id"] == "c"
    assert events[1]["data"]["turn"] == 1
    assert row == _good_tool_row()


# --- scenario 58 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "junk",
        None,
        42,
        [1, 2],
        {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}},
        {"type": ["text-chunks"]},
        {"type": "session", "version": 0},
        {"seq0": 0},
    ],
)
def test_non_rows_pass_through_decode_unchanged(value: object) -> None:
    assert expand_chunk_row(value) is None
    out = expand_chunk_rows([value])
    assert out == [value]
    assert out[0] is value
    with pytest.raises(ValueError, match="not a chunk storage row"):
        row_member_count(value)


def test_mixed_stream_decodes_in_order() -> None:
    plain = {"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}
    row = _good_text_row()
    row["seq0"] = 1
    tail = {"type": "turn/end", "seq": 4, "time": 2, "data": {"turn": 1, "reason": {"kind": "completed"}}}
    out = expand_chunk_rows([plain, row, tail])
    assert [e["seq"] for e in out] == [0, 1, 2, 3, 4]  # type: ignore[index]
    assert out[0] is plain
    assert out[4] is tail


# --- scenario 59: property -------------------------------------------------------------------------

_safe_time = st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)


@st.composite
def _member(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """A chunk (delta or boundary) and a time; seq is assigned by the batch."""
    kind = draw(
        st.sampled_from(
            ["text-delta", "text-delta", "reasoning-delta", "tool-call-delta", "tool-call-delta", "block-end", "usage"]
        )
    )
    index = draw(st.integers(0, 1))
    short = st.text(max_size=3)  # msgspec decodes any valid str; surrogates are excluded by hypothesis text
    if kind in ("text-delta", "reasoning-delta"):
        chunk: dict[str, Any] = {"type": kind, "index": index, "text": draw(short)}
    elif kind == "tool-call-delta":
        chunk = {"type": kind, "index": index, "id": draw(st.sampled_from(["c1", "c2"]))}
        name = draw(st.sampled_from([None, "read", "grep"]))
        if name is not None:
            chunk["name"] = name
        chunk["argumentsDelta"] = draw(short)
    elif kind == "block-end":
        chunk = {"type": "block-end", "index": index}
    else:
        chunk = {"type": "usage", "inputTokens": draw(st.integers(0, 10))}
    return chunk, draw(_safe_time)


@st.composite
def _batches(draw: st.DrawFn) -> list[Event]:
    start = draw(st.integers(0, 1000) | st.just(MAX_SAFE_INTEGER - 40))
    n = draw(st.integers(0, 40))
    # times: mostly small steps (so runs form), sometimes a jump anywhere in the safe range
    time = draw(_safe_time)
    batch: list[Event] = []
    turn, step = draw(st.integers(0, 1)), draw(st.integers(0, 1))
    for k in range(n):
        chunk, jump = draw(_member())
        if draw(st.integers(0, 9)) == 0:
            time = jump
        else:
            time = max(-MAX_SAFE_INTEGER, min(MAX_SAFE_INTEGER, time + draw(st.integers(-20, 20))))
        if draw(st.integers(0, 7)) == 0:
            turn, step = draw(st.integers(0, 1)), draw(st.integers(0, 1))
        batch.append(_chunk_event(start + k, time, chunk, turn=turn, step=step))
    return batch


_NAMED_DELTA = {"type": "tool-call-delta", "index": 1, "id": "c1", "name": "read", "argumentsDelta": ""}


@given(_batches())
@example([_chunk_event(5 + k, 0, dict(_NAMED_DELTA), turn=0, step=0) for k in range(3)])  # writer order: name first
def test_property_pack_then_expand_is_identity_after_json_round_trip(batch: list[Event]) -> None:
    original = copy.deepcopy(batch)
    packed = pack_chunk_rows(batch)
    assert batch == original  # packing never mutates its input
    decoded = expand_chunk_rows(json_round_trip(packed))
    assert decoded == original
    # Same values and the same JSON types (1 never comes back as 1.0, a string never as a number). Key order is
    # not part of it: an expanded named tool-call delta has the model's order (``name`` last), whatever order
    # the writer used (hypothesis found the writer-order comparison failing after the packer was unified).
    assert [msgspec.json.encode(e, order="sorted") for e in decoded] == [
        msgspec.json.encode(e, order="sorted") for e in original
    ]
    # every row is valid, carries >= MIN_RUN members, and the counts add up
    total = 0
    for line in packed:
        if line.get("type") in CHUNK_ROW_TAGS:
            count = row_member_count(line)
            assert count >= MIN_RUN
            total += count
        else:
            total += 1
    assert total == len(original)
