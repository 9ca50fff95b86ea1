"""Packed chunk rows: a storage-only encoding of ``assistant/chunk`` delta runs (spec session-core §6).

Providers stream token-sized deltas, so a log holds long runs of near-identical ``assistant/chunk`` lines
whose envelopes dwarf the payload. A backend may replace each run of at least :data:`MIN_RUN`
consecutive, same-block delta chunks by one row tagged ``text-chunks``, ``reasoning-chunks`` or
``tool-call-chunks`` (slash-less, so a row can never be mistaken for an event type). Rows are never
session events: readers expand them back to the exact original events, so packed, unpacked and mixed
files load identically.

Everything here works on plain JSON values (the event wire form ``{"type", "seq", "time", "data"}``).
The packer whitelists exact shapes: anything it does not fully recognise is written verbatim, so an
unknown field or a future chunk kind loses compression, never data. The reader validates a row-tagged
value completely before expanding it and raises :class:`ChunkRowError` on any defect, because silently
skipping a row would drop a whole run of events.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any

from .._model.jsonvalue import MAX_SAFE_INTEGER, is_safe_int

__all__ = [
    "ABSENT",
    "CHUNK_ROW_TAGS",
    "MIN_RUN",
    "ChunkRowError",
    "expand_chunk_row",
    "expand_chunk_rows",
    "pack_chunk_rows",
    "row_member_count",
    "run_key",
    "build_row",
]

MIN_RUN = 3
"""Fewest members a run needs to be packed; shorter runs are written as the original events.

