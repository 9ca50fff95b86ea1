"""The batch encoder writes exactly the bytes of the 0.3 encoder, for every kind of batch a live session produces.

``encode_storage_lines`` is what every backend's durable write stores; making it cheaper must not move a byte. The
oracle here is the encoder as it stood before it was tuned, kept verbatim in this module: every event encoded from
its plain-JSON form, and the batch packed by the plain-JSON packer's original loop (runs of >= 3 same-block deltas
with contiguous seqs and safe time gaps become one row). Batches are generated as wire events and decoded, so they
hold what a live append holds: surface ops, source seqs, unicode, every chunk kind, seq gaps and time jumps.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from dsh.session_persistence._model.jsonvalue import MAX_SAFE_INTEGER, NotLosslessJsonError
from dsh.session_persistence._wire.chunk_rows import MIN_RUN, build_row, run_key
from dsh.session_persistence._wire.codec import decode_event
from dsh.session_persistence._wire.storage_lines import encode_storage_lines
from dsh.session_persistence.events import OpaqueEvent
from hypothesis import given, settings
from hypothesis import strategies as st

_encoder = msgspec.json.Encoder()
_EDGE = MAX_SAFE_INTEGER - 400_000  # 60 events move the time by less than 300,000 from here


def _old_pack(values: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The packer loop of 0.3 (``pack_runs`` over ``run_key``), frozen here as the oracle."""
    out: list[dict[str, Any]] = []
    run: list[tuple[tuple[object, ...], int, int, str, dict[str, Any]]] = []

    def flush() -> None:
        if len(run) >= MIN_RUN:
            out.append(build_row(run[0][0], [(m[1], m[2], m[3]) for m in run]))
        else:
            out.extend(m[4] for m in run)
        run.clear()

    for value in values:
        key = run_key(value)
        if key is None:
            flush()
            out.append(value)
            continue
        chunk = value["data"]["chunk"]
        member = (
            key,
            value["seq"],
            value["time"],
            chunk["argumentsDelta"] if key[0] == "tool-call-delta" else chunk["text"],
        )
        if run:
            prev = run[-1]
            if member[0] == prev[0] and member[1] == prev[1] + 1 and abs(member[2] - prev[2]) <= MAX_SAFE_INTEGER:
                run.append((*member, value))
                continue
            flush()
        run.append((*member, value))
    flush()
    return out


def old_encoding(events: list[Any], *, pack_chunks: bool) -> bytes:
    if not events:
        return b""
    values = msgspec.to_builtins(events)
    if pack_chunks:
        values = _old_pack(values)
    return b"".join(_encoder.encode(v) + b"\n" for v in values)


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["", "ü", "日本語", "🙂 ok", '"q"\\', "\u2028", "a\nb"]
)


