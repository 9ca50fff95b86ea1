"""The typed chunk packer writes the same bytes as packing the batch's plain-JSON form (``pack_chunk_rows``).

``encode_storage_lines(events, pack_chunks=True)`` packs ``assistant/chunk`` structs from their attributes; the
plain-JSON packer is the rule. Events are built by hand, so a struct may hold what decoding would refuse (out of
range or negative numbers, ``bool``, ``IntEnum``, ``float``, a dict chunk or payload, ``ignorable``): every case
must give exactly the reference bytes.
"""

from __future__ import annotations

import enum
import os
from typing import Any

import msgspec
from dsh.session_persistence.backend import (
    decode_storage_line,
    decode_storage_lines,
    encode_storage_lines,
    expand_chunk_rows,
    pack_chunk_rows,
)
from dsh.session_persistence.events import (
    AssistantChunk,
    AssistantChunkData,
    BlockStartChunk,
    FinishChunk,
    FinishReason,
    ReasoningDeltaChunk,
    TextDeltaChunk,
    ToolCallDeltaChunk,
    TurnStart,
    TurnStartData,
)
from hypothesis import given, settings
from hypothesis import strategies as st

MAX = 2**53 - 1
_encoder = msgspec.json.Encoder()


class Level(enum.IntEnum):
    ONE = 1


def reference(events: list[Any]) -> bytes:
    """The rule: pack the plain-JSON form of the whole batch, encode each value."""
    return b"\n".join(_encoder.encode(v) for v in pack_chunk_rows(msgspec.to_builtins(events))) + b"\n"


# A number as a hand-built struct may hold it: mostly small, sometimes at or past the safe edges, or not an int.
_odd_number = st.sampled_from([-1, MAX, MAX + 1, -MAX, -MAX - 1, True, False, Level.ONE, 1.0])
_odd_text = st.sampled_from([Level.ONE, 7])


@st.composite
def _batch(draw: st.DrawFn) -> list[Any]:
    """A batch of mostly one chunk kind (so runs form). Each oddity is drawn once per batch and then applied to a
    stretch of consecutive events, so a run can consist of odd members."""
    usual_kind = draw(st.integers(0, 3))
    odd: dict[str, Any] = {
        "index": draw(_odd_number | st.just(1)),
        "text": draw(_odd_text),
        "name": draw(st.sampled_from(["read", 3])),
        "id": draw(st.sampled_from(["c2", 5])),
        "turn": draw(_odd_number),
        "seq": draw(_odd_number),
    }
    seq = draw(st.integers(-3, 5) | st.just(MAX - 5))
    time = draw(st.integers(0, 100) | st.just(MAX - 50) | st.just(-MAX))
    events: list[Any] = []
    active: set[str] = set()
    for _ in range(draw(st.integers(0, 30))):
        if draw(st.integers(0, 5)) == 0:  # start or stop a stretch of one oddity (or of none)
            active = {draw(st.sampled_from(["none", *odd, "ignorable", "dict-data", "kind"]))}
        if draw(st.integers(0, 29)) == 0:
            events.append(TurnStart(seq=seq, time=time, data=TurnStartData(turn=1)))
        else:
            kind = draw(st.integers(0, 6)) if "kind" in active else usual_kind
            index = odd["index"] if "index" in active else 0
            text = odd["text"] if "text" in active else draw(st.sampled_from(["a", "b ", "", "ü"]))
            chunk: Any
            if kind == 0:
                chunk = TextDeltaChunk(index=index, text=text)
            elif kind == 1:
                chunk = ReasoningDeltaChunk(index=index, text=text)
            elif kind in (2, 3):
                name = odd["name"] if "name" in active else ("read" if kind == 3 else msgspec.UNSET)
                call_id = odd["id"] if "id" in active else "c1"
                chunk = ToolCallDeltaChunk(index=index, id=call_id, arguments_delta=text, name=name)
            elif kind == 4:
                chunk = BlockStartChunk(index=index, block_type="text")
            elif kind == 5:
                chunk = FinishChunk(reason=FinishReason(kind="stop"))
            else:
                chunk = {"type": "text-delta", "index": 0, "text": text}  # a dict chunk (hand-built)
            turn = odd["turn"] if "turn" in active else 1
            data: Any = AssistantChunkData(turn=turn, step=1, chunk=chunk)
            if "dict-data" in active:
                data = msgspec.to_builtins(data)
            ignorable: Any = True if "ignorable" in active else msgspec.UNSET
            event_seq = odd["seq"] if "seq" in active else seq
            events.append(AssistantChunk(seq=event_seq, time=time, data=data, ignorable=ignorable))
        seq += 1 if draw(st.integers(0, 7)) else draw(st.sampled_from([0, 2, -1]))
        if draw(st.integers(0, 9)):
            time += draw(st.integers(-3, 3))
        else:
            time = draw(st.sampled_from([MAX, -MAX, 10, MAX + 1]))
    return events


