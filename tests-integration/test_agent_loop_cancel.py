"""Agent-loop integration, cancellation and turn outcomes (spec/policy.md §5 scenarios 40-44), on the real stack
of test_agent_loop.py."""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh.session_persistence import (
    Deferred,
    PreStepDecision,
    PreStepInput,
    hookimpl,
)
from dsh.session_persistence.events import SessionEvent
from dsh.session_persistence.loop import AgentLoop
from dsh.session_persistence.repair import has_open_turn
from dsh.session_persistence.testing import (
    ErrorResponse,
    HangResponse,
    ScriptedAdapter,
    ScriptedTool,
    TextResponse,
    ToolCallResponse,
)
from loop_rig import (
    data,
    make_loop,
    of_type,
    open_stack,
    result_of,
    types,
    wait_until,
)

pytestmark = pytest.mark.anyio


# --------------------------------------------------------------------------------------------------------------
# 40-44: cancellation behaviour of the loop


async def run_and_cancel(loop: AgentLoop, ready: Any, *causes: object, text: str = "hi") -> SessionEvent:
    ends: list[SessionEvent] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                ends.append(await loop.run_turn(text))

            tg.start_soon(run)
            await wait_until(ready)
            for cause in causes:
                loop.cancel(cause)
    return ends[0]


