"""pydantic-ai integration for dsh sessions: one capability makes an agent's runs durable and crash-honest.

::

    async with open_sessions(root) as sessions, DshDurability(sessions, "support-42") as durability:
        agent = Agent(model, tools=[send_email], capabilities=[durability])
        result = await agent.run("Email Bob.", message_history=await durability.history())

:class:`DshDurability` records every run's messages (pydantic-ai's own JSON, so every part round-trips exactly) as
dsh events in one session, durable before each model request and before each tool body. A later run gets the stored
history from :meth:`DshDurability.history`, repaired the dsh way: a call a crash cut mid-body reaches the model as a
tool return carrying ``TOOL_OUTCOME_UNKNOWN`` (or a reconciliation check's finding), never as a second run of the
tool; a cut run continues with ``agent.run(message_history=history)``.
"""

from __future__ import annotations

from ._capability import DshDurability
from ._errors import DurabilityClosedError, HistoryMismatchError, NotDurableWarning, RunOverlapError
from ._messages import MESSAGE_EVENT
from ._record import PROVIDER

__all__ = [
    "MESSAGE_EVENT",
    "PROVIDER",
    "DshDurability",
    "DurabilityClosedError",
    "HistoryMismatchError",
    "NotDurableWarning",
    "RunOverlapError",
]
