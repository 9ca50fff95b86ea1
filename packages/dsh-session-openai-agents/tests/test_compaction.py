"""The SDK's compaction through DshSession: ``OpenAIResponsesCompactionSession`` over a ``DshSession`` on a real
JSONL store, with a scripted model and a fake compaction endpoint (no network). Each replacement is one
``openai-agents/compaction`` record; a new store on the same root reads the compacted history back.

The runner tests run on asyncio only (the SDK's Runner and its compaction wrapper are asyncio); the snapshot hook
itself is driven by hand on asyncio and trio. The SIGKILL tests are in tests-integration/test_openai_agents_compaction_crash.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.memory import OpenAIResponsesCompactionSession
from agents.testing import ScriptedModel, assistant_message, function_call
from dsh.session_openai_agents import COMPACTION_EVENT, POP_EVENT, DshSession, DshSessionClosedError, DurableRunHooks
from dsh.session_persistence import SessionPersistenceCorruptionError, open_sessions
from dsh.session_persistence.events import OpaqueEvent, ToolCall, UserMessage

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::dsh.session_openai_agents.NotDurableWarning")]

SUMMARY = {"type": "compaction", "id": "cmp-1", "encrypted_content": "synthetic-summary"}


class Responses:
    def __init__(self, output: list[dict[str, Any]]) -> None:
        self.output = output
        self.calls: list[dict[str, Any]] = []

    async def compact(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return Compacted(list(self.output))


class Compacted:
    def __init__(self, output: list[dict[str, Any]]) -> None:
        self.output = output
        self.usage = None


class FakeClient:
    """The one endpoint the compaction wrapper calls (``client.responses.compact``), answering ``output``."""

    def __init__(self, output: list[dict[str, Any]]) -> None:
        self.responses = Responses(output)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def said(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


HISTORY = [user("u0"), said("a0"), user("u1"), said("a1"), user("u2"), said("a2")]


def records(sessions: Any, session_id: str, kind: str) -> list[OpaqueEvent]:
    events = sessions.store.get(session_id).events
    return [e for e in events if type(e) is OpaqueEvent and e.type == kind]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the SDK's Runner runs on asyncio only
async def test_automatic_compaction_under_a_session_limit_replaces_the_suffix_durably(tmp_path: Path) -> None:
    # With a retrieval limit the model sees 2 of 8 items: the SDK compacts only through a bounded snapshot (the
    # hook DshSession provides), never by clear + add of a history it could not read whole.
    root = tmp_path / "sessions"
    client = FakeClient([SUMMARY])
    reply = assistant_message("done")
    async with open_sessions(root) as sessions, DshSession(sessions, "s") as session:
        await session.add_items(list(HISTORY))
        compaction = OpenAIResponsesCompactionSession(
            "s",
            session,  # type: ignore[arg-type]
            client=client,
            compaction_mode="input",
            should_trigger_compaction=lambda _: True,
        )
        agent = Agent(name="worker", model=ScriptedModel([[reply]]))
        config = RunConfig(session_settings={"limit": 1})
        await Runner.run(agent, "continue", session=compaction, run_config=config, hooks=DurableRunHooks(session))
        assert len(client.responses.calls) == 1
        # The suffix the model saw, from its user message on: the new turn.
        assert client.responses.calls[0]["input"] == [user("continue"), reply.model_dump(exclude_unset=True)]
        assert await session.get_items() == [*HISTORY, SUMMARY]
        assert len(records(sessions, "s", COMPACTION_EVENT)) == 1
    async with open_sessions(root) as sessions, DshSession(sessions, "s") as session:
        assert await session.get_items() == [*HISTORY, SUMMARY]  # after reload: the compacted history
        # The dsh transcript keeps the whole conversation: compaction changes what the SDK replays, not the log.
        texts = [e.data.content[0].text for e in sessions.store.get("s").events if type(e) is UserMessage]  # type: ignore[union-attr]
        assert texts == ["u0", "u1", "u2", "continue"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_manual_compaction_replaces_the_whole_history_in_one_record(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    client = FakeClient([user("summary of u0..a2"), SUMMARY])
    async with open_sessions(root) as sessions, DshSession(sessions, "s") as session:
        await session.add_items(list(HISTORY))
        compaction = OpenAIResponsesCompactionSession("s", session, client=client, compaction_mode="input")  # type: ignore[arg-type]
        await compaction.run_compaction({"force": True})
        assert client.responses.calls[0]["input"] == HISTORY
        (record,) = records(sessions, "s", COMPACTION_EVENT)
        assert record.data == {"from": [0, 0], "items": [user("summary of u0..a2"), SUMMARY]}
        await session.add_items([user("after")])
    async with open_sessions(root) as sessions, DshSession(sessions, "s") as session:
        assert await session.get_items() == [user("summary of u0..a2"), SUMMARY, user("after")]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_automatic_compaction_needs_no_rollback_budget(tmp_path: Path) -> None:
    # Without the snapshot hook the SDK reads the whole history against max_rollback_items and raises ValueError.
    client = FakeClient([SUMMARY])
    async with open_sessions(tmp_path) as sessions, DshSession(sessions, "s") as session:
        await session.add_items(list(HISTORY))
        compaction = OpenAIResponsesCompactionSession(
            "s", session, client=client, compaction_mode="input", should_trigger_compaction=lambda _: True,  # type: ignore[arg-type]
            max_rollback_items=2,
        )  # fmt: skip
        agent = Agent(name="worker", model=ScriptedModel([[assistant_message("done")]]))
        await Runner.run(agent, "continue", session=compaction, hooks=DurableRunHooks(session))
        assert len(client.responses.calls) == 1
        assert await session.get_items() == [SUMMARY]  # the model saw all 8 items: the snapshot is complete


async def test_snapshot_replace_pop_and_a_second_compaction_survive_reload(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    async with open_sessions(root) as sessions, DshSession(sessions, "s") as session:
        await session.add_items(list(HISTORY))
        snapshot = await session._get_compaction_snapshot(4)
        assert (snapshot.items, snapshot.complete) == (HISTORY[2:], False)
        assert await snapshot.replace_suffix(2, [SUMMARY, user("kept")]) is True  # u2, a2 -> SUMMARY, kept
        assert await session.get_items() == [*HISTORY[:4], SUMMARY, user("kept")]
        assert await session.pop_item() == user("kept")  # a compacted item pops like any other
        (pop,) = records(sessions, "s", POP_EVENT)
        assert pop.data == {"itemSeq": records(sessions, "s", COMPACTION_EVENT)[0].seq, "index": 1}
        whole = await session._get_compaction_snapshot(100)
        assert (whole.items, whole.complete) == ([*HISTORY[:4], SUMMARY], True)
        # A second compaction whose suffix starts inside the first one's items.
        assert await whole.replace_suffix(3, [user("second")]) is True
        assert await session.get_items() == [*HISTORY[:3], user("second")]
    async with open_sessions(root) as sessions, DshSession(sessions, "s") as session:
        assert await session.get_items() == [*HISTORY[:3], user("second")]
        assert await session.get_items(limit=2) == [HISTORY[2], user("second")]


async def test_a_snapshot_is_refused_once_the_session_moved(tmp_path: Path) -> None:
    async with open_sessions(tmp_path) as sessions, DshSession(sessions, "s") as session:
        await session.add_items(list(HISTORY))
        for move in (
            session.add_items([user("newer")]),
            session.pop_item(),
            session._atomic_replace_items([user("replaced")]),
        ):
            snapshot = await session._get_compaction_snapshot(3)
            before = await session.get_items()
            await move
            after = await session.get_items()
            assert await snapshot.replace_suffix(0, [SUMMARY]) is False
            assert await session.get_items() == after != before  # nothing written by the stale replacement
        snapshot = await session._get_compaction_snapshot(3)
        assert await snapshot.replace_suffix(3, [SUMMARY]) is False  # an empty suffix is no replacement
        assert len(records(sessions, "s", COMPACTION_EVENT)) == 1  # only the _atomic_replace_items above


async def test_prune_prefix_drops_the_leading_run_it_accepts_in_the_same_record(tmp_path: Path) -> None:
    async with open_sessions(tmp_path) as sessions, DshSession(sessions, "s") as session:
        await session.add_items([user("old-1"), user("old-2"), user("live"), user("old-3"), *HISTORY])
        snapshot = await session._get_compaction_snapshot(
            2, prune_prefix=lambda item: item["content"].startswith("old")
        )
        assert await snapshot.replace_suffix(0, [SUMMARY]) is True
        # The leading run stops at "live": "old-3" after it stays.
        assert await session.get_items() == [user("live"), user("old-3"), *HISTORY[:4], SUMMARY]
        assert len(records(sessions, "s", COMPACTION_EVENT)) == 1


async def test_a_malformed_compaction_record_is_a_typed_error_and_closed_sessions_refuse() -> None:
    async with open_sessions(backend="memory") as sessions:
        for session_id, data, message in (
            ("s", {"from": "start", "items": []}, "no valid position"),
            ("t", {"from": [0, -1], "items": []}, "no valid position"),
            ("u", {"from": [0, 0], "items": "x"}, "no item list"),
        ):
            async with DshSession(sessions, session_id) as session:
                await session.add_items([user("one")])
                sessions.store.get(session_id).append(COMPACTION_EVENT, data, ignorable=True)  # type: ignore[union-attr]
                with pytest.raises(SessionPersistenceCorruptionError, match=message):
                    await session.get_items()
        with pytest.raises(DshSessionClosedError):
            await session._atomic_replace_items([SUMMARY])
        with pytest.raises(DshSessionClosedError):
            await session._get_compaction_snapshot(1)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_compaction_after_a_tool_turn_with_the_hooks_keeps_the_next_run_whole(tmp_path: Path) -> None:
    # The hooks record the model's function call early (deduplicated when the SDK saves it); the compaction after
    # the turn replaces the whole tool group, and the next run appends after the summary, nothing duplicated.
    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    root = tmp_path / "sessions"
    client = FakeClient([SUMMARY])
    model = ScriptedModel(
        [[function_call("add", {"a": 2, "b": 3}, call_id="c1")], [assistant_message("5")], [assistant_message("ok")]]
    )
    agent = Agent(name="calc", model=model, tools=[add])
    async with open_sessions(root) as sessions, DshSession(sessions, "s") as session:
        compaction = OpenAIResponsesCompactionSession(
            "s",
            session,  # type: ignore[arg-type]
            client=client,
            compaction_mode="input",
            should_trigger_compaction=lambda _: True,
        )
        await Runner.run(agent, "2 + 3?", session=compaction, hooks=DurableRunHooks(session))
        assert len(client.responses.calls) == 1
        assert [i.get("type") for i in client.responses.calls[0]["input"]] == [
            None,  # the run's input: {"role": "user", "content": ...}
            "function_call",
            "function_call_output",
            "message",
        ]
        assert await session.get_items() == [SUMMARY]
        client.responses.output = []  # the second compaction would drop everything: keep it from running
        compaction.should_trigger_compaction = lambda _: False
        await Runner.run(agent, "thanks", session=compaction, hooks=DurableRunHooks(session))
        assert model.last_call is not None and model.last_call.input[0] == SUMMARY
    async with open_sessions(root) as sessions, DshSession(sessions, "s") as session:
        items = await session.get_items()
        assert items[0] == SUMMARY and items[1] == user("thanks") and len(items) == 3
        assert [e.data.call_id for e in sessions.store.get("s").events if type(e) is ToolCall] == ["c1"]  # type: ignore[union-attr]
