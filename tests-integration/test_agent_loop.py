"""Agent-loop integration, what is durable at each boundary and failing closed (spec/policy.md §5 scenarios
25-35; cancellation in test_agent_loop_cancel.py, resume in test_agent_loop_resume.py).

The real stack: ``AgentLoop`` + ``PersistenceCoordinator`` + ``JsonlBackend`` (tmp_path) + ``CheckpointPolicy``,
all discovered through ``Host.load_entrypoints()``. Durability is read back from the backend itself. Every wait is
bounded by ``anyio.fail_after``; gates are released in ``finally``; no assertion depends on timing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh.session_persistence import (
    ModelRequest,
)
from dsh.session_persistence.events import SessionEvent
from dsh.session_persistence.loop import AgentLoop
from dsh.session_persistence.testing import (
    ScriptedAdapter,
    ScriptedTool,
    TextResponse,
    ToolCallResponse,
)
from loop_rig import (
    ABORTED_BEFORE_DISPATCH,
    SID,
    ReadingTool,
    data,
    make_loop,
    of_type,
    open_stack,
    result_of,
    types,
)

pytestmark = pytest.mark.anyio


# --------------------------------------------------------------------------------------------------------------
# 25-28: what is durable at each boundary


async def test_text_turn_flushes_at_pre_step_and_request_only(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        loop = make_loop(stack, ScriptedAdapter([TextResponse("hello there")]))
        with anyio.fail_after(10):
            end = await loop.run_turn("hi")
        assert data(end)["reason"] == {"kind": "completed"}
        events = loop.session.events
        # Pre-step: turn/start; request: + step/start, user/message, request/header, request/context. Not at turn end.
        assert stack.flushes.starts == [1, 5]
        assert types(events[:5]) == ["turn/start", "step/start", "user/message", "request/header", "request/context"]
        assert await stack.durable_types(SID) == types(events[:5])
        assert types(events[5:]) == ["assistant/chunk"] * 5 + ["assistant/message", "step/end", "turn/end"]
        assert data(events[-3])["message"]["content"] == [{"type": "text", "text": "hello there"}]
        assert events[-3].source_event_seqs == tuple(range(5, 10))


async def test_adapter_sees_request_context_durable(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        seen: list[list[str]] = []

        async def read(request: ModelRequest) -> None:
            seen.append(await stack.durable_types(SID))

        loop = make_loop(stack, ScriptedAdapter([TextResponse("ok", hook=read)]))
        with anyio.fail_after(10):
            await loop.run_turn("hi")
        assert seen == [["turn/start", "step/start", "user/message", "request/header", "request/context"]]


async def test_tool_body_sees_its_own_call_durable(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        tool = ReadingTool(stack)
        adapter = ScriptedAdapter([ToolCallResponse((("c1", "probe", {}),)), TextResponse("done")])
        loop = make_loop(stack, adapter, [tool])
        with anyio.fail_after(10):
            await loop.run_turn("go")
        [durable] = tool.seen
        assert durable[-2:] == ["assistant/message", "tool/call"]


async def test_step_two_pre_step_makes_tool_result_durable_before_its_header(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        seen: list[list[str]] = []

        async def read(request: ModelRequest) -> None:
            seen.append(await stack.durable_types(SID))

        adapter = ScriptedAdapter([ToolCallResponse((("c1", "t", {}),)), TextResponse("done", hook=read)])
        loop = make_loop(stack, adapter, [ScriptedTool("t")])
        with anyio.fail_after(10):
            await loop.run_turn("go")
        events = loop.session.events
        # Flushes: pre-step 1, request 1, tool c1, pre-step 2, request 2.
        assert len(stack.flushes.starts) == 5
        step2_pre = stack.flushes.starts[3]
        assert types(events[:step2_pre])[-3:] == ["tool/call", "tool/result", "step/end"]
        # Step 2's header was not re-logged (unchanged) and nothing else came between step/end and step/start.
        assert types(events[step2_pre:][:1]) == ["step/start"]
        assert seen[0][: step2_pre + 1] == types(events[: step2_pre + 1])


# --------------------------------------------------------------------------------------------------------------
# 29-31: fail closed


async def test_pre_step_flush_failure_on_step_two_ends_turn_with_error(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.flushes.fail_from = 4  # pre-step 1, request 1, tool, *pre-step 2*
        adapter = ScriptedAdapter([ToolCallResponse((("c1", "t", {}),)), TextResponse("never")])
        loop = make_loop(stack, adapter, [ScriptedTool("t")])
        with anyio.fail_after(10):
            end = await loop.run_turn("go")
        assert data(end)["reason"] == {"kind": "error", "error": {"message": "disk unavailable", "code": "UNKNOWN"}}
        events = loop.session.events
        assert len(of_type(events, "step/start")) == 1
        assert types(events[-2:]) == ["step/end", "turn/end"]
        assert len(adapter.requests) == 1
        [(turn, step, error)] = stack.errors.errors
        assert (turn, step, str(error)) == (1, 2, "disk unavailable")


async def test_request_flush_failure_never_reaches_the_adapter(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.flushes.fail_from = 2
        adapter = ScriptedAdapter([TextResponse("never")])
        loop = make_loop(stack, adapter)
        with anyio.fail_after(10):
            end = await loop.run_turn("hi")
        assert adapter.requests == []
        assert types(loop.session.events)[-3:] == ["request/context", "step/end", "turn/end"]
        assert data(end)["reason"] == {"kind": "error", "error": {"message": "disk unavailable", "code": "UNKNOWN"}}
        assert [str(e) for _, _, e in stack.errors.errors] == ["disk unavailable"]


async def test_tool_flush_failure_becomes_the_result_then_next_pre_step_fails(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.flushes.fail_from = 3  # the tool checkpoint, and storage stays down
        tool = ScriptedTool("t")
        adapter = ScriptedAdapter([ToolCallResponse((("c1", "t", {}),)), TextResponse("never")])
        loop = make_loop(stack, adapter, [tool])
        with anyio.fail_after(10):
            end = await loop.run_turn("go")
        assert tool.calls == []
        [result] = of_type(loop.session.events, "tool/result")
        assert result_of(result) == {"content": [{"type": "text", "text": "Error: disk unavailable"}], "is_error": True}
        assert types(loop.session.events)[-3:] == ["tool/result", "step/end", "turn/end"]
        assert data(end)["reason"]["kind"] == "error"
        assert [(t, s) for t, s, _ in stack.errors.errors] == [(1, 2)]


# --------------------------------------------------------------------------------------------------------------
# 32-33: cancel during a gated checkpoint


async def test_cancel_while_request_flush_gated(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.flushes.gate_at = 2
        adapter = ScriptedAdapter([TextResponse("never")])
        loop = make_loop(stack, adapter)
        ends: list[SessionEvent] = []
        try:
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:

                    async def run() -> None:
                        ends.append(await loop.run_turn("hi"))

                    tg.start_soon(run)
                    await stack.flushes.gated.wait()
                    loop.cancel("user")
                    stack.flushes.gate.set()
        finally:
            stack.flushes.gate.set()
        assert data(ends[0])["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
        assert adapter.requests == []
        assert of_type(loop.session.events, "assistant/message") == []


async def test_cancel_while_tool_flush_gated(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        stack.flushes.gate_at = 3
        tool = ScriptedTool("t")
        adapter = ScriptedAdapter([ToolCallResponse((("c1", "t", {}), ("c2", "t", {})))])
        loop = make_loop(stack, adapter, [tool])
        ends: list[SessionEvent] = []
        try:
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:

                    async def run() -> None:
                        ends.append(await loop.run_turn("go"))

                    tg.start_soon(run)
                    await stack.flushes.gated.wait()
                    loop.cancel("user")
                    stack.flushes.gate.set()
        finally:
            stack.flushes.gate.set()
        assert tool.calls == []
        events = loop.session.events
        tail = events[-7:]
        assert types(tail) == [
            "assistant/message",
            "tool/call",
            "tool/result",
            "tool/call",
            "tool/result",
            "step/end",
            "turn/end",
        ]
        assert [data(e)["callId"] for e in of_type(tail, "tool/call")] == ["c1", "c2"]
        for result in of_type(tail, "tool/result"):
            assert result_of(result) == {k: ABORTED_BEFORE_DISPATCH[k] for k in ("content", "is_error")}
            assert data(result)["error"] == {"name": "AbortError", "code": "ABORTED_BEFORE_DISPATCH"}
        assert data(ends[0])["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}


# --------------------------------------------------------------------------------------------------------------
# 34-35


async def test_nested_dispatch_has_exactly_one_tool_checkpoint(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        inner = ScriptedTool("inner", output="inner-ok")
        holder: list[AgentLoop] = []

        class Composite:
            name = "run_code"
            parallel = False

            async def run(self, arguments: Any, call_id: str, signal: Any) -> str:
                sub = await holder[0].dispatch_nested("inner", {"x": 1}, parent=call_id, signal=signal)
                return f"outer saw {sub.content[0]['text']}"

        adapter = ScriptedAdapter([ToolCallResponse((("c1", "run_code", {}),)), TextResponse("done")])
        loop = make_loop(stack, adapter, [Composite(), inner])
        holder.append(loop)
        with anyio.fail_after(10):
            await loop.run_turn("go")
        # pre-step 1, request 1, outer tool, pre-step 2, request 2: the nested call adds none.
        assert len(stack.flushes.starts) == 5
        assert [c.call_id for c in inner.calls] == ["c1/inner"]
        [call] = of_type(loop.session.events, "tool/call")
        assert data(call)["callId"] == "c1"
        [result] = of_type(loop.session.events, "tool/result")
        assert result_of(result)["content"] == [{"type": "text", "text": "outer saw inner-ok"}]


async def test_without_policy_no_boundary_flush_but_write_behind_persists(tmp_path: Path) -> None:
    async with open_stack(tmp_path, policy=False, window_ms=5) as stack:
        adapter = ScriptedAdapter([ToolCallResponse((("c1", "t", {}),)), TextResponse("done")])
        # Running without the policy is an explicit opt-out (without it the loop refuses: test_checkpoint_required).
        loop = make_loop(stack, adapter, [ScriptedTool("t")], require_checkpoint_policy=False)
        with anyio.fail_after(10):
            await loop.run_turn("go")
        assert stack.flushes.starts == []
        expected = types(loop.session.events)
        with anyio.fail_after(10):
            while await stack.durable_types(SID) != expected:  # noqa: ASYNC110 - polling the disk, no event exists
                await anyio.sleep(0.005)
        assert stack.flushes.starts == []