A format constant, not a tunable: both layouts decode identically, so changing it never invalidates logs.
"""

_TEXT_TAG = "text-chunks"
_REASONING_TAG = "reasoning-chunks"
_TOOL_TAG = "tool-call-chunks"

CHUNK_ROW_TAGS: frozenset[str] = frozenset({_TEXT_TAG, _REASONING_TAG, _TOOL_TAG})
"""The ``type`` values of storage rows; no event type can take them (event types contain a slash)."""

# delta chunk kind -> row tag, and back
_TAG_OF_KIND = {"text-delta": _TEXT_TAG, "reasoning-delta": _REASONING_TAG, "tool-call-delta": _TOOL_TAG}
_KIND_OF_TAG = {tag: kind for kind, tag in _TAG_OF_KIND.items()}

_EVENT_KEYS = frozenset({"type", "seq", "time", "data"})
_EVENT_DATA_KEYS = frozenset({"turn", "step", "chunk"})
_TEXT_CHUNK_KEYS = frozenset({"type", "index", "text"})
_TOOL_CHUNK_KEYS = frozenset({"type", "index", "id", "argumentsDelta"})
_NAMED_TOOL_CHUNK_KEYS = frozenset({"type", "index", "id", "name", "argumentsDelta"})

_ROW_KEYS = frozenset({"type", "seq0", "time0", "data"})
_TEXT_ROW_DATA_KEYS = frozenset({"turn", "step", "index", "dt", "texts"})
_TOOL_ROW_DATA_KEYS = frozenset({"turn", "step", "index", "dt", "id", "args"})
_NAMED_TOOL_ROW_DATA_KEYS = frozenset({"turn", "step", "index", "dt", "id", "name", "args"})

ABSENT = object()  # marks "no name key" in a run key, distinct from every string


class ChunkRowError(ValueError):
    """A value tagged as a chunk storage row is malformed (``malformed <tag> storage row: <why>``).

    Readers treat it as corrupt storage (for JSONL: an unparsable line), never as an event.
    """

    def __init__(self, tag: str, why: str) -> None:
        super().__init__(f"malformed {tag} storage row: {why}")
        self.tag = tag
        self.why = why


# ---------------------------------------------------------------------------------------------------
# Packing


def run_key(event: object) -> tuple[object, ...] | None:
    """The run identity of a packable delta chunk event, or None when it must be written verbatim.

    Only an exactly whitelisted shape qualifies (exact key sets, exact types, safe integers). The key is
    (kind, turn, step, index, id, name-or-absent): two members may share a run only if their keys are
    equal, which encodes "same kind, turn, step and block; same tool id and name in presence and value".
    """
    if type(event) is not dict or event.get("type") != "assistant/chunk" or event.keys() != _EVENT_KEYS:
        return None
    seq = event["seq"]
    if not is_safe_int(seq) or seq < 0 or not is_safe_int(event["time"]):
        return None
    data = event["data"]
    if type(data) is not dict or data.keys() != _EVENT_DATA_KEYS:
        return None
    turn, step, chunk = data["turn"], data["step"], data["chunk"]
    if not is_safe_int(turn) or not is_safe_int(step) or type(chunk) is not dict:
        return None
    kind = chunk.get("type")
    index = chunk.get("index")
    if not is_safe_int(index):
        return None
    if kind == "text-delta" or kind == "reasoning-delta":
        if chunk.keys() != _TEXT_CHUNK_KEYS or type(chunk["text"]) is not str:
            return None
        return (kind, turn, step, index, None, None)
    if kind == "tool-call-delta":
        keys = chunk.keys()
        if keys == _TOOL_CHUNK_KEYS:
            name: object = ABSENT
        elif keys == _NAMED_TOOL_CHUNK_KEYS:
            name = chunk["name"]
            if type(name) is not str:
                return None
        else:
            return None
        call_id = chunk["id"]
        if type(call_id) is not str or type(chunk["argumentsDelta"]) is not str:
            return None
        return (kind, turn, step, index, call_id, name)
    # block-start, block-end, usage, finish and any future chunk kind stay one event per line.
    return None


def build_row(key: tuple[object, ...], members: Sequence[tuple[int, int, str]]) -> dict[str, Any]:
    """The row of a run: ``key`` from :func:`run_key`, ``members`` as ``(seq, time, delta text)`` in order."""
    kind, turn, step, index, call_id, name = key
    times = [member[1] for member in members]
    dt = [b - a for a, b in pairwise(times)]
    data: dict[str, Any] = {"turn": turn, "step": step, "index": index, "dt": dt}
    deltas = [member[2] for member in members]
    if kind == "tool-call-delta":
        data["id"] = call_id
        if name is not ABSENT:
            data["name"] = name
        data["args"] = deltas
    else:
        data["texts"] = deltas
    return {"type": _TAG_OF_KIND[kind], "seq0": members[0][0], "time0": times[0], "data": data}  # type: ignore[index]


def _member(key: tuple[object, ...], event: dict[str, Any]) -> tuple[int, int, str]:
    chunk = event["data"]["chunk"]
    delta = chunk["argumentsDelta"] if key[0] == "tool-call-delta" else chunk["text"]
    return event["seq"], event["time"], delta


def pack_chunk_rows(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Encode a batch for storage: each run of >= :data:`MIN_RUN` packable delta chunks becomes one row.

    Every other event is passed through verbatim (the same object), in order. A run continues only while
    the kind, turn, step, block index (and for tool calls the id, and the name in presence and value)
    stay equal, the seq grows by exactly one and the time gap is a safe integer. Stateless per batch: a
    run split by a flush boundary is packed (or not) per batch.
    """
    out: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []
    current: tuple[object, ...] | None = None

    def flush() -> None:
        if current is not None and len(run) >= MIN_RUN:
            out.append(build_row(current, [_member(current, event) for event in run]))
        else:
            out.extend(run)

    for event in events:
        key = run_key(event)
        if key is None:
            flush()
            run, current = [], None
            out.append(event)
            continue
        if key == current:
            prev = run[-1]
            # Both times are safe ints, so the gap is exact in Python; it must itself be safe so that
            # JS readers (and our row validation) can represent it: 2**53-1 minus its negation is not.
            if event["seq"] == prev["seq"] + 1 and abs(event["time"] - prev["time"]) <= MAX_SAFE_INTEGER:
                run.append(event)
                continue
        flush()
        run, current = [event], key
    flush()
    return out


# ---------------------------------------------------------------------------------------------------
# Reading