@settings(max_examples=1000, deadline=None)
@given(_batch())
def test_typed_packing_writes_the_plain_json_packers_bytes(events: list[Any]) -> None:
    if not events:
        assert encode_storage_lines(events, pack_chunks=True) == b""
        return
    assert encode_storage_lines(events, pack_chunks=True) == reference(events)


def test_a_streamed_answer_packs_into_one_row_per_block() -> None:
    events: list[Any] = [TurnStart(seq=0, time=5, data=TurnStartData(turn=1))]
    for i, token in enumerate(["he", "llo ", "wor", "ld"]):
        events.append(
            AssistantChunk(
                seq=1 + i,
                time=10 + i,
                data=AssistantChunkData(turn=1, step=1, chunk=TextDeltaChunk(index=0, text=token)),
            )
        )
    for i, args in enumerate(['{"p"', ':"a"', "}"]):
        chunk = ToolCallDeltaChunk(index=1, id="c1", arguments_delta=args, name="read" if i == 0 else msgspec.UNSET)
        events.append(AssistantChunk(seq=5 + i, time=20, data=AssistantChunkData(turn=1, step=1, chunk=chunk)))
    lines = encode_storage_lines(events, pack_chunks=True).splitlines()
    assert msgspec.json.decode(lines[1]) == {
        "type": "text-chunks",
        "seq0": 1,
        "time0": 10,
        "data": {"turn": 1, "step": 1, "index": 0, "dt": [1, 1, 1], "texts": ["he", "llo ", "wor", "ld"]},
    }
    # The named first tool delta and the nameless rest are different runs: all three stay verbatim (run of 1 + 2).
    assert len(lines) == 2 + 3
    assert encode_storage_lines(events, pack_chunks=True) == reference(events)


@st.composite
def _stream(draw: st.DrawFn) -> list[Any]:
    """A well-formed streamed batch: contiguous seqs, safe times, valid counts; deltas of a few blocks and kinds
    (tool calls named and nameless), with boundary chunks and other events between the runs."""
    seq = draw(st.integers(0, 5) | st.just(MAX - 40))
    time = draw(st.integers(-MAX + 200, MAX - 5000))  # 40 events move it by at most 4,000
    events: list[Any] = []
    for _ in range(draw(st.integers(0, 40))):
        shape = draw(st.integers(0, 12))
        text = draw(st.sampled_from(["a", "b ", "", "ü", '{"x"']))
        index = draw(st.integers(0, 1))
        chunk: Any
        if shape <= 4:
            chunk = TextDeltaChunk(index=index, text=text)
        elif shape <= 6:
            chunk = ReasoningDeltaChunk(index=index, text=text)
        elif shape <= 9:
            name = draw(st.sampled_from([msgspec.UNSET, "read"]))
            chunk = ToolCallDeltaChunk(index=index, id="c1", arguments_delta=text, name=name)
        elif shape == 10:
            chunk = BlockStartChunk(index=index, block_type="text")
        elif shape == 11:
            chunk = FinishChunk(reason=FinishReason(kind="stop"))
        else:
            events.append(TurnStart(seq=seq, time=time, data=TurnStartData(turn=1)))
            seq += 1
            continue
        events.append(AssistantChunk(seq=seq, time=time, data=AssistantChunkData(turn=1, step=1, chunk=chunk)))
        seq += 1
        time += draw(st.integers(-3, 3) | st.just(100))
    return events


@settings(max_examples=1000 if os.environ.get("DSH_LONG") == "1" else 50, deadline=None)
@given(_stream())
def test_every_reader_unpacks_what_the_packer_wrote(events: list[Any]) -> None:
    """Round trip through the one packer and the one unpacker, on every reading path: the batch decoder, the line
    decoder and the plain-JSON expansion give back the events (and the plain packer writes the same bytes)."""
    stored = encode_storage_lines(events, pack_chunks=True)
    assert stored == (reference(events) if events else b"")
    assert decode_storage_lines(stored) == events
    lines = stored.split(b"\n")[:-1]
    assert [e for line in lines for e in decode_storage_line(line)] == events
    assert expand_chunk_rows([msgspec.json.decode(line) for line in lines]) == msgspec.to_builtins(events)
