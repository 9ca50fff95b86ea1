"""A readable transcript of a session log: turns, steps, messages, tool calls and their results.

:func:`transcript_entries` turns events into flat entries (plain JSON, also the ``show --json`` shape);
:func:`render_transcript` prints them. Streamed chunks and request headers are summarized, not printed one by one.
Repair closers are marked: ``repair`` names the code (``TOOL_OUTCOME_UNKNOWN``, ``TOOL_NOT_STARTED``, or
``interrupted`` for the synthetic turn end) and ``pending`` says the closer exists only in this read-only view (a
cold load or ``dsh-sessions repair`` would commit it).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from typing import Any, TextIO

from .._host.reconcile import describe, unknown_calls
from .._model.events import SessionEvent, ToolReconcile, TurnContinue
from .._model.repair import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN
from .._wire.codec import event_to_builtins

__all__ = ["REPAIR_MEANINGS", "message_text", "render_transcript", "resume_facts", "resume_lines", "transcript_entries"]

#: What each reconciliation outcome means, for ``show``.
RECONCILE_MEANINGS = {
    "happened": "the tool's check found the effect: the model sees the call's result instead of 'unknown'",
    "not-happened": "the tool's check found no effect: the model is told so (the call was not re-run)",
    "unknown": "the tool's check could not tell (or failed, or timed out): the model keeps the 'unknown' text",
}

#: What each repair closer means, for ``show`` and ``demo``.
REPAIR_MEANINGS = {
    TOOL_OUTCOME_UNKNOWN: (
        "the call was durably recorded as started (its tool/call was on disk) but no result was: the tool body "
        "may or may not have done its side effect. The model is told not to retry blindly, but to check first."
    ),
    TOOL_NOT_STARTED: (
        "the model asked for the call, but no durable tool/call exists: the tool body certainly never ran, so "
        "retrying it is safe."
    ),
    "interrupted": (
        "the turn was open when the process died: repair closed the open step and ended the turn "
        "'interrupted', so the transcript is balanced and a provider accepts it."
    ),
}

_WIDTH = 100
_LABEL = 11


def message_text(message: dict[str, Any]) -> str:
    """The text of a message's content blocks (text, reasoning, nested tool-result content)."""
    parts: list[str] = []
    for block in message.get("content", ()):
        parts.append(_block_text(block))
    return "\n".join(p for p in parts if p)


def _block_text(block: Any) -> str:
    if not isinstance(block, dict):
        return ""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "reasoning":
        return f"(thinking) {block.get('text', '')}"
    if kind == "image":
        return "[image]"
    if kind == "tool-result":
        return "\n".join(t for t in (_block_text(b) for b in block.get("content", ())) if t)
    return ""


def _arguments(raw: object) -> str:
    if not isinstance(raw, str):
        return json.dumps(raw, ensure_ascii=False)
    try:
        return json.dumps(json.loads(raw), ensure_ascii=False, separators=(", ", ": "))
    except ValueError:
        return raw


