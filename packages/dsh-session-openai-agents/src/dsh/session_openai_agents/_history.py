"""The SDK's item history as a replay of a dsh log: verbatim items, pop tombstones, compaction records, repairs.

Every live item has a *position* ``(seq, index)``: ``(seq, 0)`` for the ``openai-agents/item`` event at ``seq`` (or
the crash-repair ``tool/result`` whose output is synthesized), ``(seq, i)`` for the ``i``-th item of the
``openai-agents/compaction`` record at ``seq``. Positions only grow along the history, so "a suffix" and "a prefix"
are position ranges, and a compaction record names what it replaces by them:

``{"from": [seq, index], "items": [...]}``: every live item at or after ``from`` is gone, ``items`` follow the
items kept; an optional ``"before": [seq, index]`` also drops every live item before that position (the SDK's
expired-prefix reclaim). One record is one event in one flush, so a crash leaves it whole or absent: the log holds
the old history or the compacted one, never a mix, and the log itself stays append-only (``dsh-sessions show``
keeps the full transcript).
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from dsh.session_persistence import SessionPersistenceCorruptionError
from dsh.session_persistence.events import OpaqueEvent, ToolResult

__all__ = ["COMPACTION_EVENT", "ITEM_EVENT", "POP_EVENT", "CompactionSnapshot", "Entry", "Position", "replay"]

#: The ignorable event type holding one SDK item verbatim (``{"item": ...}``).
ITEM_EVENT = "openai-agents/item"
#: The ignorable event type recording a ``pop_item`` (``{"itemSeq": seq}``, plus ``"index"`` for a compacted item).
POP_EVENT = "openai-agents/pop"
#: The ignorable event type recording a compaction (``{"from": [seq, index], "items": [...]}``).
COMPACTION_EVENT = "openai-agents/compaction"

Position = tuple[int, int]


class Entry(NamedTuple):
    """One live item: where it is, the item, and whether a stored record holds it (``pop_item`` can remove it)."""

    position: Position
    item: dict[str, Any]
    stored: bool


@dataclass(frozen=True)
class CompactionSnapshot:
    """What the SDK's compaction reads (``items``, ``complete``) and how it replaces their suffix atomically.

    The shape of the SDK's own snapshot (its ``_get_compaction_snapshot`` hook); ``replace_suffix(start, output)``
    returns ``False`` without writing when the history changed since the snapshot was taken."""

    items: list[Any]
    complete: bool
    replace_suffix: Callable[[int, list[Any]], Awaitable[bool]]


def _position(value: object, seq: int) -> Position:
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(part, int) and not isinstance(part, bool) and part >= 0 for part in value)
    ):
        return (value[0], value[1])
    raise SessionPersistenceCorruptionError(
        f"the {COMPACTION_EVENT} record at seq {seq} has no valid position (two non-negative integers): {value!r}"
    )


def _compacted(event: OpaqueEvent) -> tuple[Position, Position | None, list[dict[str, Any]]]:
    data = event.data if isinstance(event.data, dict) else {}
    start = _position(data.get("from"), event.seq)
    before = _position(data["before"], event.seq) if "before" in data else None
    items = data.get("items")
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise SessionPersistenceCorruptionError(
            f"the {COMPACTION_EVENT} record at seq {event.seq} has no item list (a list of JSON objects)"
        )
    return start, before, items


def replay(events: Sequence[Any]) -> list[Entry]:
    """The live items of a log, oldest first; a call whose output only crash repair wrote gets that output."""
    popped: set[Position] = set()
    answered: set[object] = set()
    for event in events:
        if type(event) is not OpaqueEvent or not isinstance(event.data, dict):
            continue
        if event.type == POP_EVENT:
            popped.add((event.data.get("itemSeq"), event.data.get("index", 0)))  # type: ignore[arg-type]
        elif event.type == ITEM_EVENT:
            item = event.data.get("item", {})
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                answered.add(item.get("call_id"))
    out: list[Entry] = []
    for event in events:
        if type(event) is OpaqueEvent and event.type == ITEM_EVENT:
            if (event.seq, 0) not in popped:
                out.append(Entry((event.seq, 0), copy.deepcopy(event.data["item"]), True))
        elif type(event) is OpaqueEvent and event.type == COMPACTION_EVENT:
            start, before, items = _compacted(event)
            out = [e for e in out if e.position < start and (before is None or e.position >= before)]
            for index, item in enumerate(items):
                if (event.seq, index) not in popped:
                    out.append(Entry((event.seq, index), copy.deepcopy(item), True))
        elif type(event) is ToolResult:
            call_id = event.data.message.source.call_id  # type: ignore[union-attr]
            if call_id not in answered:
                # Written by crash repair: the call was recorded, its output never was.
                text = "".join(getattr(b, "text", "") for blk in event.data.message.content for b in blk.content)  # type: ignore[union-attr]
                output = {"type": "function_call_output", "call_id": call_id, "output": text}
                out.append(Entry((event.seq, 0), output, False))
    return out
