"""A stored log's events as read: plain events and packed chunk runs, expanded only where a reader asks.

Most events of a streamed log are ``assistant/chunk`` deltas stored as packed rows (one row per run, see
:mod:`~dsh.session_persistence._wire.chunk_rows`). Building one struct triple per member costs a load more than
decoding the rows themselves, and most readers (a resume, a validator, a preview) never look at the deltas.
:class:`StoredEvents` is an immutable ``Sequence[SessionEvent]`` over *segments*: plain events and
:class:`PackedRun` values (a row's decoded fields, already proven by the typed decoder). ``len`` is O(1); indexing,
slicing and iteration expand a run on first access and keep the expansion, so repeated access returns the same
event objects. It compares equal to any sequence of the same events (a tuple, a list, another one of these).

Expansion never fails: a :class:`PackedRun` is only built from fields whose ranges and cross-field rules (one
time gap per pair of members, every member seq and time a safe integer) were checked first, by
:func:`packed_run`.
"""

from __future__ import annotations

import operator
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Any, overload

from .events import (
    AssistantChunk,
    AssistantChunkData,
    ReasoningDeltaChunk,
    SessionEvent,
    TextDeltaChunk,
    ToolCallDeltaChunk,
)
from .jsonvalue import MAX_SAFE_INTEGER

__all__ = ["PackedRun", "StoredEvents", "packed_run"]

_TEXT_TAG = "text-chunks"
_TOOL_TAG = "tool-call-chunks"


class PackedRun:
    """One packed chunk row's members, as fields; :meth:`events` builds (once) and returns the member events.

    ``turn``/``step`` are what every member's ``data`` names; ``seq0`` the first member's seq (the others follow
    by one); ``count`` how many members there are. Built only by :func:`packed_run`.
    """

    __slots__ = (
        "_events",
        "call_id",
        "count",
        "dt",
        "index",
        "members",
        "name",
        "seq0",
        "step",
        "tag",
        "time0",
        "turn",
    )

    def __init__(
        self,
        tag: str,
        seq0: int,
        time0: int,
        dt: list[int],
        turn: int,
        step: int,
        index: int,
        members: list[str],
        call_id: Any,
        name: Any,
    ) -> None:
        self.tag = tag
        self.seq0 = seq0
        self.time0 = time0
        self.dt = dt
        self.turn = turn
        self.step = step
        self.index = index
        self.members = members
        self.call_id = call_id
        self.name = name
        self.count = len(members)
        self._events: list[SessionEvent] | None = None

    def events(self) -> list[SessionEvent]:
        """The member events, built on the first call (the same objects on every later one)."""
        built = self._events
        if built is None:
            built = self._events = _build(self)
        return built

    def __repr__(self) -> str:
        return f"PackedRun({self.tag!r}, seq0={self.seq0}, count={self.count}, turn={self.turn}, step={self.step})"


def packed_run(
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
) -> PackedRun | None:
    """A row's members as a :class:`PackedRun`, or ``None`` when what spans its fields does not hold.

    The fields must already have their types and ranges (``seq0``, ``turn``, ``step``, ``index`` counts, every
    ``dt`` a safe int, ``members`` strings; ``name`` is ``UNSET`` for a nameless tool run). Checked here: one
    ``dt`` per gap between members (so at least one member), the last seq and every member's time safe integers.
    """
    if len(dt) != len(members) - 1 or seq0 + len(members) - 1 > MAX_SAFE_INTEGER:
        return None
    # Every member time is time0 plus a prefix sum of dt, so |time0| + sum|dt| bounds them all: within the safe
    # range (every real log) nothing more is needed; past it, the times themselves decide.
    if abs(time0) + sum(map(abs, dt)) > MAX_SAFE_INTEGER:
        times = list(accumulate(dt, initial=time0))
        if min(times) < -MAX_SAFE_INTEGER or max(times) > MAX_SAFE_INTEGER:
            return None
    return PackedRun(tag, seq0, time0, dt, turn, step, index, members, call_id, name)


def _build(run: PackedRun) -> list[SessionEvent]:
    turn, step, index = run.turn, run.step, run.index
    seqs = range(run.seq0, run.seq0 + run.count)
    times = accumulate(run.dt, initial=run.time0)
    if run.tag == _TOOL_TAG:
        call_id, name = run.call_id, run.name
        return [
            AssistantChunk(
                seq=seq,
                time=time,
                data=AssistantChunkData(
                    turn=turn,
                    step=step,
                    chunk=ToolCallDeltaChunk(index=index, id=call_id, name=name, arguments_delta=member),
                ),
            )
            for seq, time, member in zip(seqs, times, run.members, strict=True)
        ]
    kind = TextDeltaChunk if run.tag == _TEXT_TAG else ReasoningDeltaChunk
    return [
        AssistantChunk(
            seq=seq, time=time, data=AssistantChunkData(turn=turn, step=step, chunk=kind(index=index, text=member))
        )
        for seq, time, member in zip(seqs, times, run.members, strict=True)
    ]


Segment = SessionEvent | PackedRun

