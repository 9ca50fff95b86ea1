"""DshSession: the SDK's Session protocol on a dsh session (the core's memory backend; asyncio and trio, the
Runner test asyncio only)."""

from __future__ import annotations

import warnings
from typing import Any

import anyio
import pytest
from agents import Agent, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from dsh.session_openai_agents import (
    ITEM_EVENT,
    POP_EVENT,
    DshSession,
    DshSessionClosedError,
    DurableRunHooks,
    NotDurableWarning,
)
from dsh.session_persistence import MemoryBackend, MemoryStore, SessionLockedError, open_sessions
from dsh.session_persistence.events import OpaqueEvent, ToolCall, ToolResult, UserMessage

# These tests drive the Session protocol by hand (no runner): the not-durable warning is tested on its own below.
pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::dsh.session_openai_agents.NotDurableWarning")]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def test_items_round_trip_pop_and_clear_durably() -> None:
    shared = MemoryStore()
    async with open_sessions(backend=MemoryBackend(shared)) as sessions, DshSession(sessions, "s") as session:
        await session.add_items([user("one"), user("two")])
        await session.add_items(
            [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "three"}]}]
        )
        assert await session.get_items(limit=2) == [
            user("two"),
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "three"}]},
        ]
        assert await session.get_items(limit=0) == []
        popped = await session.pop_item()
        assert popped is not None and popped["role"] == "assistant"
    async with open_sessions(backend=MemoryBackend(shared)) as sessions, DshSession(sessions, "s") as session:
        assert await session.get_items() == [user("one"), user("two")]  # the pop is durable
        events = sessions.store.get("s").events  # type: ignore[union-attr]
        assert [e.type for e in events if type(e) is OpaqueEvent].count(POP_EVENT) == 1
        assert [e.data.content[0].text for e in events if type(e) is UserMessage] == ["one", "two"]  # type: ignore[union-attr]
        await session.clear_session()
        assert await session.get_items() == []
        assert await session.pop_item() is None
    async with open_sessions(backend=MemoryBackend(shared)) as sessions, DshSession(sessions, "s") as session:
        assert await session.get_items() == []  # the clear is durable
        await session.add_items([user("after")])
        assert await session.get_items() == [user("after")]


async def test_concurrent_calls_on_one_session_are_serialized() -> None:
    async with open_sessions(backend="memory") as sessions, DshSession(sessions, "s") as session:
        async with anyio.create_task_group() as tg:
            for n in range(40):
                tg.start_soon(session.add_items, [user(f"m{n}"), user(f"m{n}b")])
        items = await session.get_items()
    assert len(items) == 80
    for n in range(40):  # each batch stays contiguous
        assert items[items.index(user(f"m{n}")) + 1] == user(f"m{n}b")


async def test_a_second_writer_in_the_same_process_is_refused() -> None:
    shared = MemoryStore()
    async with open_sessions(backend=MemoryBackend(shared)) as one, DshSession(one, "s") as first:
        await first.add_items([user("mine")])
        async with open_sessions(backend=MemoryBackend(shared)) as two:
            with pytest.raises(SessionLockedError):
                await DshSession(two, "s").get_items()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the SDK's Runner runs on asyncio only
async def test_runner_with_hooks_records_calls_first_class_and_dedupes_the_sdk_save() -> None:
    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    model = ScriptedModel([[function_call("add", {"a": 2, "b": 3}, call_id="c1")], [assistant_message("5")]])
    agent = Agent(name="calc", model=model, tools=[add])
    async with open_sessions(backend="memory") as sessions, DshSession(sessions, "s") as session:
        result = await Runner.run(agent, "2 + 3?", session=session, hooks=DurableRunHooks(session))
        assert result.final_output == "5"
        items = await session.get_items()
        assert [i.get("type") for i in items] == [None, "function_call", "function_call_output", "message"]
        events = sessions.store.get("s").events  # type: ignore[union-attr]
        assert [e.data.call_id for e in events if type(e) is ToolCall] == ["c1"]
        assert len([e for e in events if type(e) is ToolResult]) == 1
        assert len([e for e in events if type(e) is OpaqueEvent and e.type == ITEM_EVENT]) == 4  # no duplicates


async def test_session_settings_limit_applies_and_bad_settings_are_refused() -> None:
    async with open_sessions(backend="memory") as sessions:
        session = DshSession(sessions, "s", session_settings={"limit": 1})
        await session.add_items([user("a"), user("b")])
        assert await session.get_items() == [user("b")]
        assert await session.get_items(limit=2) == [user("a"), user("b")]
        await session.aclose()
        with pytest.raises(TypeError, match="limitt"):
            DshSession(sessions, "t", session_settings={"limitt": 1})


@pytest.mark.filterwarnings("error::dsh.session_openai_agents.NotDurableWarning")
async def test_without_hooks_the_first_write_warns_once_and_hooks_silence_it() -> None:
    async with open_sessions(backend="memory") as sessions, DshSession(sessions, "bare") as bare:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            await bare.add_items([user("one")])
            await bare.add_items([user("two")])
        assert [type(w.message) for w in caught] == [NotDurableWarning]
        assert "hooks=DurableRunHooks(session)" in str(caught[0].message)
        async with DshSession(sessions, "hooked") as hooked:
            DurableRunHooks(hooked)
            await hooked.add_items([user("one")])  # an unexpected warning is an error here


async def test_every_call_after_aclose_raises_a_typed_error_and_writes_nothing() -> None:
    shared = MemoryStore()
    async with open_sessions(backend=MemoryBackend(shared)) as sessions:
        session = DshSession(sessions, "s")
        await session.add_items([user("kept")])
        await session.aclose()
        await session.aclose()  # idempotent
        for call in (
            session.add_items([user("late")]),
            session.pop_item(),
            session.clear_session(),
            session.get_items(),
            session.record_response([], "m"),
        ):
            with pytest.raises(DshSessionClosedError, match="closed") as raised:
                await call
            assert isinstance(raised.value, RuntimeError)  # what the SDK's own sessions raise after close()
    async with open_sessions(backend=MemoryBackend(shared)) as sessions, DshSession(sessions, "s") as again:
        assert await again.get_items() == [user("kept")]
