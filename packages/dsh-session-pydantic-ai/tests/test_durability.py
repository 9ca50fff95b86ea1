"""DshDurability through pydantic-ai's own runs (``FunctionModel``, no network): what it records, when it is
durable, how a cut run comes back and continues, and what it refuses. pydantic-ai runs on asyncio only."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from dsh.session_persistence import (
    Host,
    MemoryBackend,
    MemoryStore,
    PersistenceCoordinator,
    Sessions,
    SessionStore,
    open_sessions,
)
from dsh.session_persistence.events import OpaqueEvent, ToolCall, ToolReconcile, ToolResult, TurnEnd
from dsh.session_persistence.loop import TOOL_RECONCILED_NOT_HAPPENED_TEXT, Reconciliation
from dsh.session_persistence.repair import TOOL_NOT_STARTED_TEXT, TOOL_OUTCOME_UNKNOWN_TEXT, unknown_calls
from dsh.session_pydantic_ai import (
    DshDurability,
    DurabilityClosedError,
    HistoryMismatchError,
    NotDurableWarning,
    RunOverlapError,
)
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),  # pydantic-ai runs on asyncio only
    pytest.mark.filterwarnings("ignore::dsh.session_pydantic_ai.NotDurableWarning"),  # the memory backend
]


def mailer(seen: list[list[ModelMessage]]) -> FunctionModel:
    """Asked anything, calls ``send(to="bob")``; handed a tool return, answers with its text."""

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(f"said: {returns[0].model_response_str()}")])
        return ModelResponse(parts=[ToolCallPart("send", {"to": "bob"}, tool_call_id=f"call-{len(seen)}")])

    return FunctionModel(reply)


def json_of(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


@asynccontextmanager
async def slow_store(shared: MemoryStore) -> AsyncIterator[Sessions]:
    """Sessions over ``shared`` with a one-minute write-behind window: only a barrier makes anything durable."""
    host = Host()
    async with PersistenceCoordinator(host, MemoryBackend(shared), write_batch_max_delay_ms=60_000) as persistence:
        yield Sessions(host, SessionStore(host), persistence)


async def test_runs_are_recorded_and_come_back_as_the_history_the_agent_built() -> None:
    shared, seen = MemoryStore(), []
    async with open_sessions(backend=MemoryBackend(shared)) as sessions, DshDurability(sessions, "s") as durability:
        agent = Agent(mailer(seen), capabilities=[durability])
        agent.tool_plain(lambda to: f"sent to {to}", name="send")
        first = await agent.run("Email Bob.", message_history=await durability.history())
        second = await agent.run("And again.", message_history=await durability.history())
        assert second.output == "said: sent to bob"
        assert json_of(second.all_messages()[: len(first.all_messages())]) == json_of(first.all_messages())
    async with open_sessions(backend=MemoryBackend(shared)) as sessions, DshDurability(sessions, "s") as durability:
        assert json_of(await durability.history()) == json_of(second.all_messages())
        assert not await durability.interrupted()
    events = shared.events("s")
    ends = [type(e.data.reason).__name__ for e in events if type(e) is TurnEnd]
    assert ends == ["CompletedReason", "CompletedReason"]  # one dsh turn per run
    kinds = [e.type for e in events if type(e) in (ToolCall, ToolResult)]
    assert kinds == ["tool/call", "tool/result"] * 2


async def test_a_tool_body_never_runs_before_its_call_is_durable() -> None:
    shared, seen, durable_at_start = MemoryStore(), [], []
    async with slow_store(shared) as sessions, DshDurability(sessions, "s") as durability:
        agent = Agent(mailer(seen), capabilities=[durability])

        @agent.tool_plain
        def send(to: str) -> str:
            durable_at_start.append([e.type for e in shared.events("s")])
            return f"sent to {to}"

        await agent.run("Email Bob.", message_history=await durability.history())
    (stored,) = durable_at_start
    assert stored[-1] == "tool/call"  # the call, and the response that asked for it, were on disk first
    assert "assistant/message" in stored
    assert stored.count("pydantic-ai/message") == 2  # the request and the response, verbatim


async def test_each_model_request_is_durable_before_the_model_sees_it() -> None:
    shared, on_disk = MemoryStore(), []

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        on_disk.append(sum(1 for e in shared.events("s") if type(e) is OpaqueEvent))
        return ModelResponse(parts=[TextPart("ok")])

    async with slow_store(shared) as sessions, DshDurability(sessions, "s") as durability:
        await Agent(FunctionModel(reply), capabilities=[durability]).run("Hi.", message_history=[])
    assert on_disk == [1]  # the user's request was stored before the model was asked


async def test_a_run_cut_mid_tool_continues_with_the_honest_result_and_no_second_run() -> None:
    shared, seen, ran = MemoryStore(), [], []
    started = anyio.Event()

    async def send(to: str) -> str:
        ran.append(to)
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with open_sessions(backend=MemoryBackend(shared)) as sessions, DshDurability(sessions, "s") as durability:
        agent = Agent(mailer(seen), capabilities=[durability])
        agent.tool_plain(send)
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run, "Email Bob.")
            await started.wait()
            tg.cancel_scope.cancel()  # the run is cut while the body runs, after its side effect
        assert await durability.interrupted()
        history = await durability.history()
        assert isinstance(history[-1], ModelRequest)
        (answer,) = history[-1].parts
        assert isinstance(answer, ToolReturnPart)
        assert (answer.tool_call_id, answer.content) == ("call-1", TOOL_OUTCOME_UNKNOWN_TEXT)
        result = await agent.run(message_history=history)  # no new prompt
    assert result.output == f"said: {TOOL_OUTCOME_UNKNOWN_TEXT}"
    assert ran == ["bob"]  # the body ran once
    (sent,) = seen[-1][-1].parts  # the model's next request is the honest answer, and nothing else
    assert isinstance(sent, ToolReturnPart)
    assert (sent.tool_call_id, sent.content) == ("call-1", TOOL_OUTCOME_UNKNOWN_TEXT)
    events = shared.events("s")
    ends = [type(e.data.reason).__name__ for e in events if type(e) is TurnEnd]
    assert ends == ["InterruptedReason", "CompletedReason"]
    assert any(e.type == "turn/continue" for e in events)


async def test_a_call_whose_body_never_started_is_answered_not_started() -> None:
    # Two calls run one after the other (a sequential tool); the run is cut inside the first body: the first may have
    # taken effect, the second certainly did not, and the model is told each.
    shared = MemoryStore()
    started = anyio.Event()

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(
            parts=[
                ToolCallPart("send", {"to": "bob"}, tool_call_id="c1"),
                ToolCallPart("send", {"to": "al"}, tool_call_id="c2"),
            ]
        )

    async def send(to: str) -> str:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with open_sessions(backend=MemoryBackend(shared)) as sessions, DshDurability(sessions, "s") as durability:
        agent = Agent(FunctionModel(reply), capabilities=[durability])
        agent.tool_plain(send, sequential=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run, "Email Bob and Al.")
            await started.wait()
            tg.cancel_scope.cancel()
        answers = {p.tool_call_id: p.content for p in (await durability.history())[-1].parts}
    assert answers == {"c1": TOOL_OUTCOME_UNKNOWN_TEXT, "c2": TOOL_NOT_STARTED_TEXT}


@pytest.mark.parametrize(
    ("finding", "expected"),
    [
        (Reconciliation.happened("sent to bob (found)"), "sent to bob (found)"),
        (Reconciliation.did_not_happen("no such mail"), f"{TOOL_RECONCILED_NOT_HAPPENED_TEXT} (no such mail)"),
        (Reconciliation.cannot_tell("outbox down"), TOOL_OUTCOME_UNKNOWN_TEXT),
    ],
)
async def test_a_tool_check_reconciles_the_cut_call(finding: Reconciliation, expected: str) -> None:
    shared, asked = MemoryStore(), []
    started = anyio.Event()

    async def send(to: str) -> str:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with open_sessions(backend=MemoryBackend(shared)) as sessions:
        durability = DshDurability(sessions, "s")
        agent = Agent(mailer([]), capabilities=[durability])
        agent.tool_plain(send)
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run, "Email Bob.")
            await started.wait()
            tg.cancel_scope.cancel()
        await durability.aclose()

        def check(arguments: Any, call_id: str) -> Reconciliation:
            asked.append((arguments, call_id))
            return finding

        async with DshDurability(sessions, "s", checks={"send": check}) as resumed:
            (answer,) = (await resumed.history())[-1].parts
    assert asked == [({"to": "bob"}, "call-1")]
    assert isinstance(answer, ToolReturnPart)
    assert expected in str(answer.content)
    assert [e.data.outcome for e in shared.events("s") if type(e) is ToolReconcile] == [finding.outcome]


async def test_the_calls_to_reconcile_are_the_cores_own_scan() -> None:
    """The capability asks about exactly the calls the core's loop would: it uses the core's public
    ``repair.unknown_calls``, not a copy of that scan (DESIGN §10.1: public faces across distributions)."""
    from dsh.session_pydantic_ai import _capability, _history

    assert _capability.unknown_calls is unknown_calls
    assert not hasattr(_history, "unknown_calls")


async def test_a_history_that_does_not_extend_the_stored_one_is_refused_before_the_model() -> None:
    shared, seen = MemoryStore(), []
    async with open_sessions(backend=MemoryBackend(shared)) as sessions, DshDurability(sessions, "s") as durability:
        agent = Agent(mailer(seen), capabilities=[durability])
        agent.tool_plain(lambda to: "sent", name="send")
        await agent.run("Email Bob.", message_history=await durability.history())
        stored = len(shared.events("s"))
        with pytest.raises(HistoryMismatchError, match=r"message_history=await durability\.history\(\)"):
            await agent.run("Forgot the history.")
        asked = len(seen)
    assert len(seen) == asked == 2  # the refused run never reached the model
    assert len(shared.events("s")) == stored


async def test_the_memory_backend_warns_once_before_the_first_tool_body() -> None:
    order: list[str] = []
    async with open_sessions(backend=MemoryBackend()) as sessions, DshDurability(sessions, "s") as durability:
        agent = Agent(mailer([]), capabilities=[durability])
        agent.tool_plain(lambda to: order.append("body") or "sent", name="send")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            await agent.run("Email Bob.", message_history=await durability.history())
            await agent.run("Again.", message_history=await durability.history())
    warned = [w for w in caught if issubclass(w.category, NotDurableWarning)]
    assert len(warned) == 1
    assert "keeps nothing past this process" in str(warned[0].message)
    assert order == ["body", "body"]


async def test_overlapping_runs_and_use_after_close_are_refused() -> None:
    started = anyio.Event()

    async def send(to: str) -> str:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with open_sessions(backend=MemoryBackend()) as sessions:
        durability = DshDurability(sessions, "s")
        agent = Agent(mailer([]), capabilities=[durability])
        agent.tool_plain(send)
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.run, "Email Bob.")
            await started.wait()
            with pytest.raises(RunOverlapError):
                await agent.run("At the same time.")
            tg.cancel_scope.cancel()
        await durability.aclose()
        with pytest.raises(DurabilityClosedError):
            await durability.history()


@dataclass
class KeepLast(AbstractCapability[Any]):
    """Compacts the run's history to its newest message before every model request after the first."""

    requests: int = 0

    async def before_model_request(self, ctx: RunContext[Any], request_context: Any) -> Any:
        self.requests += 1
        if self.requests > 1:
            del ctx.messages[:-1]
        return request_context


async def test_a_history_rewritten_during_the_run_is_refused_not_recorded() -> None:
    shared = MemoryStore()
    async with open_sessions(backend=MemoryBackend(shared)) as sessions, DshDurability(sessions, "s") as durability:
        agent = Agent(mailer([]), capabilities=[durability, KeepLast()])
        agent.tool_plain(lambda to: "sent", name="send")
        refused: list[HistoryMismatchError] = []
        try:
            result = await agent.run("Email Bob.", message_history=await durability.history())
        except HistoryMismatchError as exc:
            refused.append(exc)
        history = await durability.history()
    if refused:
        assert "rewritten after it began" in str(refused[0])
        # What was stored stays as it was (the first request and the response that asked for the call lead it);
        # nothing of the rewritten tail.
        assert [type(m).__name__ for m in history][:2] == ["ModelRequest", "ModelResponse"]
        assert isinstance(history[0].parts[0], UserPromptPart)
    else:  # pydantic-ai before 2.x hands before_model_request a copy: nothing was rewritten
        assert json_of(history) == json_of(result.all_messages())
