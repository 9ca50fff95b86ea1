"""A scripted model adapter and scripted tools for :class:`~dsh.session_persistence.loop.AgentLoop` tests and demos.

:class:`ScriptedAdapter` answers each model request with the next scripted response:

* :class:`TextResponse`: text streamed as token-sized ``text-delta`` chunks, then ``finish{stop}`` (or another
  finish kind, e.g. ``max-tokens``);
* :class:`ToolCallResponse`: one or more tool-call blocks ``(id, name, arguments)``, then ``finish{tool-calls}``;
* :class:`HangResponse`: optional text chunks, then waits until the turn is cancelled (then raises);
* :class:`ErrorResponse`: a ``finish{error}`` chunk with the given failure.

Every response takes an optional ``hook`` (an async callable taking the request) and ``hook_after`` (how many chunks
are yielded before it runs; default 0 = at dispatch, before any chunk). That is the crash hook: a child process
writes its readiness marker there and blocks until it is killed. Chunks are the msgspec ``StreamChunk`` structs.

:class:`ScriptedTool` records its calls and returns a fixed (or computed) output, optionally after a side-effect
callback and optionally blocking on a gate or until the turn is cancelled.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from .._host.boundaries import CancelSignal, ModelRequest, ToolExecutionResult
from .._model.events import (
    BlockEndChunk,
    BlockStartChunk,
    FinishChunk,
    FinishReason,
    LlmFailure,
    StreamChunk,
    TextBlock,
    TextDeltaChunk,
    TokenUsage,
    ToolCallBlock,
    ToolCallDeltaChunk,
    UsageChunk,
)

__all__ = [
    "ErrorResponse",
    "HangResponse",
    "ScriptedAdapter",
    "ScriptedResponse",
    "ScriptedTool",
    "TextResponse",
    "ToolCallResponse",
    "text_tokens",
]

#: An async callable run inside the adapter's stream (the crash hook); it receives the request.
StreamHook = Callable[[ModelRequest], Awaitable[None]]

_TOKEN = re.compile(r"\S+\s*|\s+")


def text_tokens(text: str) -> list[str]:
    """Split ``text`` into token-sized pieces (a word and its trailing whitespace) that join back to it."""
    return _TOKEN.findall(text) or [text]


def _text_chunks(text: str, index: int = 0) -> list[StreamChunk]:
    chunks: list[StreamChunk] = [BlockStartChunk(index=index, block_type="text")]
    chunks += [TextDeltaChunk(index=index, text=token) for token in text_tokens(text)]
    chunks.append(BlockEndChunk(index=index, block=TextBlock(text=text)))
    return chunks


@dataclass(frozen=True)
class TextResponse:
    """Stream ``text`` token by token, then finish with ``finish`` (``"stop"`` or ``"max-tokens"``)."""

    text: str
    finish: str = "stop"
    usage: tuple[int, int] | None = None
    hook: StreamHook | None = None
    hook_after: int = 0
    #: Awaited before the first chunk (a test gate holding the stream open).
    gate: anyio.Event | None = None

    def chunks(self) -> list[StreamChunk]:
        chunks = _text_chunks(self.text)
        if self.usage is not None:
            chunks.append(UsageChunk(usage=TokenUsage(input_tokens=self.usage[0], output_tokens=self.usage[1])))
        chunks.append(FinishChunk(reason=FinishReason(kind=self.finish)))
        return chunks


@dataclass(frozen=True)
class ToolCallResponse:
    """Request tool calls: ``calls`` is a sequence of ``(call_id, name, arguments)`` (arguments: JSON value)."""

    calls: tuple[tuple[str, str, Any], ...]
    text: str | None = None
    hook: StreamHook | None = None
    hook_after: int = 0
    gate: anyio.Event | None = None

    def chunks(self) -> list[StreamChunk]:
        chunks: list[StreamChunk] = _text_chunks(self.text) if self.text else []
        first = 1 if self.text else 0
        for offset, (call_id, name, arguments) in enumerate(self.calls):
            index = first + offset
            raw = json.dumps(arguments, separators=(",", ":"))
            chunks.append(BlockStartChunk(index=index, block_type="tool-call"))
            chunks.append(ToolCallDeltaChunk(index=index, id=call_id, name=name, arguments_delta=raw))
            chunks.append(BlockEndChunk(index=index, block=ToolCallBlock(id=call_id, name=name, arguments=raw)))
        chunks.append(FinishChunk(reason=FinishReason(kind="tool-calls")))
        return chunks


@dataclass(frozen=True)
class HangResponse:
    """Stream the first ``after`` tokens of ``text`` (none by default), then wait until the turn is cancelled.

    When the signal fires the adapter raises (the LLM terminal turns that into ``finish{aborted}``; the loop also
    cancels the stream natively, so the wait usually just ends).
    """

    text: str = ""
    after: int = 0
    hook: StreamHook | None = None
    hook_after: int = 0
    gate: anyio.Event | None = None

    def chunks(self) -> list[StreamChunk]:
        if not self.after:
            return []
        chunks: list[StreamChunk] = [BlockStartChunk(index=0, block_type="text")]
        chunks += [TextDeltaChunk(index=0, text=t) for t in text_tokens(self.text)[: self.after]]
        return chunks


@dataclass(frozen=True)
class ErrorResponse:
    """Finish with ``error`` carrying ``{message, code}``; with ``raise_=True`` the adapter raises instead."""

    message: str = "model unavailable"
    code: str = "PROVIDER_ERROR"
    raise_: bool = False
    hook: StreamHook | None = None
    hook_after: int = 0
    gate: anyio.Event | None = None

    def chunks(self) -> list[StreamChunk]:
        if self.raise_:
            return []
        failure = LlmFailure(message=self.message, code=self.code)
        return [FinishChunk(reason=FinishReason(kind="error", error=failure))]


ScriptedResponse = TextResponse | ToolCallResponse | HangResponse | ErrorResponse


class ScriptAdapterError(RuntimeError):
    """Raised inside the stream by :class:`ErrorResponse` with ``raise_=True`` or when the script is exhausted."""


class ScriptedAdapter:
    """A model adapter that plays ``responses`` in order, one per model request.

    ``responses`` may be any iterable (also an endless generator). ``requests`` records every request received (in
    dispatch order, i.e. once the stream body starts). ``chunk_delay`` sleeps that many seconds before each chunk
    (useful for random-kill tests). An exhausted script raises :class:`ScriptAdapterError` inside the stream.
    ``provider`` and ``model`` are the names an :class:`AgentLoop` records when it is given none.
    """

    def __init__(
        self,
        responses: Iterable[ScriptedResponse],
        *,
        chunk_delay: float = 0.0,
        provider: str = "scripted",
        model: str = "scripted",
    ) -> None:
        self.provider = provider
        self.model = model
        self._responses: Iterator[ScriptedResponse] = iter(responses)
        self.chunk_delay = chunk_delay
        self.requests: list[ModelRequest] = []

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """The stream for ``request`` (an unstarted async generator)."""
        return self._play(request)

    async def _play(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self.requests.append(request)
        response = next(self._responses, None)
        if response is None:
            raise ScriptAdapterError("scripted adapter has no response left")
        if response.gate is not None:
            await response.gate.wait()
        chunks = response.chunks()
        for position, chunk in enumerate(chunks):
            if response.hook is not None and position == response.hook_after:
                await response.hook(request)
            if self.chunk_delay:
                await anyio.sleep(self.chunk_delay)
            yield chunk
        if response.hook is not None and response.hook_after >= len(chunks):
            await response.hook(request)
        if isinstance(response, HangResponse):
            await request.signal.wait()
            raise ScriptAdapterError(f"model request cancelled: {request.signal.reason!r}")
        if isinstance(response, ErrorResponse) and response.raise_:
            raise ScriptAdapterError(response.message)


@dataclass(frozen=True)
class ToolCallRecord:
    """One call a :class:`ScriptedTool` received."""

    call_id: str
    arguments: Any
    signal: CancelSignal


@dataclass(eq=False)
class ScriptedTool:
    """A tool that records its calls and returns ``output`` (text, a result, or a callable computing either).

    :param name: The tool name.
    :param description: What the tool does, for the model.
    :param parameters: The JSON schema of its arguments (``None``: any object).
    :param output: Text / :class:`ToolExecutionResult`, or ``callable(arguments, call_id)`` returning one.
    :param parallel: Whether calls may overlap.
    :param side_effect: ``callable(arguments, call_id)`` (sync or async) run first: the visible side effect.
    :param gate: If set, the body waits for it after the side effect (use to hold a call open).
    :param block: If true, the body waits until the turn is cancelled after the side effect (then returns).
    :param error: If set, the body raises ``RuntimeError(error)`` (after the side effect).
    """

    name: str
    output: Any = "ok"
    description: str = ""
    parameters: Mapping[str, Any] | None = None
    parallel: bool = False
    side_effect: Callable[[Any, str], object] | None = None
    gate: anyio.Event | None = None
    block: bool = False
    error: str | None = None
    calls: list[ToolCallRecord] = field(default_factory=list)
    #: Call ids whose body finished (returned or raised after its side effect).
    finished: list[str] = field(default_factory=list)

    async def run(self, arguments: Any, call_id: str, signal: CancelSignal) -> str | ToolExecutionResult:
        """The body (see the class docstring)."""
        self.calls.append(ToolCallRecord(call_id, arguments, signal))
        try:
            if self.side_effect is not None:
                outcome = self.side_effect(arguments, call_id)
                if inspect.isawaitable(outcome):
                    await outcome
            if self.gate is not None:
                await self.gate.wait()
            if self.block:
                await signal.wait()
            if self.error is not None:
                raise RuntimeError(self.error)
            output = self.output(arguments, call_id) if callable(self.output) else self.output
            if inspect.isawaitable(output):
                output = await output
            if isinstance(output, (str, ToolExecutionResult)):
                return output
            return json.dumps(output)
        finally:
            self.finished.append(call_id)
