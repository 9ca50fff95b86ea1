"""Crash repair, as a public face: how an interrupted final turn is closed, and the codes its results carry.

After a crash the last turn of a log may be open. The coordinator never truncates committed events; it appends
closers instead: one synthetic ``tool/result`` per unanswered model-requested call (:data:`TOOL_NOT_STARTED` when
no durable ``tool/call`` exists, else :data:`TOOL_OUTCOME_UNKNOWN`), then ``step/end`` if a step is open, then
``turn/end`` with an ``interrupted`` reason. :func:`interrupted_turn_closers` computes exactly those events (a pure
function of the stored log), and :func:`has_open_turn` says whether there is anything to close. The reference loop
uses :data:`TOOL_ABORTED` and :data:`TOOL_ABORTED_BEFORE_DISPATCH` for calls a cancelled turn left behind.

After the repair, :func:`unknown_calls` lists the ``TOOL_OUTCOME_UNKNOWN`` calls no reconciliation finding has
settled yet (:class:`UnknownCall`: call id, tool name, recorded arguments, the repaired result's seq): what an
integration running its own loop asks its tools' checks about (the reference loop does it in
``AgentLoop.resume``).
"""

from __future__ import annotations

from ._model.repair import (
    TOOL_ABORTED,
    TOOL_ABORTED_BEFORE_DISPATCH,
    TOOL_ABORTED_BEFORE_DISPATCH_TEXT,
    TOOL_ABORTED_TEXT,
    TOOL_NOT_STARTED,
    TOOL_NOT_STARTED_TEXT,
    TOOL_OUTCOME_UNKNOWN,
    TOOL_OUTCOME_UNKNOWN_TEXT,
    UnknownCall,
    has_open_turn,
    interrupted_turn_closers,
    unknown_calls,
)

__all__ = [
    "TOOL_ABORTED",
    "TOOL_ABORTED_BEFORE_DISPATCH",
    "TOOL_ABORTED_BEFORE_DISPATCH_TEXT",
    "TOOL_ABORTED_TEXT",
    "TOOL_NOT_STARTED",
    "TOOL_NOT_STARTED_TEXT",
    "TOOL_OUTCOME_UNKNOWN",
    "TOOL_OUTCOME_UNKNOWN_TEXT",
    "UnknownCall",
    "has_open_turn",
    "interrupted_turn_closers",
    "unknown_calls",
]
