"""Reading a session back as pydantic-ai history: the stored messages, then the answers crash repair wrote.

A call a crash cut has no tool return among the stored messages; crash repair answered it with a ``tool/result``
(``TOOL_OUTCOME_UNKNOWN`` when its body may have run, ``TOOL_NOT_STARTED`` when it never started). The history hands
the model one closing request with a tool return per such call, carrying that text, or a reconciliation check's
finding in its place: the call is answered, never run again.

Reconciliation follows the core's rules (``dsh.session_persistence.loop.Reconciliation``): the calls to check are
the core's ``repair.unknown_calls``; a check ``check(arguments, call_id)`` per tool name, bounded in time; its finding
is a ``tool/reconcile`` event between turns; a check that fails, hangs or answers nonsense cannot tell.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Union

import anyio
from dsh.session_persistence.events import ToolReconcile, ToolResult
from dsh.session_persistence.loop import (
    TOOL_RECONCILED_HAPPENED_TEXT,
    TOOL_RECONCILED_NOT_HAPPENED_TEXT,
    Reconciliation,
)
from dsh.session_persistence.repair import (
    TOOL_ABORTED,
    TOOL_ABORTED_BEFORE_DISPATCH,
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    UnknownCall,
)
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart

from ._messages import answered_ids, from_json
from ._record import stored_messages

__all__ = ["RECONCILE_EVENT", "Check", "project", "reconcile_data", "run_check"]

#: The core's record of a reconciliation finding.
RECONCILE_EVENT = "tool/reconcile"

#: What a tool offers to find out whether a call took effect: ``check(arguments, call_id)``.
Check = Callable[[Any, str], Union[Reconciliation, Awaitable[Reconciliation]]]

_REPAIR_CODES = frozenset({TOOL_OUTCOME_UNKNOWN, TOOL_NOT_STARTED, TOOL_ABORTED, TOOL_ABORTED_BEFORE_DISPATCH})


def _text(message: Any) -> str:
    """The text a tool-result message carries (its tool-result blocks' text blocks, joined)."""
    pieces: list[str] = []
    for block in message.content:
        for inner in getattr(block, "content", ()):
            text = getattr(inner, "text", None)
            if isinstance(text, str):
                pieces.append(text)
    return "\n\n".join(pieces)


def _code(event: ToolResult) -> str | None:
    code = getattr(event.data.error, "code", None)
    return code if isinstance(code, str) else None


async def run_check(check: Check, call: UnknownCall, limit_s: float) -> Reconciliation:
    """One check, bounded by ``limit_s`` seconds; anything but a well-formed finding cannot tell."""
    try:
        arguments = json.loads(call.arguments) if call.arguments else {}
    except ValueError as exc:
        return Reconciliation.cannot_tell(f"the recorded arguments are not JSON ({exc})")
    try:
        with anyio.move_on_after(limit_s) as scope:
            pending: object = check(arguments, call.call_id)
            answer = await pending if inspect.isawaitable(pending) else pending
        if scope.cancelled_caught:
            return Reconciliation.cannot_tell(f"the check did not answer within {limit_s:g}s")
    except Exception as exc:
        return Reconciliation.cannot_tell(f"the check failed: {type(exc).__name__}: {exc}"[:500])
    if not isinstance(answer, Reconciliation) or answer.outcome not in ("happened", "not-happened", "unknown"):
        return Reconciliation.cannot_tell(f"the check answered {type(answer).__name__}, not a Reconciliation")
    if answer.outcome == "happened" and not isinstance(answer.result, str):
        return Reconciliation.cannot_tell("the check said happened without a text result")
    return answer


def reconcile_data(call: UnknownCall, finding: Reconciliation, seq: int) -> dict[str, Any]:
    """The ``tool/reconcile`` payload for ``finding`` (``seq``: the seq it will get, which names its message)."""
    data: dict[str, Any] = {
        "callId": call.call_id,
        "name": call.name,
        "resultSeq": call.result_seq,
        "outcome": finding.outcome,
    }
    if finding.detail:
        data["detail"] = finding.detail
    if finding.outcome == "unknown":
        return data
    if finding.outcome == "happened":
        content = [{"type": "text", "text": TOOL_RECONCILED_HAPPENED_TEXT}, {"type": "text", "text": finding.result}]
        block: dict[str, Any] = {"type": "tool-result", "toolCallId": call.call_id, "content": content}
    else:
        text = TOOL_RECONCILED_NOT_HAPPENED_TEXT + (f" ({finding.detail})" if finding.detail else "")
        block = {"type": "tool-result", "toolCallId": call.call_id, "content": [{"type": "text", "text": text}]}
        block["isError"] = True
    data["message"] = {
        "id": f"reconciled-tool-result-{call.call_id}-{seq}",
        "role": "user",
        "content": [block],
        "source": {"kind": "tool", "callId": call.call_id},
    }
    return data


def project(events: Sequence[Any]) -> list[ModelMessage]:
    """The pydantic-ai history of ``events``: the stored messages, then one request answering each cut call."""
    messages = [from_json(data) for data in stored_messages(events)]
    answered = answered_ids(messages)
    names = {
        part.tool_call_id: part.tool_name
        for message in messages
        if isinstance(message, ModelResponse)
        for part in message.parts
        if isinstance(part, ToolCallPart)
    }
    repaired: dict[str, tuple[int, str]] = {}  # call id -> (its repaired result's seq, the text the model reads)
    for event in events:
        if type(event) is ToolResult and _code(event) in _REPAIR_CODES:
            call_id = getattr(event.data.message.source, "call_id", None)
            if isinstance(call_id, str):
                repaired[call_id] = (event.seq, _text(event.data.message))
        elif type(event) is ToolReconcile:
            entry = repaired.get(event.data.call_id)
            message = event.data.message
            if entry is not None and entry[0] == event.data.result_seq and hasattr(message, "content"):
                repaired[event.data.call_id] = (entry[0], _text(message))
    parts = [
        ToolReturnPart(tool_name=names[call_id], content=text, tool_call_id=call_id)
        for call_id, (_, text) in repaired.items()
        if call_id in names and call_id not in answered
    ]
    if parts:
        messages.append(ModelRequest(parts=list(parts)))
    return messages