def transcript_entries(events: Sequence[SessionEvent], stored: int | None = None) -> list[dict[str, Any]]:
    """Flat transcript entries for ``events``; events at index ``>= stored`` are marked ``pending``."""
    limit = len(events) if stored is None else stored
    names: dict[str, str] = {}
    entries: list[dict[str, Any]] = []
    chunks = 0
    for index, event in enumerate(events):
        raw = event_to_builtins(event)
        etype = raw.get("type")
        data: dict[str, Any] = raw["data"] if isinstance(raw.get("data"), dict) else {}
        entry: dict[str, Any] = {"seq": raw.get("seq"), "time": raw.get("time")}
        if index >= limit:
            entry["pending"] = True
        if etype == "assistant/chunk":
            chunks += 1
            continue
        if etype == "turn/start":
            entry.update(kind="turn-start", turn=data.get("turn"))
        elif etype == "turn/end":
            reason: dict[str, Any] = data["reason"] if isinstance(data.get("reason"), dict) else {}
            kind = reason.get("kind")
            entry.update(kind="turn-end", turn=data.get("turn"), reason=kind)
            if kind == "interrupted":
                entry["repair"] = "interrupted"
            detail = reason.get("error") or reason.get("reason")
            if detail is not None:
                entry["detail"] = detail
        elif etype == "step/start":
            entry.update(kind="step-start", turn=data.get("turn"), step=data.get("step"))
        elif etype == "step/end":
            entry.update(kind="step-end", turn=data.get("turn"), step=data.get("step"))
        elif etype == "user/message":
            entry.update(kind="user", text=message_text(data))
        elif etype == "assistant/message":
            message = data.get("message", {})
            calls = []
            for block in message.get("content", ()):
                if isinstance(block, dict) and block.get("type") == "tool-call":
                    names[str(block.get("id"))] = str(block.get("name"))
                    calls.append(
                        {"id": block.get("id"), "name": block.get("name"), "arguments": block.get("arguments")}
                    )
            entry.update(kind="assistant", text=message_text(message), toolCalls=calls, chunks=chunks)
            if data.get("interrupted"):
                entry["interrupted"] = True
            chunks = 0
        elif etype == "tool/call":
            names[str(data.get("callId"))] = str(data.get("name"))
            entry.update(kind="tool-call", callId=data.get("callId"), name=data.get("name"))
            entry["arguments"] = data.get("arguments")
        elif etype == "tool/result":
            message = data.get("message", {})
            source = message.get("source", {})
            call_id = source.get("callId") if isinstance(source, dict) else None
            error = data.get("error") if isinstance(data.get("error"), dict) else None
            is_error = any(
                isinstance(b, dict) and b.get("type") == "tool-result" and b.get("isError") is True
                for b in message.get("content", ())
            )
            entry.update(kind="tool-result", callId=call_id, name=names.get(str(call_id)), text=message_text(message))
            entry["isError"] = is_error
            if error is not None:
                entry["error"] = error.get("code")
                if error.get("code") in (TOOL_OUTCOME_UNKNOWN, TOOL_NOT_STARTED):
                    entry["repair"] = error.get("code")
        elif etype == "request/header":
            header = data.get("header", {})
            config = header.get("config", {}) if isinstance(header, dict) else {}
            entry.update(kind="request", reason=data.get("reason"), provider=config.get("provider"))
            entry["model"] = config.get("model")
        elif etype == "session/end-seed":
            entry.update(kind="seed-end")
        elif etype == "turn/continue":
            entry.update(kind="turn-continue", turn=data.get("turn"), interruptedTurn=data.get("interruptedTurn"))
        elif etype == "tool/reconcile":
            entry.update(kind="reconcile", callId=data.get("callId"), name=data.get("name"))
            entry.update(outcome=data.get("outcome"), resultSeq=data.get("resultSeq"), detail=data.get("detail"))
            message = data.get("message")
            entry["text"] = message_text(message) if isinstance(message, dict) else ""
            for earlier in entries:  # mark the repaired result it speaks about
                if earlier.get("kind") == "tool-result" and earlier.get("seq") == data.get("resultSeq"):
                    earlier["reconciled"] = data.get("outcome")
        elif etype == "request/context":
            continue
        else:
            entry.update(kind="event", type=etype)
        entries.append(entry)
    return entries


def _write_block(out: TextIO, indent: str, label: str, text: str) -> None:
    prefix = f"{indent}{label:<{_LABEL}}"
    lines = text.splitlines() or [""]
    width = max(40, _WIDTH - len(prefix))
    first = True
    for line in lines:
        for piece in textwrap.wrap(line, width) or [""]:
            out.write(f"{prefix if first else ' ' * len(prefix)}{piece}\n")
            first = False


def _repair_note(entry: dict[str, Any]) -> str:
    code = "closed by crash repair" if entry["repair"] == "interrupted" else entry["repair"]
    if entry.get("pending"):
        return f"[REPAIR PENDING: {code}; not on disk yet]"
    return f"[REPAIRED: {code}]"


