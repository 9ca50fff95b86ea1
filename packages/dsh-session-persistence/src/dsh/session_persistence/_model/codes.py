"""The codes and texts a tool result carries when its call did not run to an answer: what crash repair writes
for an interrupted call and what live cancellation writes. Plain constants, so the validator and every reader can
name them without the repair logic (:mod:`.repair`)."""

from __future__ import annotations

__all__ = [
    "TOOL_ABORTED",
    "TOOL_ABORTED_BEFORE_DISPATCH",
    "TOOL_ABORTED_BEFORE_DISPATCH_TEXT",
    "TOOL_ABORTED_TEXT",
    "TOOL_NOT_STARTED",
    "TOOL_NOT_STARTED_TEXT",
    "TOOL_OUTCOME_UNKNOWN",
    "TOOL_OUTCOME_UNKNOWN_TEXT",
]

#: The assistant requested the call but no durable ``tool/call`` exists: it certainly did not start.
TOOL_NOT_STARTED = "TOOL_NOT_STARTED"
TOOL_NOT_STARTED_TEXT = (
    "The tool call was interrupted before the Harness recorded it as started. Retry it if it is still needed."
)
#: A durable ``tool/call`` exists without a result: the side effect may or may not have happened.
TOOL_OUTCOME_UNKNOWN = "TOOL_OUTCOME_UNKNOWN"
TOOL_OUTCOME_UNKNOWN_TEXT = (
    "The tool call was interrupted after it was recorded, but no result was durably recorded. Its outcome is "
    "unknown. Decide whether to retry from the tool semantics: retry only if the operation is read-only or "
    "idempotent; if it may have side effects, first verify external state or ask the user. Do not retry blindly."
)
#: Live cancellation before the tool body ran (tool runtime, agent loop, checkpoint policy).
TOOL_ABORTED_BEFORE_DISPATCH = "ABORTED_BEFORE_DISPATCH"
TOOL_ABORTED_BEFORE_DISPATCH_TEXT = "Error: tool call aborted before dispatch"
#: Live cancellation after the tool body started.
TOOL_ABORTED = "ABORTED"
TOOL_ABORTED_TEXT = "Error: tool call aborted"