async def test_hanging_adapter_cancelled_mid_stream(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        adapter = ScriptedAdapter([HangResponse()])
        loop = make_loop(stack, adapter)
        end = await run_and_cancel(loop, lambda: adapter.requests, "user")
        assert data(end)["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
        assert len(of_type(loop.session.events, "turn/start")) == 1
        assert len(adapter.requests) == 1
        assert not loop.running
        # Idle cancel is a no-op: the next turn runs normally.
        assert loop.cancel("user") is False


async def test_cancel_from_assistant_message_observer_before_tool_runs(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        tool = ScriptedTool("t")
        adapter = ScriptedAdapter([ToolCallResponse((("c1", "t", {}),)), TextResponse("after")])
        loop = make_loop(stack, adapter, [tool])

        class CancelOnAssistant:
            @hookimpl
            def session_event(self, event: SessionEvent) -> None:
                if event.type == "assistant/message":
                    loop.cancel("user")

        stack.host.register(CancelOnAssistant(), name="cancel-on-assistant")
        with anyio.fail_after(10):
            end = await loop.run_turn("go")
        stack.host.unregister(name="cancel-on-assistant")
        assert tool.calls == []
        assert data(end)["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
        [result] = of_type(loop.session.events, "tool/result")
        assert data(result)["error"]["code"] == "ABORTED_BEFORE_DISPATCH"
        assert of_type(loop.session.events, "tool/call")[0].seq == result.source_event_seqs[0]
        with anyio.fail_after(10):
            end = await loop.run_turn("again")
        assert data(end)["reason"] == {"kind": "completed"}
        blocks = [b for m in adapter.requests[-1].messages for b in m.content if type(b).__name__ == "ToolResultBlock"]
        assert [(b.tool_call_id, b.content[0].text) for b in blocks] == [
            ("c1", "Error: tool call aborted before dispatch")
        ]  # type: ignore[attr-defined]


async def test_cancel_mid_stream_keeps_partial_text_interrupted(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        adapter = ScriptedAdapter([HangResponse("partial answer here", after=2)])
        loop = make_loop(stack, adapter)
        end = await run_and_cancel(loop, lambda: len(of_type(loop.session.events, "assistant/chunk")) == 3, "user")
        events = loop.session.events
        chunks = of_type(events, "assistant/chunk")
        [message] = of_type(events, "assistant/message")
        assert data(message)["interrupted"] is True
        assert data(message)["message"]["content"] == [{"type": "text", "text": "partial answer "}]
        assert message.source_event_seqs == tuple(c.seq for c in chunks)
        assert types(events[message.seq :]) == ["assistant/message", "step/end", "turn/end"]
        assert data(end)["reason"]["kind"] == "aborted"


async def test_first_cause_wins(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        adapter = ScriptedAdapter([HangResponse()])
        loop = make_loop(stack, adapter)
        parent = {"kind": "parent"}
        end = await run_and_cancel(loop, lambda: adapter.requests, parent, "user")
        assert data(end)["reason"] == {"kind": "aborted", "reason": {"kind": "parent"}}
        assert adapter.requests[0].signal.reason is parent


class WaitingPreStep:
    """A cooperative pre-step wrapper that waits on the signal before letting the chain continue."""

    def __init__(self) -> None:
        self.waiting = False

    @hookimpl(wrapper=True)
    def agent_pre_step(
        self, pre_step: PreStepInput
    ) -> Generator[None, Awaitable[PreStepDecision], Awaitable[PreStepDecision]]:
        inner = yield
        return Deferred(self._wait, inner, pre_step)

    async def _wait(self, inner: Awaitable[PreStepDecision], pre_step: PreStepInput) -> PreStepDecision:
        self.waiting = True
        await pre_step.signal.wait()
        return await inner


@pytest.mark.parametrize("boundary", ["pre-step", "request", "tool"])
async def test_cancel_while_a_boundary_waits_on_the_signal(tmp_path: Path, boundary: str) -> None:
    async with open_stack(tmp_path) as stack:
        tool = ScriptedTool("t", block=True)
        if boundary == "tool":
            adapter = ScriptedAdapter([ToolCallResponse((("c1", "t", {}),))])
            ready: Any = lambda: tool.calls  # noqa: E731
        else:
            adapter = ScriptedAdapter([HangResponse()])
            ready = lambda: adapter.requests  # noqa: E731
        if boundary == "pre-step":
            waiting = WaitingPreStep()
            stack.host.register(waiting, name="waiting-pre-step")
            ready = lambda: waiting.waiting  # noqa: E731
        loop = make_loop(stack, adapter, [tool])
        end = await run_and_cancel(loop, ready, "user")
        assert data(end)["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
        assert not has_open_turn(loop.session.events)
        if boundary == "pre-step":
            assert adapter.requests == []
            assert of_type(loop.session.events, "step/start") == []
        if boundary == "tool":
            [result] = of_type(loop.session.events, "tool/result")
            assert data(result)["error"]["code"] == "ABORTED"


async def test_error_finish_and_max_tokens_and_blocked(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        adapter = ScriptedAdapter(
            [
                ErrorResponse("rate limited", "RATE_LIMIT"),
                ErrorResponse("boom", raise_=True),
                TextResponse("cut", finish="max-tokens"),
            ]
        )
        loop = make_loop(stack, adapter)
        with anyio.fail_after(10):
            first = await loop.run_turn("a")
            second = await loop.run_turn("b")
            third = await loop.run_turn("c")
        assert data(first)["reason"] == {"kind": "error", "error": {"message": "rate limited", "code": "RATE_LIMIT"}}
        assert data(second)["reason"] == {"kind": "error", "error": {"message": "boom", "code": "ADAPTER_ERROR"}}
        assert data(third)["reason"] == {"kind": "max-tokens"}

        class Reject:
            @hookimpl(wrapper=True)
            def agent_pre_step(self) -> Generator[None, Awaitable[PreStepDecision], Awaitable[PreStepDecision]]:
                inner = yield
                inner.close()  # type: ignore[attr-defined]
                return Deferred(_reject, None)

        stack.host.register(Reject(), name="reject")
        with anyio.fail_after(10):
            blocked = await loop.run_turn("d")
        assert data(blocked)["reason"] == {"kind": "blocked"}
        assert [data(e)["turn"] for e in of_type(loop.session.events, "turn/end")] == [1, 2, 3, 4]


async def _reject(_: object) -> PreStepDecision:
    return PreStepDecision.reject()


async def test_parallel_calls_bounded_and_committed_in_model_order(tmp_path: Path) -> None:
    async with open_stack(tmp_path) as stack:
        gate = anyio.Event()
        active = 0
        peak = 0

        async def effect(arguments: Any, call_id: str) -> None:
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            try:
                await gate.wait()
            finally:
                active -= 1

        tool = ScriptedTool("p", parallel=True, side_effect=effect, output=lambda a, c: f"r-{c}")
        calls = tuple((f"c{i}", "p", {"i": i}) for i in range(5))
        adapter = ScriptedAdapter([ToolCallResponse(calls), TextResponse("done")])
        loop = make_loop(stack, adapter, [tool], max_parallel_tool_calls=3)
        try:
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(loop.run_turn, "go")
                    await wait_until(lambda: len(tool.calls) == 3)
                    await anyio.sleep(0.01)  # give a fourth call the chance to (wrongly) start
                    assert len(tool.calls) == 3
                    gate.set()
        finally:
            gate.set()
        assert peak == 3
        results = of_type(loop.session.events, "tool/result")
        assert [data(r)["message"]["source"]["callId"] for r in results] == [f"c{i}" for i in range(5)]
        assert [result_of(r)["content"][0]["text"] for r in results] == [f"r-c{i}" for i in range(5)]
