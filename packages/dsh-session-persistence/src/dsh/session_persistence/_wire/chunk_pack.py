"""The chunk-row packer on typed events: the storage lines :func:`~._chunk_rows.pack_chunk_rows` gives, without the
JSON round trip.

A streamed answer is a long run of ``assistant/chunk`` structs. Packing them through their plain-JSON form (struct
to dict, then the packer's whitelist checks on dicts) cost ~4 us per chunk, ten times the encoding itself. Here the
same whitelist is read from the struct attributes. Only exact types are decided here: an attribute of any other
type (a hand-built struct holding an ``IntEnum``, a dict chunk, ...) could convert differently to JSON, so that
event is decided by the plain-JSON key itself. The packing (runs to rows) is :func:`~.chunk_rows.pack_members`,
the one packer, fed with members read here; the equivalence with packing the plain-JSON form (same bytes) is a tested
property.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import UNSET

from .._model.events import (
    AssistantChunk,
    AssistantChunkData,
    BlockEndChunk,
    BlockStartChunk,
    FinishChunk,
    ReasoningDeltaChunk,
    TextDeltaChunk,
    ToolCallDeltaChunk,
    UsageChunk,
)
from .._model.jsonvalue import MAX_SAFE_INTEGER
from .chunk_rows import ABSENT, Member, pack_members, pack_runs, plain_member

__all__ = ["chunk_run_values", "encode_chunk_run"]

_encoder = msgspec.json.Encoder()
_Key = tuple[object, ...]
_BOUNDARY_KINDS = frozenset({BlockStartChunk, BlockEndChunk, UsageChunk, FinishChunk})
_UNDECIDED = object()  # an attribute of an inexact type: the plain-JSON packer decides this event


def _safe(value: object) -> bool | None:
    """For an exact ``int``: whether it is a safe integer; ``None`` for any other type (undecided)."""
    if type(value) is int:
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
    return None


def _typed_key(event: AssistantChunk) -> tuple[_Key, str] | object | None:
    """``(run key, delta)`` of a packable chunk, ``None`` for a verbatim one, or ``_UNDECIDED``.

    Mirrors :func:`~._chunk_rows.run_key` on ``msgspec.to_builtins(event)``: the envelope must be exactly
    ``type, seq, time, data`` (``ignorable`` unset), seq a non-negative safe int, time a safe int, data exactly
    ``turn, step, chunk`` with safe ints, the chunk a whitelisted delta kind with a safe ``index`` and string fields.
    """
    if event.ignorable is not UNSET:
        return None
    seq, time, data = event.seq, event.time, event.data
    ok_seq, ok_time = _safe(seq), _safe(time)
    if ok_seq is None or ok_time is None or type(data) is not AssistantChunkData:
        return _UNDECIDED
    if not ok_seq or seq < 0 or not ok_time:
        return None
    turn, step = data.turn, data.step
    chunk: Any = data.chunk  # narrowed by its exact type below
    ok_turn, ok_step = _safe(turn), _safe(step)
    if ok_turn is None or ok_step is None:
        return _UNDECIDED
    if not ok_turn or not ok_step:
        return None
    kind = type(chunk)
    if kind is TextDeltaChunk or kind is ReasoningDeltaChunk:
        index, text = chunk.index, chunk.text
        ok_index = _safe(index)
        if ok_index is None or type(text) is not str:
            return _UNDECIDED
        if not ok_index:
            return None
        tag = "text-delta" if kind is TextDeltaChunk else "reasoning-delta"
        return (tag, turn, step, index, None, None), text
    if kind is ToolCallDeltaChunk:
        index, call_id, delta, name = chunk.index, chunk.id, chunk.arguments_delta, chunk.name
        ok_index = _safe(index)
        if ok_index is None or type(call_id) is not str or type(delta) is not str:
            return _UNDECIDED
        if name is not UNSET and type(name) is not str:
            return _UNDECIDED
        if not ok_index:
            return None
        return ("tool-call-delta", turn, step, index, call_id, ABSENT if name is UNSET else name), delta
    # Boundary, usage and finish chunks (and anything else) are decided by the plain-JSON packer.
    return _UNDECIDED


def _fast_key(event: AssistantChunk) -> tuple[_Key, str] | None:
    """The common case in one expression: a text or reasoning delta whose every attribute is exact and in range
    (``None``: not that case, ask :func:`_typed_key`)."""
    data = event.data
    if type(data) is not AssistantChunkData:
        return None
    chunk: Any = data.chunk  # narrowed by its exact type below
    kind = type(chunk)
    if kind is not TextDeltaChunk and kind is not ReasoningDeltaChunk:
        return None
    seq, time, turn, step = event.seq, event.time, data.turn, data.step
    index, text = chunk.index, chunk.text
    if (
        event.ignorable is UNSET
        and type(seq) is int
        and type(time) is int
        and type(turn) is int
        and type(step) is int
        and type(index) is int
        and type(text) is str
        and 0 <= seq <= MAX_SAFE_INTEGER
        and -MAX_SAFE_INTEGER <= time <= MAX_SAFE_INTEGER
        and -MAX_SAFE_INTEGER <= turn <= MAX_SAFE_INTEGER
        and -MAX_SAFE_INTEGER <= step <= MAX_SAFE_INTEGER
        and -MAX_SAFE_INTEGER <= index <= MAX_SAFE_INTEGER
    ):
        tag = "text-delta" if kind is TextDeltaChunk else "reasoning-delta"
        return (tag, turn, step, index, None, None), text
    return None


def _member_of(event: AssistantChunk) -> Member | None:
    """The event as a run member, or ``None`` when it is a verbatim line."""
    decided: Any = _fast_key(event)
    if decided is None:
        decided = _typed_key(event)
        if decided is None:
            return None
    if decided is _UNDECIDED:
        return plain_member(msgspec.to_builtins(event))
    key, delta = decided
    return key, event.seq, event.time, delta


def _members(events: Sequence[AssistantChunk]) -> list[Member | None]:
    """:func:`_member_of` of every event, in order, with the common case inline: a text or reasoning delta whose
    every attribute is exact and in range (the case :func:`_fast_key` accepts).

    Consecutive deltas of one block hold the very same ``turn``, ``step`` and ``index`` objects (small ints are
    shared), so those are checked once per block: an attribute that *is* the object already checked for the
    previous member passed the same checks, and the key built then is reused. Anything else is
    :func:`_member_of`'s call.
    """
    # Locals, not globals or builtins, in the loop (each global lookup is a dict probe per event).
    chunk_data, text_delta, reasoning_delta, unset, exact_int, exact_str = (
        AssistantChunkData,
        TextDeltaChunk,
        ReasoningDeltaChunk,
        UNSET,
        int,
        str,
    )
    high, low = MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER
    out: list[Member | None] = []
    append = out.append
    key: _Key = ()
    last_kind: Any = None
    last_turn: Any = None
    last_step: Any = None
    last_index: Any = None
    for event in events:
        data = event.data
        if type(data) is chunk_data:
            chunk: Any = data.chunk
            kind = type(chunk)
            if kind is text_delta or kind is reasoning_delta:
                seq, time, text = event.seq, event.time, chunk.text
                if (
                    type(seq) is exact_int
                    and type(time) is exact_int
                    and type(text) is exact_str
                    and event.ignorable is unset
                    and 0 <= seq <= high
                    and low <= time <= high
                ):
                    turn, step, index = data.turn, data.step, chunk.index
                    if kind is last_kind and turn is last_turn and step is last_step and index is last_index:
                        append((key, seq, time, text))
                        continue
                    if (
                        type(turn) is exact_int
                        and type(step) is exact_int
                        and type(index) is exact_int
                        and low <= turn <= high
                        and low <= step <= high
                        and low <= index <= high
                    ):
                        tag = "text-delta" if kind is text_delta else "reasoning-delta"
                        key = (tag, turn, step, index, None, None)
                        last_kind, last_turn, last_step, last_index = kind, turn, step, index
                        append((key, seq, time, text))
                        continue
            elif kind in _BOUNDARY_KINDS:
                # Its plain-JSON chunk type is its class's tag, never a delta kind: the plain-JSON packer writes it
                # verbatim whatever else it holds (no need to build that form to ask).
                append(None)
                continue
        append(_member_of(event))
    return out


def _verbatim(event: AssistantChunk) -> bytes:
    # The plain-JSON form's bytes (what the packer passes through), also for a hand-built struct.
    return _encoder.encode(msgspec.to_builtins(event))


def chunk_run_values(events: Sequence[AssistantChunk]) -> list[Any]:
    """The plain-JSON values whose encodings are :func:`encode_chunk_run`'s lines: rows, and the plain-JSON form of
    every event written verbatim (so a batch can encode them with its other events in one call)."""
    to_builtins = msgspec.to_builtins
    return [value if type(value) is dict else to_builtins(value) for value in pack_members(events, _members(events))]


def encode_chunk_run(events: Sequence[AssistantChunk]) -> list[bytes]:
    """The storage lines of consecutive ``assistant/chunk`` events: the same bytes as encoding each value of
    ``pack_chunk_rows(msgspec.to_builtins(events))``.

    Every member is read by :func:`_member_of`, in order, and every line encoded on its own: the error path of a
    batch encode, which raises what reading and encoding the events one by one raises (:func:`chunk_run_values`
    is the fast path).
    """
    return [
        _encoder.encode(value) if type(value) is dict else _verbatim(value)  # type: ignore[arg-type]
        for value in pack_runs(events, _member_of)
    ]
