"""Wire rules between the dsh adapter face and the OpenAI chat-completions format, one function each.

* :func:`chat_messages`: the request's system prompt and transcript as chat messages;
* :func:`chat_tools`: the request's tool specs as function tools;
* :class:`ChunkTranslator`: streamed ``ChatCompletionChunk`` objects as dsh stream chunks;
* :func:`finish_reason`: an OpenAI ``finish_reason`` as a dsh finish reason;
* :func:`provider_failure`: an ``openai`` exception as an ``LlmFailure``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai
from dsh.session_persistence.events import (
    BlockEndChunk,
    BlockStartChunk,
    FinishChunk,
    FinishReason,
    LlmFailure,
    Message,
    ReasoningBlock,
    ReasoningDeltaChunk,
    StreamChunk,
    TextBlock,
    TextDeltaChunk,
    TokenUsage,
    ToolCallBlock,
    ToolCallDeltaChunk,
    ToolResultBlock,
    UsageChunk,
)

__all__ = [
    "ChunkTranslator",
    "chat_messages",
    "chat_tools",
    "finish_reason",
    "provider_failure",
    "sse_payloads",
    "stream_failure",
    "transport_failure",
]


def _get(obj: object, key: str) -> Any:
    """``obj[key]`` of a parsed JSON object, or the attribute of an SDK model object (``None`` when absent)."""
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


#: What separates two text blocks of one message in the chat request's string content: a blank line, so blocks
#: the model reads as separate (a reconciliation finding and the tool's own result) never run into one sentence.
#: A plain string is what every OpenAI-compatible server accepts in a ``tool`` message (not all take parts).
_BLOCK_SEPARATOR = "\n\n"


def _text(blocks: Iterable[object]) -> str:
    return _BLOCK_SEPARATOR.join(block.text for block in blocks if isinstance(block, TextBlock))


def chat_messages(system: str | None, messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Chat messages for ``system`` and the transcript.

    Assistant text and tool calls become one ``assistant`` message (reasoning blocks are not sent back); each tool
    result becomes a ``tool`` message carrying its text (crash repairs included, as the error text the model must
    see); user text becomes a ``user`` message. The text blocks of one message are joined with a blank line, never
    run together. Images are not sent (see the README's known limitations).
    """
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for message in messages:
        if message.role == "system":
            out.append({"role": "system", "content": _text(message.content)})
            continue
        if message.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": _text(message.content) or None}
            calls = [
                {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.arguments or "{}"}}
                for b in message.content
                if isinstance(b, ToolCallBlock)
            ]
            if calls:
                entry["tool_calls"] = calls
            if entry["content"] is None and not calls:
                entry["content"] = ""
            out.append(entry)
            continue
        text_parts: list[str] = []
        for block in message.content:
            if isinstance(block, ToolResultBlock):
                out.append({"role": "tool", "tool_call_id": block.tool_call_id, "content": _text(block.content)})
            elif isinstance(block, TextBlock):
                text_parts.append(block.text)
        if text_parts:
            out.append({"role": "user", "content": _BLOCK_SEPARATOR.join(text_parts)})
    return out


def chat_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Function tools for the request's tool specs (``{"name", "description", "parameters"}``)."""
    out: list[dict[str, Any]] = []
    for spec in tools:
        function: dict[str, Any] = {"name": spec["name"], "parameters": dict(spec.get("parameters") or {})}
        if spec.get("description"):
            function["description"] = spec["description"]
        out.append({"type": "function", "function": function})
    return out


#: OpenAI ``finish_reason`` -> dsh finish kind (anything else is reported as a provider error).
_FINISH = {"stop": "stop", "tool_calls": "tool-calls", "function_call": "tool-calls", "length": "max-tokens"}


def finish_reason(reason: str | None) -> FinishReason:
    """The dsh finish reason of an OpenAI ``finish_reason`` (``None``: the stream ended without one)."""
    if reason in _FINISH:
        return FinishReason(kind=_FINISH[reason])
    if reason == "content_filter":
        failure = LlmFailure(message="the provider's content filter stopped the response", code="CONTENT_FILTER")
    elif reason is None:
        failure = LlmFailure(message="the stream ended without a finish reason", code="INCOMPLETE_STREAM")
    else:
        failure = LlmFailure(message=f"unknown finish reason {reason!r}", code="PROVIDER_ERROR")
    return FinishReason(kind="error", error=failure)