def _validate_row(row: dict[str, Any], tag: str) -> list[str]:
    """Check a row-tagged value completely; return its member payload (texts or args)."""
    if row.keys() != _ROW_KEYS:
        raise ChunkRowError(tag, "envelope must be exactly {type, seq0, time0, data}")
    seq0, time0, data = row["seq0"], row["time0"], row["data"]
    if not is_safe_int(seq0) or seq0 < 0:
        raise ChunkRowError(tag, "seq0 must be a non-negative safe integer")
    if not is_safe_int(time0):
        raise ChunkRowError(tag, "time0 must be a safe integer")
    if type(data) is not dict:
        raise ChunkRowError(tag, "data must be an object")
    if tag == _TOOL_TAG:
        keys = data.keys()
        if keys != _TOOL_ROW_DATA_KEYS and keys != _NAMED_TOOL_ROW_DATA_KEYS:
            raise ChunkRowError(tag, "data must be exactly {turn, step, index, dt, id, name?, args}")
        if type(data["id"]) is not str or ("name" in data and type(data["name"]) is not str):
            raise ChunkRowError(tag, "id (and name when present) must be strings")
        payload_key = "args"
    else:
        if data.keys() != _TEXT_ROW_DATA_KEYS:
            raise ChunkRowError(tag, "data must be exactly {turn, step, index, dt, texts}")
        payload_key = "texts"
    # Port: turn/step/index must be safe ints (the reference accepts any JS number), matching the
    # packer, which only packs integer values.
    if not (is_safe_int(data["turn"]) and is_safe_int(data["step"]) and is_safe_int(data["index"])):
        raise ChunkRowError(tag, "turn/step/index must be safe integers")
    payload = data[payload_key]
    if type(payload) is not list or not payload or any(type(p) is not str for p in payload):
        raise ChunkRowError(tag, f"{payload_key} must be a non-empty list of strings")
    dt = data["dt"]
    if type(dt) is not list or not all(is_safe_int(gap) for gap in dt):
        raise ChunkRowError(tag, "dt must be a list of safe integers")
    if len(dt) != len(payload) - 1:
        raise ChunkRowError(tag, f"dt length {len(dt)} does not match {len(payload)} members")
    if seq0 + len(payload) - 1 > MAX_SAFE_INTEGER:
        raise ChunkRowError(tag, "member seqs must stay safe integers")
    time = time0
    for gap in dt:
        time += gap
        if not -MAX_SAFE_INTEGER <= time <= MAX_SAFE_INTEGER:
            raise ChunkRowError(tag, "member times must stay safe integers")
    return payload


def _row_tag(value: object) -> str | None:
    if type(value) is not dict:
        return None
    tag = value.get("type")
    # type() first: an unhashable "type" (a list, say) must pass through, not crash the set lookup.
    return tag if type(tag) is str and tag in CHUNK_ROW_TAGS else None


def expand_chunk_row(value: object) -> list[dict[str, Any]] | None:
    """Expand one stored JSON value if it is a chunk row; None when it is not a row (e.g. an event).

    A row-tagged value is validated first; any defect raises :class:`ChunkRowError`. The events come
    back in the wire form ``{"type": "assistant/chunk", "seq", "time", "data": {"turn", "step", "chunk"}}``
    with fresh objects (nothing is shared with ``value``).
    """
    tag = _row_tag(value)
    if tag is None:
        return None
    row: dict[str, Any] = value  # type: ignore[assignment]
    payload = _validate_row(row, tag)
    data = row["data"]
    kind = _KIND_OF_TAG[tag]
    turn, step, index, dt = data["turn"], data["step"], data["index"], data["dt"]
    seq, time = row["seq0"], row["time0"]
    call_id = data.get("id")
    has_name = "name" in data
    name = data.get("name")
    events: list[dict[str, Any]] = []
    for k, member in enumerate(payload):
        if k:
            time += dt[k - 1]
        chunk: dict[str, Any]
        if kind == "tool-call-delta":
            chunk = {"type": kind, "index": index, "id": call_id}
            if has_name:
                chunk["name"] = name
            chunk["argumentsDelta"] = member
        else:
            chunk = {"type": kind, "index": index, "text": member}
        events.append(
            {
                "type": "assistant/chunk",
                "seq": seq + k,
                "time": time,
                "data": {"turn": turn, "step": step, "chunk": chunk},
            }
        )
    return events


def expand_chunk_rows(values: Iterable[object]) -> list[object]:
    """Decode stored JSON values in order: rows expand to their events, anything else passes through."""
    out: list[object] = []
    for value in values:
        events = expand_chunk_row(value)
        if events is None:
            out.append(value)
        else:
            out.extend(events)
    return out


def row_member_count(row: object) -> int:
    """How many events a chunk row stores (how far it advances the seq cursor), after validating it.

    Raises :class:`ChunkRowError` for a malformed row and ``ValueError`` for a value that is not a row.
    """
    tag = _row_tag(row)
    if tag is None:
        raise ValueError("not a chunk storage row")
    return len(_validate_row(row, tag))  # type: ignore[arg-type]
