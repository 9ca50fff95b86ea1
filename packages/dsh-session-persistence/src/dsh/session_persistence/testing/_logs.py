"""Small builders for the session logs the conformance kit writes (coordinator.md §7 fixtures).

Every builder goes through :func:`~dsh.session_persistence.backend.decode_event`, so the events are exactly
what a live session would produce; only :func:`raw_event` builds an event without validation (for planting
data that a reader must refuse).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._model.events import OpaqueEvent, SessionEvent
from .._model.header import SESSION_FORMAT_VERSION, SessionHeader
from .._wire.codec import decode_event

__all__ = [
    "OTHER",
    "WORK",
    "assistant_message",
    "event",
    "meta",
    "one_turn_log",
    "opaque",
    "simple_turn",
    "step_end",
    "step_start",
    "tool_call",
    "turn_end",
    "turn_start",
    "user_message",
]

#: Working directories used by the scenarios (absolute, never touched on disk).
WORK = "/w"
OTHER = "/other"
_TIME = 1_000


def meta(
    session_id: str,
    cwd: str | None = None,
    *,
    created_at: int = 1000,
    is_seeded: bool = False,
    version: int = SESSION_FORMAT_VERSION,
    **extra: Any,
) -> SessionHeader:
    """The scenarios' header: ``{version, id, createdAt: 1000, isSeeded: False, cwd?}`` plus optional fields.

    ``version`` is not validated here on purpose, so a test can build a header a reader must refuse.
    """
    fields: dict[str, Any] = {"version": version, "id": session_id, "created_at": created_at, "is_seeded": is_seeded}
    if cwd is not None:
        fields["cwd"] = cwd
    fields.update(extra)
    return SessionHeader(**fields)


def event(seq: int, event_type: str, data: object, **envelope: Any) -> SessionEvent:
    """Decode one event from its wire form (``envelope`` holds extra wire keys such as ``ignorable=True``)."""
    obj: dict[str, Any] = {"type": event_type, "seq": seq, "time": _TIME + seq, "data": data}
    obj.update(envelope)
    return decode_event(obj)


def turn_start(seq: int, turn: int = 1) -> SessionEvent:
    return event(seq, "turn/start", {"turn": turn})


def turn_end(seq: int, turn: int = 1, reason: str = "completed") -> SessionEvent:
    return event(seq, "turn/end", {"turn": turn, "reason": {"kind": reason}})


def step_start(seq: int, turn: int = 1, step: int = 1) -> SessionEvent:
    return event(seq, "step/start", {"turn": turn, "step": step})


def step_end(seq: int, turn: int = 1, step: int = 1) -> SessionEvent:
    return event(seq, "step/end", {"turn": turn, "step": step})


def user_message(seq: int, text: str = "hi", message_id: str | None = None) -> SessionEvent:
    message = {
        "id": message_id or f"user-{seq}",
        "role": "user",
        "content": [{"type": "text", "text": text}],
        "source": {"kind": "user"},
    }
    return event(seq, "user/message", message, surfaceOp="append")


def assistant_message(
    seq: int,
    text: str = "hello",
    *,
    turn: int = 1,
    step: int = 1,
    message_id: str | None = None,
    tool_calls: Sequence[str] = (),
) -> SessionEvent:
    """An ``assistant/message``; each id in ``tool_calls`` adds a requested tool call block."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    content += [{"type": "tool-call", "id": call_id, "name": "probe", "arguments": "{}"} for call_id in tool_calls]
    message = {
        "id": message_id or f"assistant-{seq}",
        "role": "assistant",
        "content": content,
        "source": {"kind": "model", "provider": "mock", "model": "mock"},
    }
    return event(seq, "assistant/message", {"turn": turn, "step": step, "message": message}, surfaceOp="append")


def tool_call(seq: int, call_id: str, *, turn: int = 1, step: int = 1) -> SessionEvent:
    return event(seq, "tool/call", {"turn": turn, "step": step, "callId": call_id, "name": "probe", "arguments": "{}"})


def one_turn_log() -> list[SessionEvent]:
    """Six events, seq 0..5: one completed turn with a user message and an assistant reply."""
    return [
        turn_start(0, 1),
        user_message(1, "hi", "one-turn-user"),
        step_start(2, 1, 1),
        assistant_message(3, "hello", message_id="one-turn-assistant"),
        step_end(4, 1, 1),
        turn_end(5, 1),
    ]


def simple_turn(first_seq: int, turn: int, text: str = "hi") -> list[SessionEvent]:
    """A complete three-event turn starting at ``first_seq``: turn/start, user/message, turn/end."""
    return [
        turn_start(first_seq, turn),
        user_message(first_seq + 1, text),
        turn_end(first_seq + 2, turn),
    ]


def opaque(seq: int, event_type: str, data: object, *, ignorable: bool) -> OpaqueEvent:
    """An event of a type unknown to this build (what a plugin or a newer harness may have written)."""
    if ignorable:
        return OpaqueEvent(type=event_type, seq=seq, time=_TIME + seq, data=data, ignorable=True)
    return OpaqueEvent(type=event_type, seq=seq, time=_TIME + seq, data=data)
