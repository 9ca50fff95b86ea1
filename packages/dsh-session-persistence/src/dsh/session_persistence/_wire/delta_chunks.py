"""The live append of a streamed delta chunk, built straight from the caller's payload.

Token deltas are most of the events a live session appends (a provider streams tens of them per step), and their
payload is a fixed shape of scalars: ``{"turn", "step", "chunk": {"type": "text-delta" | "reasoning-delta",
"index", "text"}}`` or a ``tool-call-delta`` chunk (``index``, ``id``, ``argumentsDelta``, optional ``name``).
The general append snapshots the payload into a checked JSON copy and then converts that copy into the typed
structs; for this shape the structs *are* the independent copy (every leaf is an immutable ``int`` or ``str``), so
:func:`delta_chunk_data` checks the leaves exactly as :func:`~.._model.jsonvalue.snapshot_json` and the typed
conversion would, and builds the payload in one step.

It takes only what it recognises completely; anything else (another chunk type, a missing or extra key, a
``bool`` or out-of-range count, a subclass, a string holding surrogates) returns ``None``
and the general path builds the event or names the defect, so results and errors stay exactly the general path's.
"""

from __future__ import annotations

from typing import Any

from .._model.events import (
    AssistantChunkData,
    ReasoningDeltaChunk,
    TextDeltaChunk,
    ToolCallDeltaChunk,
)
from .._model.jsonvalue import MAX_SAFE_INTEGER, is_plain_str

__all__ = ["delta_chunk_data"]

_TEXT_KINDS: dict[object, Any] = {"text-delta": TextDeltaChunk, "reasoning-delta": ReasoningDeltaChunk}


def delta_chunk_data(data: object) -> AssistantChunkData | None:
    """The payload struct a live ``assistant/chunk`` append of ``data`` builds, when ``data`` is plainly a delta.

    ``None`` means "not plainly a delta chunk": the caller then takes the general path (snapshot, typed
    conversion), which builds the same event or raises the error it always raised. Pure (no side effect, nothing
    called on the caller's objects but exact ``dict``/``str`` methods); the result shares no mutable object with
    ``data``.
    """
    if type(data) is not dict or len(data) != 3:
        return None
    turn = data.get("turn")
    step = data.get("step")
    chunk = data.get("chunk")
    if (
        type(turn) is not int
        or type(step) is not int
        or type(chunk) is not dict
        or not 0 <= turn <= MAX_SAFE_INTEGER
        or not 0 <= step <= MAX_SAFE_INTEGER
    ):
        return None
    for key in data:
        if type(key) is not str:  # a ``str`` subclass equal to a known key: the snapshot refuses it
            return None
    for key in chunk:
        if type(key) is not str:
            return None
    index = chunk.get("index")
    if type(index) is not int or not 0 <= index <= MAX_SAFE_INTEGER:
        return None
    kind = chunk.get("type")
    built: TextDeltaChunk | ReasoningDeltaChunk | ToolCallDeltaChunk
    text_kind = _TEXT_KINDS.get(kind) if type(kind) is str else None
    if text_kind is not None:
        text = chunk.get("text")
        if len(chunk) != 3 or not is_plain_str(text):
            return None
        built = text_kind(index=index, text=text)
    elif type(kind) is str and kind == "tool-call-delta":
        call_id = chunk.get("id")
        delta = chunk.get("argumentsDelta")
        if not (is_plain_str(call_id) and is_plain_str(delta)):
            return None
        if len(chunk) == 4:
            built = ToolCallDeltaChunk(index=index, id=call_id, arguments_delta=delta)
        else:
            name = chunk.get("name")
            if len(chunk) != 5 or not is_plain_str(name):
                return None
            built = ToolCallDeltaChunk(index=index, id=call_id, arguments_delta=delta, name=name)
    else:
        return None
    return AssistantChunkData(turn=turn, step=step, chunk=built)
