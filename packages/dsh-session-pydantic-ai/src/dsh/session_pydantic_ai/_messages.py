"""pydantic-ai messages as dsh event payloads, and the dsh content blocks that say the same to dsh readers.

Each pydantic-ai message is kept whole, as the text of pydantic-ai's own JSON (``ModelMessagesTypeAdapter``, the form
its docs give for storing history), so every part and field round-trips byte for byte: kept as text, not as a JSON
object, because a model's arguments may hold values (a negative zero) that dsh's lossless JSON check refuses. The
first-class dsh blocks beside it (text, reasoning, tool calls) are what ``dsh-sessions show`` prints; they are never
read back into a message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    UserPromptPart,
)

__all__ = ["MESSAGE_EVENT", "answered_ids", "call_arguments", "from_json", "response_blocks", "to_json", "user_text"]

#: The ignorable event holding one pydantic-ai message verbatim: ``{"json": "[<the message>]"}``, the text
#: ``ModelMessagesTypeAdapter.dump_json([message])`` gives.
MESSAGE_EVENT = "pydantic-ai/message"


def to_json(message: ModelMessage) -> str:
    """One message as pydantic-ai's own JSON text (a one-message history)."""
    return ModelMessagesTypeAdapter.dump_json([message]).decode()


def from_json(text: str) -> ModelMessage:
    """The message :func:`to_json` gave ``text`` for."""
    message: ModelMessage = ModelMessagesTypeAdapter.validate_json(text)[0]
    return message


def call_arguments(part: ToolCallPart) -> str:
    """A tool call's arguments as the JSON text the model sent (dsh keeps arguments as unparsed text)."""
    args = part.args
    if args is None:
        return "{}"
    if isinstance(args, str):
        return args
    return json.dumps(args, ensure_ascii=False, sort_keys=False)


def user_text(part: UserPromptPart) -> str:
    """What a person reads of a user prompt: its text, and a bracketed kind for any other content."""
    content = part.content
    if isinstance(content, str):
        return content
    pieces: list[str] = []
    for item in content:
        if isinstance(item, str):
            pieces.append(item)
        else:
            pieces.append(f"[{getattr(item, 'kind', type(item).__name__)}]")
    return "\n".join(pieces)


def response_blocks(response: ModelResponse) -> tuple[list[dict[str, Any]], list[ToolCallPart]]:
    """The dsh content blocks of a model response, and its function tool calls in order."""
    blocks: list[dict[str, Any]] = []
    calls: list[ToolCallPart] = []
    for part in response.parts:
        if isinstance(part, TextPart):
            if part.content:
                blocks.append({"type": "text", "text": part.content})
        elif isinstance(part, ThinkingPart):
            if part.content:
                blocks.append({"type": "reasoning", "text": part.content})
        elif isinstance(part, ToolCallPart):
            arguments = call_arguments(part)
            blocks.append(
                {"type": "tool-call", "id": part.tool_call_id, "name": part.tool_name, "arguments": arguments}
            )
            calls.append(part)
    return blocks, calls


def answered_ids(messages: Sequence[ModelMessage]) -> set[str]:
    """The call ids some request in ``messages`` answers (a tool return or a retry prompt naming the call)."""
    found: set[str] = set()
    for message in messages:
        if isinstance(message, ModelResponse):
            continue
        for part in message.parts:
            call_id = getattr(part, "tool_call_id", None)
            if isinstance(call_id, str) and getattr(part, "part_kind", "") in ("tool-return", "retry-prompt"):
                found.add(call_id)
    return found
