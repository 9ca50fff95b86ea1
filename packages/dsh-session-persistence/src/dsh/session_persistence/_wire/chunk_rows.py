"""Packed chunk rows: a storage-only encoding of ``assistant/chunk`` delta runs (spec session-core §6).

Providers stream token-sized deltas, so a log holds long runs of near-identical ``assistant/chunk`` lines
whose envelopes dwarf the payload. A backend may replace each run of at least :data:`MIN_RUN`
consecutive, same-block delta chunks by one row tagged ``text-chunks``, ``reasoning-chunks`` or
``tool-call-chunks`` (slash-less, so a row can never be mistaken for an event type). Rows are never
session events: readers expand them back to the exact original events, so packed, unpacked and mixed
files load identically.

The rule lives here once: :func:`pack_members` is the one packer (runs to rows, for plain-JSON events through
:func:`pack_runs` and :func:`pack_chunk_rows`, and for typed events through :func:`~.chunk_pack.encode_chunk_run`,
which reads the members itself) and
:func:`row_events` the one unpacker (a row's member events, for :func:`expand_chunk_row` and the typed decoders
of :mod:`.storage_lines`). The run key is read from the event wire form ``{"type", "seq", "time", "data"}``.
The packer whitelists exact shapes: anything it does not fully recognise is written verbatim, so an
unknown field or a future chunk kind loses compression, never data. The reader validates a row-tagged
value completely before expanding it and raises :class:`ChunkRowError` on any defect, because silently
skipping a row would drop a whole run of events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise
from typing import Any, TypeVar

import msgspec
from msgspec import UNSET

from .._model.events import (
    SessionEvent,
)
from .._model.jsonvalue import MAX_SAFE_INTEGER, is_safe_int
from .._model.stored_events import packed_run

__all__ = [
    "ABSENT",
    "CHUNK_ROW_TAGS",
    "MIN_RUN",
    "ChunkRowError",
    "Member",
    "expand_chunk_row",
    "expand_chunk_rows",
    "pack_chunk_rows",
    "pack_members",
    "pack_runs",
    "plain_member",
    "row_events",
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
    return _row(key, members[0][0], [member[1] for member in members], [member[2] for member in members])


def _row(key: tuple[object, ...], seq0: int, times: list[int], deltas: list[str]) -> dict[str, Any]:
    """:func:`build_row` from the run's first seq and its members' times and deltas."""
    kind, turn, step, index, call_id, name = key
    dt = [b - a for a, b in pairwise(times)]
    data: dict[str, Any] = {"turn": turn, "step": step, "index": index, "dt": dt}
    if kind == "tool-call-delta":
        data["id"] = call_id
        if name is not ABSENT:
            data["name"] = name
        data["args"] = deltas
    else:
        data["texts"] = deltas
    return {"type": _TAG_OF_KIND[kind], "seq0": seq0, "time0": times[0], "data": data}  # type: ignore[index]


Member = tuple[tuple[object, ...], int, int, str]
"""A run member: its :func:`run_key`, seq, time and delta text."""

T = TypeVar("T")


def pack_runs(events: Iterable[T], member_of: Callable[[T], Member | None]) -> list[T | dict[str, Any]]:
    """The one chunk packer: ``events`` in order, each run of >= :data:`MIN_RUN` members as one row (a plain-JSON
    value from :func:`build_row`), every other event passed through (the same object).

    ``member_of`` reads an event as a run member, or ``None`` for one written verbatim: :func:`run_key` on plain
    JSON (:func:`pack_chunk_rows`), the struct reader of :mod:`.chunk_pack` on typed events. A run continues only
    while the key stays equal, the seq grows by exactly one and the time gap is a safe integer. Stateless per
    batch: a run split by a flush boundary is packed (or not) per batch.
    """
    events = list(events)
    return pack_members(events, list(map(member_of, events)))


def pack_members(events: Sequence[T], members: Sequence[Member | None]) -> list[T | dict[str, Any]]:
    """:func:`pack_runs` with every event's member already read (``members[i]`` is ``member_of(events[i])``).

    The current run is held as the index of its first event, its length, and its members' times and deltas.
    """
    if len(events) != len(members):
        raise ValueError("pack_members needs one member per event")
    out: list[T | dict[str, Any]] = []
    start = size = 0  # the current run: events[start : start + size] (size 0: none)
    key: tuple[object, ...] = ()
    seq0 = seq = time = 0
    times: list[int] = []
    deltas: list[str] = []
    high, magnitude, row = MAX_SAFE_INTEGER, abs, _row  # locals in the loop, not global lookups
    for i, member in enumerate(members):
        if member is not None:
            next_key, next_seq, next_time, delta = member
            # Both times are safe ints, so the gap is exact in Python; it must itself be safe so that JS readers
            # (and our row validation) can represent it: 2**53-1 minus its negation is not.
            if size and next_key == key and next_seq == seq + 1 and magnitude(next_time - time) <= high:
                size += 1
                seq, time = next_seq, next_time
                times.append(time)
                deltas.append(delta)
                continue
        if size >= MIN_RUN:
            out.append(row(key, seq0, times, deltas))
        elif size:
            out.extend(events[start : start + size])
        if member is None:
            size = 0
            out.append(events[i])
            continue
        start, size, key, seq0, seq, time = i, 1, next_key, next_seq, next_seq, next_time
        times = [time]
        deltas = [delta]
    if size >= MIN_RUN:
        out.append(row(key, seq0, times, deltas))
    elif size:
        out.extend(events[start : start + size])
    return out


def plain_member(event: dict[str, Any]) -> Member | None:
    """A plain-JSON event as a run member (:func:`run_key` and its seq, time and delta), ``None`` if verbatim."""
    key = run_key(event)
    if key is None:
        return None
    chunk = event["data"]["chunk"]
    delta = chunk["argumentsDelta"] if key[0] == "tool-call-delta" else chunk["text"]
    return key, event["seq"], event["time"], delta


def pack_chunk_rows(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Encode a batch of plain-JSON events for storage: :func:`pack_runs` with :func:`run_key` (each run of
    >= :data:`MIN_RUN` packable delta chunks becomes one row; every other event passes through verbatim)."""
    return pack_runs(events, plain_member)


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
    events = row_events(
        tag,
        row["seq0"],
        row["time0"],
        data["turn"],
        data["step"],
        data["index"],
        data["dt"],
        payload,
        data.get("id"),
        data.get("name", UNSET),
    )
    assert events is not None  # a validated row passes row_events' cross-field checks (the same ones)
    return [msgspec.to_builtins(event) for event in events]


def row_events(
    tag: str,
    seq0: int,
    time0: int,
    turn: int,
    step: int,
    index: int,
    dt: list[int],
    members: list[str],
    call_id: Any,
    name: Any,
) -> list[SessionEvent] | None:
    """The one chunk unpacker: the member events of a row whose fields already have their types and ranges
    (``seq0`` a count, ``turn``/``step``/``index`` and every ``dt`` safe ints, ``members`` a list of strings);
    checks what spans fields (one ``dt`` per gap between members, so at least one member; the last seq and every
    member's time safe), or ``None``. ``name`` is ``UNSET`` for a nameless tool run.

    Every reader expands through here: :func:`expand_chunk_row` (plain JSON, after :func:`_validate_row` named
    any defect) and the typed line and batch decoders of :mod:`.storage_lines`. The structs are built without
    validation, so a row whose members would not convert (a negative turn, say) still expands; a typed reader
    checks the ranges first.
    """
    run = packed_run(tag, seq0, time0, turn, step, index, dt, members, call_id, name)
    return None if run is None else run.events()


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
