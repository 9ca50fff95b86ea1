"""The loop runtime: the terminal implementations of the three boundary hooks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

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
    FinishChunk,
    FinishReason,
    LlmFailure,
    StreamChunk,
)
from .protocols import RUNTIME_PLUGIN_NAME, ModelAdapter, ToolOwner, _aborted, _aclose, _as_result, _error_text

if TYPE_CHECKING:
    from .._host.host import Host

__all__ = ["LoopEntry", "Runtime", "runtime"]


class LoopEntry(Protocol):
    """What the runtime needs of a loop registered for a session: the adapter its model requests go to."""

    adapter: ModelAdapter


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
        # As ``object``: a ToolOwner lacks Agent's ``session``, so mypy would call the isinstance branch unreachable.
        agent: object = execution.agent
        tool = agent.tools.get(execution.name) if isinstance(agent, ToolOwner) else None
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
