"""Crash repair: close an interrupted final turn honestly instead of truncating it (session-core §3).

A pure function of the stored events. It appends, in order, one synthetic ``tool/result`` per unanswered
model-requested call (``TOOL_NOT_STARTED`` when no durable ``tool/call`` exists, else ``TOOL_OUTCOME_UNKNOWN``),
then ``step/end`` if a step is open, then ``turn/end {interrupted}``. Committed events are never rewritten.
:func:`unknown_calls` finds, after the repair, the ``TOOL_OUTCOME_UNKNOWN`` calls a reconciliation check may still
settle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from msgspec import UNSET

from .codes import (
    TOOL_ABORTED,
    TOOL_ABORTED_BEFORE_DISPATCH,
    TOOL_ABORTED_BEFORE_DISPATCH_TEXT,
    TOOL_ABORTED_TEXT,
    TOOL_NOT_STARTED,
    TOOL_NOT_STARTED_TEXT,
    TOOL_OUTCOME_UNKNOWN,
    TOOL_OUTCOME_UNKNOWN_TEXT,
)
from .events import (
    AssistantMessage,
    InterruptedReason,
    Message,
    SessionEvent,
    StepData,
    StepEnd,
    StepStart,
    TextBlock,
    ToolCall,
    ToolCallBlock,
    ToolErrorInfo,
    ToolReconcile,
    ToolResult,
    ToolResultBlock,
    ToolResultData,
    ToolSource,
    TurnEnd,
    TurnEndData,
    TurnStart,
)

__all__ = [
    "TOOL_ABORTED",
    "TOOL_ABORTED_BEFORE_DISPATCH",
    "TOOL_ABORTED_BEFORE_DISPATCH_TEXT",
    "TOOL_ABORTED_TEXT",
    "TOOL_NOT_STARTED",
    "TOOL_NOT_STARTED_TEXT",
    "TOOL_OUTCOME_UNKNOWN",
    "TOOL_OUTCOME_UNKNOWN_TEXT",
    "UnknownCall",
    "has_open_turn",
    "interrupted_turn_closers",
    "unknown_calls",
]

_NOT_STARTED_ERROR = ToolErrorInfo(name="ToolNotStartedError", code=TOOL_NOT_STARTED)
_UNKNOWN_ERROR = ToolErrorInfo(name="ToolOutcomeUnknownError", code=TOOL_OUTCOME_UNKNOWN)


class _Pending:
    __slots__ = ("call_seq", "step")

    def __init__(self, step: int) -> None:
        self.step = step
        self.call_seq: int | None = None


def has_open_turn(events: Sequence[SessionEvent]) -> bool:
    """Whether the last turn boundary in ``events`` is a ``turn/start``."""
    for event in reversed(events):
        if type(event) is TurnEnd:
            return False
        if type(event) is TurnStart:
            return True
    return False


def interrupted_turn_closers(events: Sequence[SessionEvent]) -> list[SessionEvent]:
    """The events that close an interrupted final turn, or ``[]`` for a balanced log.

    Deterministic: seqs continue from the last event, every closer reuses the last event's ``time``, and the
    synthetic result ids are ``interrupted-tool-result-<callId>-<seq>``.
    """
    # Only the last turn matters: a turn/start resets the whole state and a turn/end closes it, so the walk starts
    # at the last turn boundary (a balanced log ends with turn/end and needs no walk at all).
    start = len(events)
    while start:
        start -= 1
        boundary = events[start]
        if isinstance(boundary, TurnStart):
            break
        if isinstance(boundary, TurnEnd):
            return []
    else:
        return []
    open_turn: int | None = None
    open_step: int | None = None
    pending: dict[str, _Pending] = {}
    for index in range(start, len(events)):
        event = events[index]
        if isinstance(event, TurnStart):
            open_turn = event.data.turn
            open_step = None
            pending.clear()
        elif isinstance(event, TurnEnd):
            open_turn = None
            open_step = None
            pending.clear()
        elif isinstance(event, StepStart):
            open_step = event.data.step
        elif isinstance(event, StepEnd):
            open_step = None
            pending.clear()
        elif isinstance(event, AssistantMessage):
            data = event.data
            for block in data.message.content:
                if isinstance(block, ToolCallBlock):
                    # A re-used id keeps its original position but loses any recorded call seq.
                    pending[block.id] = _Pending(data.step)
        elif isinstance(event, ToolCall):
            entry = pending.get(event.data.call_id)
            if entry is not None:
                entry.call_seq = event.seq
        elif isinstance(event, ToolResult):
            source = event.data.message.source
            if isinstance(source, ToolSource):
                pending.pop(source.call_id, None)
    if open_turn is None or not events:
        return []
    last = events[-1]
    seq = last.seq + 1
    time = last.time
    closers: list[SessionEvent] = []
    for call_id, entry in pending.items():
        started = entry.call_seq is not None
        text = TOOL_OUTCOME_UNKNOWN_TEXT if started else TOOL_NOT_STARTED_TEXT
        message = Message(
            id=f"interrupted-tool-result-{call_id}-{seq}",
            role="user",
            source=ToolSource(call_id=call_id),
            content=(ToolResultBlock(tool_call_id=call_id, is_error=True, content=(TextBlock(text=text),)),),
        )
        closers.append(
            ToolResult(
                seq=seq,
                time=time,
                surface_op="append",
                source_event_seqs=(entry.call_seq,) if entry.call_seq is not None else UNSET,
                data=ToolResultData(
                    turn=open_turn,
                    step=entry.step,
                    message=message,
                    error=_UNKNOWN_ERROR if started else _NOT_STARTED_ERROR,
                ),
            )
        )
        seq += 1
    if open_step is not None:
        closers.append(StepEnd(seq=seq, time=time, data=StepData(turn=open_turn, step=open_step)))
        seq += 1
    closers.append(TurnEnd(seq=seq, time=time, data=TurnEndData(turn=open_turn, reason=InterruptedReason())))
    return closers


@dataclass(frozen=True, slots=True)
class UnknownCall:
    """A call whose repaired result says ``TOOL_OUTCOME_UNKNOWN`` and that no finding has concluded yet.

    :param call_id: The call's id (the idempotency key its tool was given).
    :param name: The tool's name.
    :param arguments: The arguments as recorded in its ``tool/call`` (JSON text).
    :param result_seq: The seq of the repaired ``tool/result`` (a ``tool/reconcile`` finding names it).
    """

    call_id: str
    name: str
    arguments: str
    result_seq: int


def unknown_calls(events: Sequence[SessionEvent]) -> list[UnknownCall]:
    """Every unconcluded unknown-outcome call of ``events``, in log order (an ``unknown`` finding concludes none).

    A call counts when its ``tool/call`` is durable and its ``tool/result`` is a ``TOOL_OUTCOME_UNKNOWN`` repair,
    until a ``tool/reconcile`` finding ``happened`` or ``not-happened`` names that very result.
    """
    calls: dict[int, ToolCall] = {}
    found: dict[str, UnknownCall] = {}
    for event in events:
        if type(event) is ToolCall:
            calls[event.seq] = event
        elif type(event) is ToolResult:
            if getattr(event.data.error, "code", None) != TOOL_OUTCOME_UNKNOWN:
                continue
            seqs = event.source_event_seqs
            call = calls.get(seqs[0]) if isinstance(seqs, tuple) and seqs else None
            if call is not None:
                found[call.data.call_id] = UnknownCall(
                    call.data.call_id, call.data.name, call.data.arguments, event.seq
                )
        elif type(event) is ToolReconcile and event.data.outcome != "unknown":
            entry = found.get(event.data.call_id)
            if entry is not None and entry.result_seq == event.data.result_seq:
                del found[event.data.call_id]
    return sorted(found.values(), key=lambda call: call.result_seq)
