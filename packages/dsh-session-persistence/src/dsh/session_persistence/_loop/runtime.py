"""The loop runtime: the terminal implementations of the three boundary hooks, and the stream assembler."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from msgspec import UNSET

from .._host.boundaries import (
    ModelRequest,
    PreStepDecision,
    PreStepInput,
    ToolExecution,
    ToolExecutionResult,
    aborted_before_dispatch_result,
    aborted_result,
    error_result,
)
from .._host.host import hookimpl
from .._model.events import (
    BlockEndChunk,
    BlockStartChunk,
    FinishChunk,
    FinishReason,
    LlmFailure,
    ReasoningDeltaChunk,
    StreamChunk,
    TextDeltaChunk,
    ToolCallDeltaChunk,
    UsageChunk,
)
from .protocols import RUNTIME_PLUGIN_NAME, ModelAdapter, _aborted, _aclose, _as_result, _builtins, _error_text
from .tool_calls import ToolSteps

if TYPE_CHECKING:
    from .._host.host import Host

__all__ = ["Assembler", "LoopEntry", "Runtime", "runtime"]


class LoopEntry(Protocol):
    """What the runtime needs of a loop registered for a session: the adapter its model requests go to."""

    adapter: ModelAdapter


class Assembler:
    """Builds the assistant message's content blocks from stream chunks (by block index, in index order)."""

    def __init__(self) -> None:
        self.kinds: dict[int, str] = {}
        self.text: dict[int, list[str]] = {}
        self.tool: dict[int, dict[str, Any]] = {}
        self.done: dict[int, Any] = {}
        self.usage: Any = None
        self.finish: FinishReason | None = None

    def feed(self, chunk: StreamChunk) -> None:
        kind = type(chunk)
        if kind is BlockStartChunk:
            self.kinds[chunk.index] = chunk.block_type  # type: ignore[union-attr]
        elif kind is TextDeltaChunk or kind is ReasoningDeltaChunk:
            self.kinds.setdefault(chunk.index, "text" if kind is TextDeltaChunk else "reasoning")  # type: ignore[union-attr]
            self.text.setdefault(chunk.index, []).append(chunk.text)  # type: ignore[union-attr]
        elif kind is ToolCallDeltaChunk:
            assert isinstance(chunk, ToolCallDeltaChunk)
            self.kinds.setdefault(chunk.index, "tool-call")
            entry = self.tool.setdefault(chunk.index, {"id": chunk.id, "name": "", "arguments": []})
            if chunk.name is not UNSET:
                entry["name"] = chunk.name
            entry["arguments"].append(chunk.arguments_delta)
        elif kind is BlockEndChunk:
            assert isinstance(chunk, BlockEndChunk)
            self.done[chunk.index] = _builtins(chunk.block)
        elif kind is UsageChunk:
            assert isinstance(chunk, UsageChunk)
            self.usage = _builtins(chunk.usage)
        elif kind is FinishChunk:
            assert isinstance(chunk, FinishChunk)
            self.finish = chunk.reason
        else:
            raise TypeError(f"model adapter yielded {type(chunk).__name__}, expected a StreamChunk struct")

    def blocks(self, *, interrupted: bool) -> list[Any]:
        """Content blocks in index order; interrupted: partial text kept, half-streamed tool calls dropped."""
        out: list[Any] = []
        for index in sorted(set(self.kinds) | set(self.done)):
            if index in self.done:
                out.append(self.done[index])
                continue
            kind = self.kinds.get(index)
            if kind in ("text", "reasoning"):
                text = "".join(self.text.get(index, ()))
                if text:
                    out.append({"type": kind, "text": text})
            elif kind == "tool-call" and not interrupted and index in self.tool:
                entry = self.tool[index]
                out.append(
                    {
                        "type": "tool-call",
                        "id": entry["id"],
                        "name": entry["name"],
                        "arguments": "".join(entry["arguments"]),
                    }
                )
        return out


# -------------------------------------------------------------------------------------------------
# The runtime plugin: the three boundary terminals (one per host)


class Runtime:
    """Terminal implementations of the boundary hooks, shared by every :class:`AgentLoop` of one host."""

    def __init__(self) -> None:
        self.loops: dict[str, LoopEntry] = {}

    @hookimpl(trylast=True)
    async def llm_stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """Dispatch to the adapter of the loop owning ``request.session_id``; adapter failures -> finish chunk."""
        try:
            stream = self._adapter(request).stream(request)
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                await _aclose(stream)
        except Exception as exc:
            aborted = request.signal.aborted
            failure = LlmFailure(message=_error_text(exc), code="ABORTED" if aborted else "ADAPTER_ERROR")
            yield FinishChunk(reason=FinishReason(kind="aborted" if aborted else "error", error=failure))

    def _adapter(self, request: ModelRequest) -> ModelAdapter:
        loop = self.loops.get(request.session_id) if request.session_id is not None else None
        if loop is None:
            raise LookupError(f"no agent loop serves session {request.session_id!r}")
        return loop.adapter

    @hookimpl(trylast=True)
    async def tools_execute(self, execution: ToolExecution) -> ToolExecutionResult:
        """Check the signal, run the tool body; body exceptions become error results."""
        signal = execution.signal
        if signal.aborted:
            return aborted_before_dispatch_result()
        agent = execution.agent
        tool = agent.tools.get(execution.name) if isinstance(agent, ToolSteps) else None
        if tool is None:
            return error_result(f"unknown tool {execution.name!r}")
        try:
            output = await tool.run(execution.arguments, execution.call_id, signal)
        except Exception as exc:
            return error_result(_error_text(exc))
        result = _as_result(output)
        if _aborted(signal) and not result.is_error:
            return aborted_result()
        return result

    @hookimpl(trylast=True)
    async def agent_pre_step(self, pre_step: PreStepInput) -> PreStepDecision:
        """The loop's own decision: enter with the claimed messages."""
        return pre_step.default


def runtime(host: Host) -> Runtime:
    plugin = host.get_plugin(RUNTIME_PLUGIN_NAME)
    if plugin is None:
        plugin = Runtime()
        host.register(plugin, name=RUNTIME_PLUGIN_NAME)
    if not isinstance(plugin, Runtime):
        raise TypeError(f"plugin {RUNTIME_PLUGIN_NAME!r} is registered but is not the agent loop runtime")
    return plugin