@st.composite
def _wire_batch(draw: st.DrawFn) -> list[Any]:
    """Wire events of one or more turns as a live session appends them, decoded to typed events."""
    seq = draw(st.integers(0, 50) | st.just(MAX_SAFE_INTEGER - 300))
    time = draw(st.integers(-_EDGE, _EDGE))
    turn = draw(st.integers(0, 300))
    step = draw(st.integers(0, 3))
    wire: list[dict[str, Any]] = []
    chunk_seqs: list[int] = []
    call_seqs: list[int] = []

    def env(etype: str, data: dict[str, Any], **extra: Any) -> None:
        nonlocal seq, time
        wire.append({"type": etype, "seq": seq, "time": time, "data": data, **extra})
        seq += draw(st.sampled_from([1] * 12 + [0, 2]))  # now and then a gap or a repeat: runs must break
        jump = draw(st.sampled_from([0, 1, 3, -2] * 3 + [5000, None]))
        if jump is None:  # to the far edge: a gap no safe integer holds, so a run must break here
            time = _EDGE if time < 0 else -_EDGE
        else:
            time += jump

    base = {"turn": turn, "step": step}
    for _ in range(draw(st.integers(1, 60))):
        shape = draw(st.integers(0, 20))
        index = draw(st.integers(0, 2))
        if shape <= 7:
            chunk_seqs.append(seq)
            env("assistant/chunk", {**base, "chunk": {"type": "text-delta", "index": index, "text": draw(_text)}})
        elif shape <= 9:
            chunk_seqs.append(seq)
            env("assistant/chunk", {**base, "chunk": {"type": "reasoning-delta", "index": index, "text": draw(_text)}})
        elif shape <= 11:  # a burst of one call's deltas (named or not), as a provider streams its arguments
            named = draw(st.booleans())
            for _ in range(draw(st.integers(1, 5))):
                chunk: dict[str, Any] = {"type": "tool-call-delta", "index": index, "id": f"c{index}"}
                if named:
                    chunk["name"] = draw(st.sampled_from(["read", "ü"]))
                chunk["argumentsDelta"] = draw(_text)
                chunk_seqs.append(seq)
                env("assistant/chunk", {**base, "chunk": chunk})
        elif shape == 12:
            env("assistant/chunk", {**base, "chunk": {"type": "block-start", "index": index, "blockType": "text"}})
        elif shape == 13:
            env("assistant/chunk", {**base, "chunk": {"type": "usage", "usage": {"inputTokens": 3, "outputTokens": 1}}})
        elif shape == 14:
            env("assistant/chunk", {**base, "chunk": {"type": "finish", "reason": {"kind": "tool-calls"}}})
        elif shape == 15:
            content = [{"type": "text", "text": draw(_text)}]
            message = {"id": f"u{seq}", "role": "user", "content": content, "source": {"kind": "user"}}
            env("user/message", message, surfaceOp="append")
        elif shape == 16:
            source = {"kind": "model", "provider": "openai", "model": "m"}
            content = [{"type": "text", "text": draw(_text)}]
            message = {"id": f"a{seq}", "role": "assistant", "content": content, "source": source}
            seqs = sorted({s for s in chunk_seqs if s < seq})
            extra: dict[str, Any] = {"surfaceOp": "append"}
            if draw(st.booleans()):
                extra["sourceEventSeqs"] = draw(st.permutations(seqs))
            env("assistant/message", {**base, "message": message}, **extra)
            chunk_seqs.clear()
        elif shape == 17:
            call_seqs.append(seq)
            env("tool/call", {**base, "callId": f"c{index}", "name": "read", "arguments": draw(_text)})
        elif shape == 18 and call_seqs and call_seqs[-1] < seq:
            block = {"type": "tool-result", "toolCallId": "c0", "content": [{"type": "text", "text": draw(_text)}]}
            message = {"id": f"t{seq}", "role": "user", "content": [block], "source": {"kind": "tool", "callId": "c0"}}
            env("tool/result", {**base, "message": message}, surfaceOp="append", sourceEventSeqs=[call_seqs[-1]])
        elif shape == 19:
            env("turn/start", {"turn": turn})
        else:  # the next step or turn, announced or not (a run must still break where its block changes)
            if draw(st.booleans()):
                turn += 1
            else:
                step += 1
            base = {"turn": turn, "step": step}
            if draw(st.booleans()):
                env("step/start", dict(base))
    return [decode_event(w) for w in wire]


@settings(max_examples=400, deadline=None)
@given(_wire_batch(), st.booleans())
def test_storage_lines_are_the_old_encoders_bytes(events: list[Any], pack_chunks: bool) -> None:
    assert encode_storage_lines(events, pack_chunks=pack_chunks) == old_encoding(events, pack_chunks=pack_chunks)


@settings(max_examples=200, deadline=None)
@given(st.lists(_wire_batch(), min_size=1, max_size=3))
def test_batches_that_span_turns_keep_their_bytes(parts: list[list[Any]]) -> None:
    events = [event for part in parts for event in part]
    assert encode_storage_lines(events, pack_chunks=True) == old_encoding(events, pack_chunks=True)


def test_the_oracle_packs_a_streamed_block() -> None:
    """The oracle itself packs: a run of four deltas becomes one row (so the tests above compare packed bytes)."""
    wire = [
        {"type": "assistant/chunk", "seq": 7 + i, "time": 100 + i, "data": {"turn": 1, "step": 1, "chunk": chunk}}
        for i, chunk in enumerate({"type": "text-delta", "index": 0, "text": t} for t in ["a", "ü", "🙂", "d"])
    ]
    events = [decode_event(w) for w in wire]
    stored = old_encoding(events, pack_chunks=True)
    assert stored.count(b"\n") == 1 and b'"text-chunks"' in stored
    assert encode_storage_lines(events, pack_chunks=True) == stored


@pytest.mark.parametrize("pack_chunks", [True, False])
def test_an_event_nested_too_deeply_is_named_by_its_type_and_seq(pack_chunks: bool) -> None:
    """The batch is encoded in one call; when that fails, the error still names the event (as each line did)."""
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    chunk = {"type": "text-delta", "index": 0, "text": "a"}
    wire = [
        {"type": "assistant/chunk", "seq": s, "time": 1, "data": {"turn": 1, "step": 1, "chunk": chunk}}
        for s in range(4)
    ]
    events: list[Any] = [decode_event(w) for w in wire]
    events.append(OpaqueEvent(type="x/deep", seq=4, time=1, data=deep))
    with pytest.raises(NotLosslessJsonError, match=r'session event "x/deep" \(seq 4\) .*nested too deeply'):
        encode_storage_lines(events, pack_chunks=pack_chunks)
