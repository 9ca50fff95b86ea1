"""The agent loop's public protocols (model adapter, tool), its model error, and the helpers its parts share."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol, runtime_checkable

import msgspec

from .._host.boundaries import CancelSignal, ModelRequest, ToolExecutionResult
from .._model.events import StreamChunk

__all__ = [
    "DEFAULT_MAX_PARALLEL_TOOL_CALLS",
    "RUNTIME_PLUGIN_NAME",
    "LlmError",
    "ModelAdapter",
    "Tool",
    "ToolOutput",
    "ToolOwner",
]

#: Default bound on concurrently dispatched parallel-safe tool calls.
DEFAULT_MAX_PARALLEL_TOOL_CALLS = 10

#: The name under which the loop runtime (the three boundary terminals) is registered in a host.
RUNTIME_PLUGIN_NAME = "dsh-agent-loop"

#: What a tool body may return: plain text (a successful text result) or a full result.
ToolOutput = str | ToolExecutionResult

_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()


# -------------------------------------------------------------------------------------------------
# Public protocols


@runtime_checkable
class ModelAdapter(Protocol):
    """A model provider adapter.

    ``stream(request)`` returns an async iterator of ``StreamChunk`` **structs** (from
    :mod:`dsh.session_persistence.events`); the last one should be a ``FinishChunk`` whose reason kind is
    ``stop``, ``tool-calls``, ``max-tokens``, ``error`` or ``aborted``. The adapter should stop when
    ``request.signal`` is aborted (the loop also races the stream against the signal, so a hanging adapter is
    cancelled natively). An exception escaping the adapter becomes a final ``finish{error}`` chunk.
    """

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]: ...


class Tool(Protocol):
    """A tool the model can call.

    :attr name: The tool name the model uses.
    :attr description: Optional: what the tool does, for the model (missing or empty: no description).
    :attr parameters: Optional: the JSON schema of its arguments object (missing or ``None``: any object).
    :attr parallel: ``True`` if calls may overlap other parallel-safe calls (anything else is exclusive).
    Description and parameters are read with ``getattr`` (tools written before they existed keep working and keep
    type-checking) and reach the model request through :func:`~dsh.session_persistence.loop.tool_spec`.

    :meth run: The body: ``await tool.run(arguments, call_id, signal)`` with the parsed JSON arguments, the model's
        call id (use it as an idempotency key for side effects) and the turn's cooperative signal. Returns text or a
        :class:`ToolExecutionResult`; an exception becomes an error result ``"Error: <message>"``.
    """

    @property
    def name(self) -> str: ...

    @property
    def parallel(self) -> bool: ...

    async def run(self, arguments: Any, call_id: str, signal: CancelSignal) -> ToolOutput: ...


class ToolOwner:
    """An agent whose tools the runtime's ``tools_execute`` terminal runs (by name, from ``tools``).

    A nominal base, so the runtime can recognize such an agent without importing the loop's tool-running half.
    """

    tools: dict[str, Tool]


class LlmError(Exception):
    """The model stream finished with ``error`` (or ``aborted`` without a cooperative abort).

    ``failure`` holds the structured facts recorded in ``turn/end {error}`` (``message``, ``code``...).
    """

    def __init__(self, failure: Mapping[str, Any]) -> None:
        super().__init__(str(failure.get("message", "model request failed")))
        self.failure: dict[str, Any] = dict(failure)


# -------------------------------------------------------------------------------------------------
# Helpers


def _builtins(value: object) -> Any:
    """Plain JSON (camelCase, lists, no UNSET fields) of a msgspec struct or JSON value."""
    return _json_decoder.decode(_json_encoder.encode(value))


def _abort_cause(cause: object) -> dict[str, Any]:
    """The ``turn/end`` form of a cancel cause: ``"user"`` -> ``{"kind": "user"}``; dicts/structs kept."""
    if isinstance(cause, str):
        return {"kind": cause}
    if isinstance(cause, msgspec.Struct):
        out: dict[str, Any] = _builtins(cause)
        return out
    if isinstance(cause, Mapping) and isinstance(cause.get("kind"), str):
        return dict(cause)
    return {"kind": "user"}


def _unwrap(exc: Exception) -> Exception:
    """The only leaf of a task group's single-exception group (anyio/trio always wrap), else ``exc``."""
    while True:
        inner = getattr(exc, "exceptions", None)
        if not isinstance(inner, tuple) or len(inner) != 1 or not isinstance(inner[0], Exception):
            return exc
        exc = inner[0]


def _error_text(exc: BaseException) -> str:
    """The error chain text: each message (or type name when empty), outermost first."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(str(current) or type(current).__name__)
        current = current.__cause__
    return ": ".join(parts)


def _aborted(signal: CancelSignal) -> bool:
    """``signal.aborted`` read through a call: it can change across an await, which mypy's narrowing ignores."""
    return signal.aborted


def _as_result(output: object) -> ToolExecutionResult:
    if isinstance(output, ToolExecutionResult):
        return output
    if isinstance(output, str):
        return ToolExecutionResult(content=({"type": "text", "text": output},))
    return ToolExecutionResult(content=({"type": "text", "text": json.dumps(output)},))


async def _aclose(stream: object) -> None:
    aclose = getattr(stream, "aclose", None)
    if callable(aclose):
        await aclose()
