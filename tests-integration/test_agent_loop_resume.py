"""Agent-loop integration, resume (spec/policy.md §5 scenarios 45-46), on the real stack of test_agent_loop.py."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from dsh.session_persistence import (
    LiveTurnOpenError,
    SessionAlreadyExistsError,
)
from dsh.session_persistence.loop import AgentLoop
from dsh.session_persistence.repair import has_open_turn
from dsh.session_persistence.testing import (
    ScriptedAdapter,
    ScriptedTool,
    TextResponse,
    ToolCallResponse,
)
from loop_rig import (
    SID,
    data,
    make_loop,
    of_type,
    open_stack,
    turn_end_reason,
    types,
    wait_until,
)

pytestmark = pytest.mark.anyio


# --------------------------------------------------------------------------------------------------------------
# 45-46: resume


async def test_resume_in_a_new_host_continues_turns(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        loop = make_loop(stack, ScriptedAdapter([TextResponse("first answer")]))
        with anyio.fail_after(10):
            await loop.run_turn("first")
        before = loop.session.derive_messages()
        count = len(loop.session.events)
        await stack.store.flush(loop.session)
    async with open_stack(tmp_path) as stack:
        adapter = ScriptedAdapter([TextResponse("second answer")])
        resumed = await AgentLoop.resume(
            stack.host, stack.store, stack.coordinator, SID, adapter, provider="scripted", model="m1"
        )
        assert resumed.session.derive_messages() == before
        with anyio.fail_after(10):
            end = await resumed.run_turn("second")
        events = resumed.session.events
        assert [e.seq for e in events] == list(range(len(events)))
        assert types(events).count("session/end-seed") == 1
        assert types(events[count : count + 2]) == ["session/end-seed", "turn/start"]
        assert data(events[count + 1]) == {"turn": 2}
        assert data(of_type(events, "request/header")[-1])["reason"] == "resume"
        assert data(end)["reason"] == {"kind": "completed"}
        assert adapter.requests[0].messages[: len(before)] == tuple(before)
        await stack.store.flush(resumed.session)
        assert await stack.durable_types(SID) == types(events)


async def test_resume_refused_while_live_turn_open_then_real_turn_end(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        gate = anyio.Event()
        adapter = ScriptedAdapter([TextResponse("held", gate=gate)])
        loop = make_loop(stack, adapter)
        try:
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(loop.run_turn, "hi")
                    await wait_until(lambda: adapter.requests)
                    await stack.store.flush(loop.session)
                    with pytest.raises(LiveTurnOpenError):
                        await AgentLoop.resume(
                            stack.host, stack.store, stack.coordinator, SID, adapter, provider="scripted", model="m1"
                        )
                    gate.set()
        finally:
            gate.set()
        view = await stack.coordinator.load(SID)
        assert types(view.events)[-1] == "turn/end"
        assert turn_end_reason(view.events) == {"kind": "completed"}
        assert view.events == loop.session.events
        with pytest.raises(SessionAlreadyExistsError):
            await AgentLoop.resume(
                stack.host, stack.store, stack.coordinator, SID, adapter, provider="scripted", model="m1"
            )


async def test_native_cancellation_closes_the_turn_balanced_and_propagates(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        gate = anyio.Event()  # never set: the parallel bodies hang until the native cancel
        tool = ScriptedTool("p", parallel=True, gate=gate)
        calls = (("c1", "p", {}), ("c2", "p", {}), ("c3", "p", {}))
        adapter = ScriptedAdapter([ToolCallResponse(calls)])
        loop = make_loop(stack, adapter, [tool], max_parallel_tool_calls=2)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(loop.run_turn, "go")
                await wait_until(lambda: len(tool.calls) == 2)
                tg.cancel_scope.cancel()
        events = loop.session.events
        assert not has_open_turn(events)
        assert turn_end_reason(events) == {"kind": "aborted", "reason": {"kind": "disposed"}}
        results = of_type(events, "tool/result")
        assert [(data(r)["message"]["source"]["callId"], data(r)["error"]["code"]) for r in results] == [
            ("c1", "ABORTED"),
            ("c2", "ABORTED"),
            ("c3", "ABORTED_BEFORE_DISPATCH"),
        ]
        assert types(events)[-2:] == ["step/end", "turn/end"]
        assert not loop.running
