"""The writer: pydantic-ai messages become dsh events in one live session, in the dsh turn shape.

One agent run is one dsh turn and each model request one step of it::

    turn/start, (turn/continue)?, step/start,
      user/message (a user prompt), pydantic-ai/message (the request, verbatim),
      assistant/message (text, reasoning, tool-call blocks), pydantic-ai/message (the response),
      (tool/call, written when its body is about to run)...,
    (tool/result per answered call), step/end, step/start, pydantic-ai/message (the next request), ...
    step/end, turn/end {completed}

A call's ``tool/call`` is written only when its body is about to start, so crash repair tells the calls a crash cut
while running (``TOOL_OUTCOME_UNKNOWN``) from those that never started (``TOOL_NOT_STARTED``). A run that fails or
is cut leaves its turn open: the next load closes it the way crash repair does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsh.session_persistence import Session
from dsh.session_persistence.events import InterruptedReason, OpaqueEvent, TurnEnd, TurnStart
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    ToolReturnPart,
    UserPromptPart,
)

from ._errors import HistoryMismatchError
from ._messages import MESSAGE_EVENT, call_arguments, response_blocks, to_json, user_text

__all__ = ["CONTINUE_EVENT", "PROVIDER", "Recorder", "stored_messages"]

#: The provider named on an assistant message whose response names none.
PROVIDER = "pydantic-ai"

#: The core's continuation record: the new turn carries on the interrupted one.
CONTINUE_EVENT = "turn/continue"


@dataclass
class _Call:
    name: str
    arguments: str
    seq: int | None = None  # its tool/call event, once the body was about to run


def stored_messages(events: Sequence[Any]) -> list[str]:
    """The JSON text of every pydantic-ai message stored in ``events``, in order."""
    return [event.data["json"] for event in events if type(event) is OpaqueEvent and event.type == MESSAGE_EVENT]


class Recorder:
    """Appends one session's events; every method is synchronous (the caller flushes)."""

    def __init__(self, live: Session) -> None:
        self.live = live
        self.stored = stored_messages(live.events)
        self.last_turn = 0
        self.interrupted = False  # the last turn ended interrupted (crash repair closed it)
        for event in reversed(live.events):  # from the last turn boundary back to its turn/start
            if type(event) is TurnEnd:
                self.interrupted = type(event.data.reason) is InterruptedReason
            elif type(event) is TurnStart:
                self.last_turn = event.data.turn
                break
        self.turn: int | None = None
        self.step = 0
        self.responded = False  # the open step holds its model response
        self.calls: dict[str, _Call] = {}  # the open step's calls that no request answered yet
        # The run's message the last stored one is: a history whose message at that place is another object was
        # rewritten (compacted, truncated) after the run began, and recording its tail would fork the log.
        self.anchor: ModelMessage | None = None

    # ---------------------------------------------------------------------------------------------
    # The history a run brings

    def check_prefix(self, history: Sequence[ModelMessage]) -> None:
        """Refuse a run whose history does not start with the stored one (it would fork the log)."""
        stored = self.stored
        if len(history) < len(stored) or any(
            to_json(message) != data for message, data in zip(history, stored, strict=False)
        ):
            raise HistoryMismatchError(
                f'session "{self.live.id}" holds {len(stored)} pydantic-ai message(s) that this run\'s history does '
                "not start with: pass message_history=await durability.history()"
            )
        self.anchor = history[len(stored) - 1] if stored else None

    def sync(self, messages: Sequence[ModelMessage]) -> bool:
        """Record the messages of ``messages`` past the stored ones; ``True`` when anything was appended."""
        count = len(self.stored)
        if count and (len(messages) < count or messages[count - 1] is not self.anchor):
            raise HistoryMismatchError(
                f'session "{self.live.id}": the run\'s history was rewritten after it began (compacted or cut); '
                "the stored history is kept as it was"
            )
        new = messages[count:]
        for message in new:
            if isinstance(message, ModelResponse):
                self._response(message)
            else:
                self._request(message)
            self.anchor = message
        return bool(new)

    # ---------------------------------------------------------------------------------------------
    # Tool bodies and run ends

    def start_call(self, call_id: str) -> bool:
        """Write ``tool/call`` for a call of the open step whose body is about to run; ``True`` if written."""
        call = self.calls.get(call_id)
        if call is None or call.seq is not None or self.turn is None:
            return False
        call.seq = self._append_call(call_id, call)
        return True

    def end_run(self) -> None:
        """Close the open turn as completed (the run returned its result)."""
        if self.turn is None:
            return
        self.live.append("step/end", {"turn": self.turn, "step": self.step})
        self.live.append("turn/end", {"turn": self.turn, "reason": {"kind": "completed"}})
        self.last_turn, self.turn = self.turn, None
        self.interrupted = False
        self.calls.clear()

    # ---------------------------------------------------------------------------------------------
    # Writing

    def _open_turn(self, continuing: bool) -> None:
        turn = self.last_turn + 1
        self.live.append("turn/start", {"turn": turn})
        if continuing and self.interrupted:
            self.live.append(CONTINUE_EVENT, {"turn": turn, "interruptedTurn": turn - 1}, ignorable=True)
        self.turn, self.step, self.responded = turn, 1, False
        self.live.append("step/start", {"turn": turn, "step": 1})

    def _next_step(self) -> None:
        assert self.turn is not None
        self.live.append("step/end", {"turn": self.turn, "step": self.step})
        self.step += 1
        self.responded = False
        self.calls.clear()
        self.live.append("step/start", {"turn": self.turn, "step": self.step})

    def _request(self, request: ModelRequest) -> None:
        prompts = [part for part in request.parts if isinstance(part, UserPromptPart)]
        if self.turn is None:
            self._open_turn(continuing=not prompts)
        elif self.responded:
            for part in request.parts:
                if isinstance(part, (ToolReturnPart, RetryPromptPart)) and part.tool_call_id in self.calls:
                    self._result(part)
            self._next_step()
        for part in prompts:
            message = {
                "id": f"pydantic-ai-{len(self.live.events)}",
                "role": "user",
                "content": [{"type": "text", "text": user_text(part)}],
                "source": {"kind": "user"},
            }
            self.live.append("user/message", message)
        self._verbatim(request)

    def _response(self, response: ModelResponse) -> None:
        if self.turn is None:
            self._open_turn(continuing=False)
        elif self.responded:
            self._next_step()
        assert self.turn is not None
        blocks, calls = response_blocks(response)
        if blocks:
            source = {"kind": "model", "provider": response.provider_name or PROVIDER, "model": response.model_name}
            if not source["model"]:
                source["model"] = "unknown"
            message = {
                "id": f"pydantic-ai-{len(self.live.events)}",
                "role": "assistant",
                "content": blocks,
                "source": source,
            }
            self.live.append("assistant/message", {"turn": self.turn, "step": self.step, "message": message})
        for call in calls:
            self.calls[call.tool_call_id] = _Call(call.tool_name, call_arguments(call))
        self.responded = True
        self._verbatim(response)

    def _append_call(self, call_id: str, call: _Call) -> int:
        data = {"turn": self.turn, "step": self.step, "callId": call_id, "name": call.name, "arguments": call.arguments}
        return self.live.append("tool/call", data).seq

    def _result(self, part: ToolReturnPart | RetryPromptPart) -> None:
        call_id = part.tool_call_id
        call = self.calls.pop(call_id)
        if call.seq is None:  # never ran through a tool body (an output tool, an unknown tool): recorded now
            call.seq = self._append_call(call_id, call)
        if isinstance(part, RetryPromptPart):
            failed, text = True, part.model_response()
        else:  # pydantic-ai 2.x says how a call ended in the return's outcome (a retry is one)
            failed, text = getattr(part, "outcome", "success") != "success", part.model_response_str()
        block: dict[str, Any] = {
            "type": "tool-result",
            "toolCallId": call_id,
            "content": [{"type": "text", "text": text}],
        }
        if failed:
            block["isError"] = True
        message = {
            "id": f"pydantic-ai-{len(self.live.events)}",
            "role": "user",
            "content": [block],
            "source": {"kind": "tool", "callId": call_id},
        }
        self.live.append(
            "tool/result", {"turn": self.turn, "step": self.step, "message": message}, source_event_seqs=[call.seq]
        )

    def _verbatim(self, message: ModelMessage) -> None:
        text = to_json(message)
        self.live.append(MESSAGE_EVENT, {"json": text}, ignorable=True)
        self.stored.append(text)
