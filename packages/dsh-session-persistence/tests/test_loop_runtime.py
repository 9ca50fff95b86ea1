"""The loop runtime's ``tools_execute`` terminal runs, by name, a tool of the agent loop the call names; an unknown
name, no agent, or an agent that is not a loop (whatever it holds) gets an error result, never an exception."""

from __future__ import annotations

from typing import Any

import pytest
from dsh.session_persistence import CancelSignal, Host, Session, SessionStore, ToolExecution
from dsh.session_persistence.loop import AgentLoop
from dsh.session_persistence.testing import ScriptedAdapter, ScriptedTool

pytestmark = pytest.mark.anyio


class _NotALoop:
    """An agent for the hooks (it has a session) holding a ``tools`` dict, but not one the runtime runs."""

    def __init__(self, session: Session, tools: dict[str, Any]) -> None:
        self._session = session
        self.tools = tools

    @property
    def session(self) -> Session:
        return self._session


def _call(name: str, agent: Any) -> ToolExecution:
    return ToolExecution(call_id=f"call-{name}", name=name, arguments={}, signal=CancelSignal(), agent=agent)


async def test_the_runtime_runs_a_loop_tool_by_name() -> None:
    host = Host()
    tool = ScriptedTool("lookup", output="found")
    loop = AgentLoop(host, SessionStore(host), ScriptedAdapter([], provider="p", model="m"), [tool], session_id="rt")
    result = await host.tools_execute(_call("lookup", loop))
    assert not result.is_error
    assert result.content == ({"type": "text", "text": "found"},)
    assert [call.call_id for call in tool.calls] == ["call-lookup"]
    loop.close()


async def test_an_unknown_tool_or_a_call_without_a_loop_is_an_error_result() -> None:
    host = Host()
    tool = ScriptedTool("lookup", output="found")
    loop = AgentLoop(host, SessionStore(host), ScriptedAdapter([], provider="p", model="m"), [tool], session_id="rt")
    for name, agent in (("missing", loop), ("lookup", None), ("lookup", _NotALoop(loop.session, {"lookup": tool}))):
        result = await host.tools_execute(_call(name, agent))
        assert result.is_error
        assert result.content == ({"type": "text", "text": f"Error: unknown tool {name!r}"},)
    assert tool.calls == []
    loop.close()
