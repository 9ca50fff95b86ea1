"""A small, real reference agent loop that drives a model adapter and tools through the boundary hooks.

:class:`AgentLoop` is what the integration suite, the crash tests and the demo run: it records the canonical events
of a turn in order::

    turn/start
      step/start, user/message..., request/header, request/context?,
      assistant/chunk..., assistant/message (citing the chunk seqs),
      (tool/call, tool/result citing the call seq)...,
      step/end
      ... more steps while the model needs to see tool results ...
    turn/end {completed | max-tokens | blocked | aborted{cause} | error{message, code}}

After a crash (``AgentLoop.resume``): each finding of a tool's reconciliation check is a ``tool/reconcile`` event
between turns, and :meth:`AgentLoop.continue_interrupted` runs a turn whose ``turn/start`` is followed by
``turn/continue {interruptedTurn}`` and whose first step needs no user message. Both are written ``ignorable``.

Everything it calls goes through the :class:`~dsh.session_persistence.Host` facade (``agent_pre_step``,
``llm_stream``, ``tools_execute``), so wrappers such as the checkpoint policy see every boundary. It owns the
*terminal* implementation of each boundary hook, registered ``trylast=True`` once per host:

* ``llm_stream``: an async generator that calls the adapter and converts an adapter exception into a final
  ``finish`` chunk of kind ``error`` (``aborted`` when the turn's signal is aborted);
* ``tools_execute``: checks the signal, runs the tool body, converts a body exception into an error result and a
  success that finished after a cooperative abort into the canonical ``ABORTED`` result;
* ``agent_pre_step``: returns ``pre_step.default``.

Model adapters implement :class:`ModelAdapter`: ``stream(request)`` returns an async iterator of stream chunks, the
msgspec ``StreamChunk`` structs of :mod:`dsh.session_persistence.events` (``TextDeltaChunk``, ``BlockEndChunk``,
``FinishChunk``...), **not** their JSON dicts. Tools implement :class:`Tool`.

Not implemented (documented deviations from the full harness loop): the inbox (``agent/inbox/spliced`` events,
followup/steer queues), ``agent/request`` / ``agent/request-error`` / ``agent/turn-stopping`` hooks, tool
pre-/post-execute policy and approval. A turn is started explicitly with :meth:`AgentLoop.run_turn`.
"""

from __future__ import annotations

from ._host.boundaries import CancelSignal, ModelRequest
from ._host.reconcile import (
    DEFAULT_RECONCILE_TIMEOUT_S,
    TOOL_RECONCILED_HAPPENED_TEXT,
    TOOL_RECONCILED_NOT_HAPPENED_TEXT,
    Reconciliation,
)
from ._loop.agent import AgentLoop
from ._loop.protocols import (
    DEFAULT_MAX_PARALLEL_TOOL_CALLS,
    RUNTIME_PLUGIN_NAME,
    LlmError,
    ModelAdapter,
    Tool,
    ToolOutput,
)
from ._loop.resume import answer_pending
from ._loop.tools import ANY_OBJECT_SCHEMA, FunctionTool, tool_spec
from ._loop.turn_result import TurnReason, TurnResult
from ._model.errors import NoInterruptedTurnError, ToolDefinitionError

__all__ = [
    "ANY_OBJECT_SCHEMA",
    "DEFAULT_MAX_PARALLEL_TOOL_CALLS",
    "DEFAULT_RECONCILE_TIMEOUT_S",
    "RUNTIME_PLUGIN_NAME",
    "AgentLoop",
    "CancelSignal",
    "FunctionTool",
    "LlmError",
    "ModelAdapter",
    "ModelRequest",
    "NoInterruptedTurnError",
    "Reconciliation",
    "TOOL_RECONCILED_HAPPENED_TEXT",
    "TOOL_RECONCILED_NOT_HAPPENED_TEXT",
    "Tool",
    "ToolDefinitionError",
    "ToolOutput",
    "TurnReason",
    "TurnResult",
    "answer_pending",
    "tool_spec",
]