def render_transcript(out: TextIO, entries: Sequence[dict[str, Any]]) -> None:
    """Print the entries as an indented transcript."""
    indent = "  "
    for entry in entries:
        kind = entry["kind"]
        if kind == "turn-start":
            out.write(f"\n== turn {entry['turn']} ==\n")
            indent = "  "
        elif kind == "step-start":
            out.write(f"  -- step {entry['step']} --\n")
            indent = "    "
        elif kind == "step-end":
            indent = "  "
        elif kind == "turn-end":
            text = f"turn {entry['turn']} ended: {entry['reason']}"
            if entry.get("detail") is not None:
                text += f" ({_detail(entry['detail'])})"
            if "repair" in entry:
                text += "  " + _repair_note(entry)
            out.write(f"  {text}\n")
            indent = "  "
        elif kind == "user":
            _write_block(out, indent, "user", entry["text"])
        elif kind == "assistant":
            text = entry["text"]
            if entry.get("interrupted"):
                text = f"{text} [interrupted mid-stream]".strip()
            if text:
                _write_block(out, indent, "assistant", text)
            for call in entry["toolCalls"]:
                asks = f"asks for {call['name']}({_arguments(call['arguments'])}) [{call['id']}]"
                _write_block(out, indent, "assistant", asks)
        elif kind == "tool-call":
            _write_block(out, indent, "tool", f"{entry['name']} [{entry['callId']}] started")
        elif kind == "tool-result":
            head = f"{entry['name'] or '?'} [{entry['callId']}]"
            if "repair" in entry:
                head += "  " + _repair_note(entry)
                if entry.get("reconciled") is not None:
                    head += f" [RECONCILED: {entry['reconciled']}, see below]"
            elif entry.get("isError"):
                head += "  (error" + (f" {entry['error']}" if entry.get("error") else "") + ")"
            _write_block(out, indent, "result", f"{head}\n{entry['text']}" if entry["text"] else head)
        elif kind == "request":
            if entry.get("reason") != "initial":
                _write_block(out, indent, "model", f"{entry['provider']}/{entry['model']} (request: {entry['reason']})")
        elif kind == "seed-end":
            out.write(f"{indent}--- resumed here: the events above were loaded from storage ---\n")
        elif kind == "turn-continue":
            out.write(f"  (continues interrupted turn {entry['interruptedTurn']}: no new user message)\n")
        elif kind == "reconcile":
            head = describe(entry) + f"  (result seq {entry['resultSeq']})"
            meaning = RECONCILE_MEANINGS.get(str(entry.get("outcome")), "")
            body = "\n".join(t for t in (meaning, entry["text"]) if t)
            _write_block(out, indent, "check", f"{head}\n{body}" if body else head)
        else:
            _write_block(out, indent, "event", str(entry.get("type")))


def _detail(detail: object) -> str:
    if isinstance(detail, dict):
        return str(detail.get("message") or detail.get("kind") or json.dumps(detail))
    return str(detail)


def resume_facts(events: Sequence[SessionEvent]) -> dict[str, Any]:
    """What the resume paths recorded: findings, continuations, and the unknown outcomes no finding concluded."""
    findings = [event_to_builtins(e)["data"] for e in events if type(e) is ToolReconcile]
    continued = [
        {"turn": e.data.turn, "interruptedTurn": e.data.interrupted_turn} for e in events if type(e) is TurnContinue
    ]
    unknown = [{"callId": c.call_id, "name": c.name, "resultSeq": c.result_seq} for c in unknown_calls(events)]
    reconciled = [{k: f[k] for k in ("callId", "name", "outcome", "resultSeq", "detail") if k in f} for f in findings]
    return {"reconciled": reconciled, "continued": continued, "unknownOutcomes": unknown}


def resume_lines(events: Sequence[SessionEvent]) -> list[str]:
    """``resume_facts`` as short phrases (``verify`` appends them to a session's line)."""
    facts = resume_facts(events)
    lines = [describe(f) for f in facts["reconciled"]]
    lines += [f"turn {c['turn']} continues interrupted turn {c['interruptedTurn']}" for c in facts["continued"]]
    if facts["unknownOutcomes"]:
        lines.append(f"{len(facts['unknownOutcomes'])} call(s) with an unknown outcome")
    return lines
