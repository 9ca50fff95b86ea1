"""OpenAI Agents SDK integration for dsh sessions.

::

    async with open_sessions(root) as sessions, DshSession(sessions, "support-42") as session:
        result = await Runner.run(agent, "Where is my order?", session=session, hooks=DurableRunHooks(session))

:class:`DshSession` implements the SDK's ``Session`` protocol (``get_items``, ``add_items``, ``pop_item``,
``clear_session``) on a dsh session: items are dsh events a ``dsh-sessions show`` reads, every mutation is durable
when it returns, and the dsh writer lease keeps a second writer out. :class:`DurableRunHooks` records each model
response the moment it ends, so a tool call is durable before its body runs and a crash mid-tool reaches the model
on the next run as the call's ``TOOL_OUTCOME_UNKNOWN`` output instead of a second run of the tool.
"""

from __future__ import annotations

from ._session import (
    COMPACTION_EVENT,
    ITEM_EVENT,
    POP_EVENT,
    PROVIDER,
    DshSession,
    DshSessionClosedError,
    DurableRunHooks,
    NotDurableWarning,
)

__all__ = [
    "COMPACTION_EVENT",
    "ITEM_EVENT",
    "POP_EVENT",
    "PROVIDER",
    "DshSession",
    "DshSessionClosedError",
    "DurableRunHooks",
    "NotDurableWarning",
]