#: HTTP status -> failure code (other 4xx: ``BAD_REQUEST``; 5xx: ``PROVIDER_ERROR``).
_STATUS_CODES = {
    400: "BAD_REQUEST",
    401: "AUTHENTICATION",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "CONFLICT",
    413: "BAD_REQUEST",
    422: "BAD_REQUEST",
    429: "RATE_LIMIT",
}


def _retry_after_ms(headers: Mapping[str, str]) -> int | None:
    for name, scale in (("retry-after-ms", 1.0), ("retry-after", 1000.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) * scale
        except ValueError:
            continue
        if 0 <= value < 2**53:
            return int(value)
    return None


def provider_failure(exc: BaseException) -> LlmFailure | None:
    """The ``LlmFailure`` of an ``openai`` exception, or ``None`` when ``exc`` is not one.

    Codes: ``RATE_LIMIT``, ``AUTHENTICATION``, ``PERMISSION_DENIED``, ``NOT_FOUND``, ``CONFLICT``, ``BAD_REQUEST``,
    ``PROVIDER_ERROR`` (5xx and errors reported inside the stream), ``TIMEOUT``, ``CONNECTION``; with the HTTP
    ``status``, the ``x-request-id`` and the ``retry-after`` hint when the provider sent them.
    """
    if isinstance(exc, openai.APITimeoutError):
        return LlmFailure(message=str(exc) or "request timed out", code="TIMEOUT")
    if isinstance(exc, openai.APIConnectionError):
        return LlmFailure(message=str(exc) or "connection error", code="CONNECTION")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        code = _STATUS_CODES.get(status, "PROVIDER_ERROR" if status >= 500 else "BAD_REQUEST")
        fields: dict[str, Any] = {"status": status}
        if exc.request_id:
            fields["request_id"] = exc.request_id
        retry = _retry_after_ms(exc.response.headers)
        if retry is not None:
            fields["provider_retry_after_ms"] = retry
        return LlmFailure(message=exc.message or str(exc), code=code, **fields)
    if isinstance(exc, openai.OpenAIError):
        return LlmFailure(message=str(exc) or type(exc).__name__, code="PROVIDER_ERROR")
    return None


def stream_failure(error: object) -> LlmFailure:
    """The failure of an ``{"error": {...}}`` event inside the stream (code ``PROVIDER_ERROR``)."""
    message = _get(error, "message") if isinstance(error, Mapping) else None
    return LlmFailure(message=message if isinstance(message, str) and message else str(error), code="PROVIDER_ERROR")


def transport_failure(exc: BaseException) -> LlmFailure | None:
    """The failure of an HTTP transport exception raised while the body is read (``TIMEOUT``/``CONNECTION``)."""
    names = [cls.__name__ for cls in type(exc).__mro__]
    if not type(exc).__module__.startswith("httpx"):
        return None
    if any("Timeout" in name for name in names):
        return LlmFailure(message=str(exc) or "read timed out", code="TIMEOUT")
    return LlmFailure(message=str(exc) or type(exc).__name__, code="CONNECTION")


async def sse_payloads(lines: AsyncIterator[str]) -> AsyncIterator[Any]:
    """The JSON payload of each server-sent event of a chat-completions stream, until ``[DONE]``.

    Events are separated by blank lines; an event's ``data:`` lines are joined with newlines; comments and other
    fields are skipped. Lines after ``[DONE]`` are read (and ignored) to the end of the body. A payload that is
    not JSON raises ``ValueError``.
    """
    data: list[str] = []
    done = False
    async for line in lines:
        if done:
            continue
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            continue
        if line.strip() or not data:
            continue  # a comment, another field, or a blank line without data
        text, data = "\n".join(data), []
        if text.strip() == "[DONE]":
            done = True
            continue
        yield json.loads(text)
    if data and not done:
        text = "\n".join(data)
        if text.strip() != "[DONE]":
            yield json.loads(text)


@dataclass
class _Call:
    index: int
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


@dataclass
class ChunkTranslator:
    """Turns streamed chat-completion chunks (parsed JSON or SDK objects; first choice) into dsh stream chunks.

    Blocks get indexes in order of first appearance: the text, the reasoning (``reasoning_content``, as
    DeepSeek-style servers stream it) and each tool call (by its OpenAI ``index``). :meth:`finish` closes every
    block with a ``BlockEndChunk``, then the usage and the finish reason.
    """

    _next: int = 0
    _text: int | None = None
    _reasoning: int | None = None
    _parts: dict[int, list[str]] = field(default_factory=dict)
    _calls: dict[int, _Call] = field(default_factory=dict)
    _usage: TokenUsage | None = None
    finish_reason: str | None = None

    def _open(self, block_type: str) -> tuple[int, list[StreamChunk]]:
        index = self._next
        self._next += 1
        return index, [BlockStartChunk(index=index, block_type=block_type)]

    def feed(self, chunk: Any) -> list[StreamChunk]:
        """The dsh chunks of one ``ChatCompletionChunk``."""
        out: list[StreamChunk] = []
        usage = _get(chunk, "usage")
        if usage is not None:
            self._usage = _usage(usage)
        choices = _get(chunk, "choices") or []
        if not choices:
            return out
        choice = choices[0]
        delta = _get(choice, "delta")
        if delta is not None:
            reasoning = _get(delta, "reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                if self._reasoning is None:
                    self._reasoning, opened = self._open("reasoning")
                    out += opened
                self._parts.setdefault(self._reasoning, []).append(reasoning)
                out.append(ReasoningDeltaChunk(index=self._reasoning, text=reasoning))
            content = _get(delta, "content")
            if isinstance(content, str) and content:
                if self._text is None:
                    self._text, opened = self._open("text")
                    out += opened
                self._parts.setdefault(self._text, []).append(content)
                out.append(TextDeltaChunk(index=self._text, text=content))
            for call in _get(delta, "tool_calls") or []:
                out += self._tool_delta(call)
        if _get(choice, "finish_reason") is not None:
            self.finish_reason = _get(choice, "finish_reason")
        return out

    def _tool_delta(self, call: Any) -> list[StreamChunk]:
        out: list[StreamChunk] = []
        key = _get(call, "index") if isinstance(_get(call, "index"), int) else len(self._calls)
        function = _get(call, "function")
        name = _get(function, "name") if function is not None else None
        arguments = (_get(function, "arguments") if function is not None else None) or ""
        entry = self._calls.get(key)
        first = entry is None
        if entry is None:
            index, out = self._open("tool-call")
            entry = _Call(index=index, id=_get(call, "id") or f"call-{index}", name=name or "")
            self._calls[key] = entry
        elif name and not entry.name:
            entry.name = name
        entry.arguments.append(arguments)
        if name:
            out.append(ToolCallDeltaChunk(index=entry.index, id=entry.id, name=name, arguments_delta=arguments))
        elif arguments or first:
            out.append(ToolCallDeltaChunk(index=entry.index, id=entry.id, arguments_delta=arguments))
        return out

    def finish(self, failure: LlmFailure | None = None) -> list[StreamChunk]:
        """Close every block, then the usage and the finish chunk (``failure`` overrides the finish reason)."""
        out: list[StreamChunk] = []
        blocks: list[tuple[int, Any]] = []
        if self._reasoning is not None:
            blocks.append((self._reasoning, ReasoningBlock(text="".join(self._parts[self._reasoning]))))
        if self._text is not None:
            blocks.append((self._text, TextBlock(text="".join(self._parts[self._text]))))
        for call in self._calls.values():
            blocks.append((call.index, ToolCallBlock(id=call.id, name=call.name, arguments="".join(call.arguments))))
        if failure is None:
            for index, block in sorted(blocks, key=lambda item: item[0]):
                out.append(BlockEndChunk(index=index, block=block))
        if self._usage is not None:
            out.append(UsageChunk(usage=self._usage))
        reason = FinishReason(kind="error", error=failure) if failure is not None else finish_reason(self.finish_reason)
        out.append(FinishChunk(reason=reason))
        return out


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _usage(usage: Any) -> TokenUsage:
    fields: dict[str, int] = {}
    prompt_details = _get(usage, "prompt_tokens_details")
    cached = _get(prompt_details, "cached_tokens") if prompt_details is not None else None
    if isinstance(cached, int) and cached >= 0:
        fields["cache_read_tokens"] = cached
    completion_details = _get(usage, "completion_tokens_details")
    reasoning = _get(completion_details, "reasoning_tokens") if completion_details is not None else None
    if isinstance(reasoning, int) and reasoning >= 0:
        fields["reasoning_tokens"] = reasoning
    return TokenUsage(
        input_tokens=_count(_get(usage, "prompt_tokens")),
        output_tokens=_count(_get(usage, "completion_tokens")),
        **fields,
    )
