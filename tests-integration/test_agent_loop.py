"""Agent-loop integration (spec/policy.md §5 scenarios 25-35 and 40-46).

The real stack: ``AgentLoop`` + ``PersistenceCoordinator`` + ``JsonlBackend`` (tmp_path) + ``CheckpointPolicy``,
all discovered through ``Host.load_entrypoints()``. Durability is read back from the backend itself. Every wait is
bounded by ``anyio.fail_after``; gates are released in ``finally``; no assertion depends on timing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from pathlib import Path
from typing import Any

import anyio
import pytest
from dsh.session_persistence import (
    Deferred,
    LiveTurnOpenError,
    ModelRequest,
    PreStepDecision,
    PreStepInput,
    SessionAlreadyExistsError,
    aborted_before_dispatch_result,
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
from loop_rig import Stack, data, of_type, open_stack, turn_end_reason, types, wait_until

pytestmark = pytest.mark.anyio

SID = "work"
ABORTED_BEFORE_DISPATCH = aborted_before_dispatch_result().to_builtins()


def make_loop(stack: Stack, adapter: ScriptedAdapter, tools: list[Any] | None = None, **kw: Any) -> AgentLoop:
    return AgentLoop(
        stack.host, stack.store, adapter, tools or [], provider="scripted", model="m1", session_id=SID, **kw
    )


def result_of(event: SessionEvent) -> dict[str, Any]:
    """A tool/result's result block as ``{"content", "is_error"}`` (comparable with ``to_builtins()``)."""
    block = data(event)["message"]["content"][0]
    return {"content": block["content"], "is_error": block.get("isError", False)}


class ReadingTool:
    """A tool whose body reads the durable log at dispatch (scenario 27)."""

    parallel = False

    def __init__(self, stack: Stack, name: str = "probe") -> None:
        self.stack = stack
        self.name = name
        self.seen: list[list[str]] = []

    async def run(self, arguments: Any, call_id: str, signal: Any) -> str:
        self.seen.append(await self.stack.durable_types(SID))
        return "read"


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
