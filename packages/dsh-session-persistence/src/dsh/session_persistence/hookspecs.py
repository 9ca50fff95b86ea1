"""Hook specifications for dsh sessions plugins: every hook of the project, specified once.

Backends, the checkpoint policy and the agent runtimes import ``hookimpl`` (from :mod:`dsh.session_persistence`)
and implement these hooks; they never declare their own (pluggy refuses a second specification of one name).
The :class:`~dsh.session_persistence.Host` adds these specs and is the only caller: it offers one typed method
per hook and enforces the rules written in each hook's docstring.
"""

from ._host.specs import (
    PROJECT_NAME,
    Agent,
    agent_error,
    agent_pre_step,
    agent_status,
    dsh_session_backends,
    hookspec,
    llm_stream,
    session_created,
    session_disposed,
    session_event,
    session_flush,
    tools_execute,
)

__all__ = [
    "PROJECT_NAME",
    "Agent",
    "agent_error",
    "agent_pre_step",
    "agent_status",
    "dsh_session_backends",
    "hookspec",
    "llm_stream",
    "session_created",
    "session_disposed",
    "session_event",
    "session_flush",
    "tools_execute",
]