#: How close to the end a positional access is answered by walking back (:meth:`StoredEvents._from_end`) rather
#: than by building the index of every segment's end.
_TAIL = 64


class StoredEvents(Sequence[SessionEvent]):
    """An immutable sequence of stored events whose packed chunk runs expand only where a reader asks.

    Build one with :meth:`concat` (from event sequences, keeping the packed runs of any ``StoredEvents`` among
    them) or ``StoredEvents(events)``. Equal to any sequence holding equal events in the same order.
    """

    __slots__ = ("_ends_of", "_items", "_len")

    def __init__(self, events: Iterable[SessionEvent] = ()) -> None:
        items: list[Segment] = list(events)
        self._set(items, len(items))

    def _set(self, items: list[Segment], size: int) -> None:
        self._items = items
        self._len = size
        self._ends_of: list[int] | None = None  # each segment's end index, built on the first positional access

    @property
    def _ends(self) -> list[int]:
        ends = self._ends_of
        if ends is None:
            ends = self._ends_of = list(
                accumulate(item.count if type(item) is PackedRun else 1 for item in self._items)
            )
        return ends

    @classmethod
    def _of(cls, items: list[Segment], size: int | None = None) -> StoredEvents:
        """From segments (plain events and packed runs) in order, holding ``size`` events in all (counted when
        ``None``); for the core package's readers only."""
        out = cls.__new__(cls)
        if size is None:
            size = sum(item.count if type(item) is PackedRun else 1 for item in items)
        out._set(items, size)
        return out

    @classmethod
    def concat(cls, parts: Iterable[Sequence[SessionEvent]]) -> StoredEvents:
        """The events of ``parts`` one after another; a ``StoredEvents`` part keeps its runs packed."""
        items: list[Segment] = []
        size = 0
        for part in parts:
            if type(part) is StoredEvents:
                items.extend(part._items)
            else:
                items.extend(part)
            size += len(part)
        return cls._of(items, size)

    def _segments(self) -> list[Segment]:
        """The plain events and packed runs in order (for readers that handle a run as one unit)."""
        return self._items

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> SessionEvent: ...

    @overload
    def __getitem__(self, index: slice) -> StoredEvents: ...

    def __getitem__(self, index: int | slice) -> SessionEvent | StoredEvents:
        if isinstance(index, slice):
            return self._slice(index)
        size = len(self)
        position = operator.index(index)
        if position < 0:
            position += size
        if not 0 <= position < size:
            raise IndexError("StoredEvents index out of range")
        if self._ends_of is None and position >= size - _TAIL:
            return self._from_end(size - 1 - position)
        at = bisect_right(self._ends, position)
        item = self._items[at]
        if type(item) is PackedRun:
            return item.events()[position - (self._ends[at] - item.count)]
        return item  # type: ignore[return-value]

    def _from_end(self, back: int) -> SessionEvent:
        """The event ``back`` places before the last, found by walking the segments from the end (a reader of the
        tail, such as the repair closers' walk back to the last turn boundary, needs no index of the whole log)."""
        for item in reversed(self._items):
            if type(item) is PackedRun:
                if back < item.count:
                    return item.events()[item.count - 1 - back]
                back -= item.count
            elif back == 0:
                return item  # type: ignore[return-value]
            else:
                back -= 1
        raise IndexError("StoredEvents index out of range")  # pragma: no cover - the caller checked the range

    def _slice(self, index: slice) -> StoredEvents:
        start, stop, step = index.indices(len(self))
        if step != 1:
            return StoredEvents([self[i] for i in range(start, stop, step)])
        if start >= stop:
            return StoredEvents()
        ends, items = self._ends, self._items
        first = bisect_right(ends, start)
        last = bisect_right(ends, stop - 1)
        out: list[Segment] = []
        for at in range(first, last + 1):
            item = items[at]
            if type(item) is not PackedRun:
                out.append(item)
                continue
            begin = ends[at] - item.count
            if start <= begin and ends[at] <= stop:
                out.append(item)  # whole run: stays packed
            else:
                out.extend(item.events()[max(start, begin) - begin : min(stop, ends[at]) - begin])
        return StoredEvents._of(out)

    def __iter__(self) -> Iterator[SessionEvent]:
        for item in self._items:
            if type(item) is PackedRun:
                yield from item.events()
            else:
                yield item  # type: ignore[misc]

    def __reversed__(self) -> Iterator[SessionEvent]:
        for item in reversed(self._items):
            if type(item) is PackedRun:
                yield from reversed(item.events())
            else:
                yield item  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes, bytearray, memoryview)):
            return NotImplemented
        if len(other) != len(self):
            return False
        return all(a is b or a == b for a, b in zip(self, other, strict=True))

    def __add__(self, other: object) -> StoredEvents:
        """The events of ``self`` then those of ``other`` (any sequence of events; runs stay packed)."""
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes, bytearray, memoryview)):
            return NotImplemented
        return StoredEvents.concat((self, other))

    def __radd__(self, other: object) -> StoredEvents:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes, bytearray, memoryview)):
            return NotImplemented
        return StoredEvents.concat((other, self))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"StoredEvents({list(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (StoredEvents, (list(self),))
