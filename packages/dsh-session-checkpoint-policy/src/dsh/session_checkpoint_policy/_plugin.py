"""Entry-point plugin (group ``dsh.session``, name ``session-checkpoint-policy``): the zero-config policy.

pluggy registers the *module* an entry point names, so the hook implementations are module-level functions that
delegate to one module-level :class:`CheckpointPolicy` (stateless, so sharing it is safe).
``Host.load_entrypoints()`` registers this module; do not also register a ``CheckpointPolicy()`` yourself, or every
boundary would flush twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Generator
from typing import TYPE_CHECKING

from dsh.session_persistence import hookimpl

from ._policy import NAME, REQUIRES, CheckpointPolicy

if TYPE_CHECKING:
    from dsh.session_persistence import (
        Agent,
        Host,
        ModelRequest,
        PreStepDecision,
        PreStepInput,
        ToolExecution,
        ToolExecutionResult,
    )
    from dsh.session_persistence.events import StreamChunk

__all__ = ["NAME", "REQUIRES", "agent_pre_step", "llm_stream", "policy", "tools_execute"]

#: The policy instance behind this module's hook implementations.
policy = CheckpointPolicy()


@hookimpl(wrapper=True)
def llm_stream(
    host: Host, request: ModelRequest
) -> Generator[None, AsyncIterator[StreamChunk], AsyncIterator[StreamChunk]]:
    """See :meth:`CheckpointPolicy.llm_stream`."""
    return (yield from policy.llm_stream(host, request))


@hookimpl(wrapper=True)
def tools_execute(
    host: Host, execution: ToolExecution
) -> Generator[None, Awaitable[ToolExecutionResult], Awaitable[ToolExecutionResult]]:
    """See :meth:`CheckpointPolicy.tools_execute`."""
    return (yield from policy.tools_execute(host, execution))


@hookimpl(wrapper=True)
def agent_pre_step(
    host: Host, agent: Agent, pre_step: PreStepInput
) -> Generator[None, Awaitable[PreStepDecision], Awaitable[PreStepDecision]]:
    """See :meth:`CheckpointPolicy.agent_pre_step`."""
    return (yield from policy.agent_pre_step(host, agent, pre_step))
