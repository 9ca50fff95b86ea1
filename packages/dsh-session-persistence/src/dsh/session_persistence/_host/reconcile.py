"""Reconciling unknown outcomes: ask a tool what became of a call that a crash left without a result.

Crash repair closes such a call with ``TOOL_OUTCOME_UNKNOWN`` (the call was recorded, its result never was). A tool
that can look its effect up by the call id (the idempotency key it was given) offers ``reconcile(arguments,
call_id)``; its :class:`Reconciliation` is recorded as a ``tool/reconcile`` event. ``happened`` and
``not-happened`` carry the tool-result message the model sees in that call's place from then on (the stored
repair is never rewritten: the projection substitutes it); ``unknown`` keeps the repair's text. Nothing here runs a
tool body: a call that did not happen is reported, never retried.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from msgspec import UnsetType

from .._model.events import (
    Message,
    SessionEvent,
    ToolReconcile,
    ToolResult,
)
from .._model.repair import UnknownCall, unknown_calls
from .boundaries import ToolExecutionResult

__all__ = [
    "DEFAULT_RECONCILE_TIMEOUT_S",
    "TOOL_RECONCILED_HAPPENED_TEXT",
    "TOOL_RECONCILED_NOT_HAPPENED_TEXT",
    "Reconciliation",
    "UnknownCall",
    "describe",
    "reconcile_data",
    "reconciler_of",
    "run_check",
    "substitute_finding",
    "unknown_calls",
]

#: How long one reconciliation check may take before it counts as "cannot tell".
DEFAULT_RECONCILE_TIMEOUT_S = 10.0

TOOL_RECONCILED_HAPPENED_TEXT = (
    "The tool call was interrupted by a crash after it was recorded. A reconciliation check by its call id found "
    "that it DID take effect; its result follows. Do not run it again for the same purpose."
)
TOOL_RECONCILED_NOT_HAPPENED_TEXT = (
    "The tool call was interrupted by a crash after it was recorded. A reconciliation check by its call id found "
    "that it did NOT take effect. It was not retried: call it again only if it is still needed."
)

Outcome = Literal["happened", "not-happened", "unknown"]


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """What a tool's reconciliation check found about one call (build it with the three constructors).

    :param outcome: ``happened``, ``not-happened`` or ``unknown`` (cannot tell).
    :param result: For ``happened``: what the call returned (text or a :class:`ToolExecutionResult`).
    :param detail: Why, in a few words (recorded in the log; shown to the model for ``not-happened``).
    """

    outcome: Outcome
    result: str | ToolExecutionResult | None = None
    detail: str = ""

    @classmethod
    def happened(cls, result: str | ToolExecutionResult, detail: str = "") -> Reconciliation:
        """The effect took place; ``result`` is what the call returned (the model sees it as the call's result)."""
        return cls("happened", result, detail)

    @classmethod
    def did_not_happen(cls, detail: str = "") -> Reconciliation:
        """The effect certainly did not take place (the call is not re-run: the model decides)."""
        return cls("not-happened", None, detail)

    @classmethod
    def cannot_tell(cls, detail: str = "") -> Reconciliation:
        """The check cannot find out; the model keeps seeing that the outcome is unknown."""
        return cls("unknown", None, detail)


Check = Callable[[Any, str], Awaitable[Reconciliation]]


def reconciler_of(tool: object) -> Check | None:
    """The tool's ``reconcile(arguments, call_id)`` if it offers one (a callable attribute, not ``None``)."""
    check = getattr(tool, "reconcile", None)
    return check if callable(check) else None


async def run_check(check: Check, call: UnknownCall, limit_s: float) -> Reconciliation:
    """Run one check, bounded by ``limit_s`` seconds: a check that raises, hangs or answers nonsense cannot tell."""
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
    if answer.outcome == "happened" and not isinstance(answer.result, (str, ToolExecutionResult)):
        return Reconciliation.cannot_tell("the check said happened without a result")
    return answer


def _content(result: str | ToolExecutionResult) -> tuple[list[dict[str, Any]], bool]:
    if isinstance(result, str):
        return [{"type": "text", "text": result}], False
    return [dict(block) for block in result.content], result.is_error


def reconcile_data(call: UnknownCall, finding: Reconciliation, seq: int) -> dict[str, Any]:
    """The ``tool/reconcile`` payload for ``finding`` (``seq``: the seq the event will get; names the message)."""
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
        assert finding.result is not None
        blocks, is_error = _content(finding.result)
        content = [{"type": "text", "text": TOOL_RECONCILED_HAPPENED_TEXT}, *blocks]
    else:
        text = TOOL_RECONCILED_NOT_HAPPENED_TEXT + (f" ({finding.detail})" if finding.detail else "")
        content, is_error = [{"type": "text", "text": text}], True
    block: dict[str, Any] = {"type": "tool-result", "toolCallId": call.call_id, "content": content}
    if is_error:
        block["isError"] = True
    data["message"] = {
        "id": f"reconciled-tool-result-{call.call_id}-{seq}",
        "role": "user",
        "content": [block],
        "source": {"kind": "tool", "callId": call.call_id},
    }
    return data


def describe(data: Mapping[str, Any]) -> str:
    """One line for people: what the finding says (the CLI's ``show``/``verify`` print it)."""
    outcome = data.get("outcome")
    what = {"happened": "happened", "not-happened": "did not happen", "unknown": "cannot tell"}.get(str(outcome), "?")
    detail = data.get("detail")
    return f"reconciled {data.get('name')} [{data.get('callId')}]: {what}" + (f" ({detail})" if detail else "")


def substitute_finding(messages: list[Message], events: Sequence[SessionEvent], event: ToolReconcile) -> None:
    """The projection rule: a conclusive finding takes the place of its call's unknown-outcome result message.

    Only the message the repaired ``tool/result`` (``result_seq``) put in ``messages`` is replaced, in place, so
    the model sees the call answered where a provider expects its result; an ``unknown`` finding changes nothing.
    """
    message = event.data.message
    seq = event.data.result_seq
    if isinstance(message, UnsetType) or not 0 <= seq < len(events):
        return
    repaired = events[seq]
    if type(repaired) is not ToolResult:
        return
    for index in range(len(messages) - 1, -1, -1):
        if messages[index] is repaired.data.message:
            messages[index] = message
            return
