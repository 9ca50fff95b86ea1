"""The reference loop reads only the tail of the log per turn and step: no snapshot of the whole log (the
``Session.events`` tuple), and ``Session.events_from`` copies just what it is asked for."""

from __future__ import annotations

from typing import Any

import pytest
from dsh.session_persistence import Host, Session, SessionStore
from dsh.session_persistence.loop import AgentLoop
from dsh.session_persistence.testing import ScriptedAdapter, ScriptedTool, TextResponse, ToolCallResponse

pytestmark = pytest.mark.anyio


def _loop(responses: list[Any], tools: list[Any] | None = None) -> AgentLoop:
    host = Host()
    store = SessionStore(host)
    adapter = ScriptedAdapter(responses, provider="p", model="m")
    return AgentLoop(host, store, adapter, tools or [], session_id="tail")


async def test_a_turn_never_snapshots_the_whole_log(monkeypatch: pytest.MonkeyPatch) -> None:
    responses: list[Any] = []
    for i in range(3):
        responses.append(ToolCallResponse(((f"c{i}", "echo", {"x": i}),), text="calling"))
        responses.append(TextResponse(f"answer {i}"))
    loop = _loop(responses, [ScriptedTool("echo", output="ok")])
    await loop.run_turn("warm up")  # the first turn may look at the (empty) log as it likes
    snapshots: list[int] = []
    whole = Session.events

    def counted(self: Session) -> tuple[Any, ...]:
        snapshots.append(len(self))
        return whole.fget(self)  # type: ignore[attr-defined, no-any-return]

    monkeypatch.setattr(Session, "events", property(counted))
    result = await loop.run_turn("second")
    result2 = await loop.run_turn("third")
    monkeypatch.undo()
    assert snapshots == []
    assert result.text == "answer 1" and result2.text == "answer 2"
    loop.close()


async def test_turn_numbers_follow_a_log_cut_below_the_last_turn() -> None:
    loop = _loop([TextResponse(f"a{i}") for i in range(4)])
    await loop.run_turn("one")
    await loop.run_turn("two")
    assert loop.last_turn() == 2
    loop.session.truncate(0)
    assert loop.last_turn() == 0
    await loop.run_turn("three")
    assert loop.last_turn() == 1
    turns = [e.data.turn for e in loop.session.events if e.type == "turn/start"]  # type: ignore[union-attr]
    assert turns == [1]
    loop.close()


async def test_turn_numbers_follow_a_log_cut_and_refilled_to_the_scanned_length() -> None:
    loop = _loop([TextResponse(f"a{i}") for i in range(3)])
    await loop.run_turn("one")
    await loop.run_turn("two")
    length = len(loop.session)
    assert loop.last_turn() == 2
    loop.session.truncate(0)
    turn = 7
    while len(loop.session) < length - 1:
        loop.session.append("turn/start", {"turn": turn})
        loop.session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
        turn += 1
    if len(loop.session) < length:
        loop.session.append("x-test/note", {"filler": True})
    assert len(loop.session) == length
    assert loop.last_turn() == turn - 1  # the refilled log's own last turn, not the one remembered
    loop.close()


def test_events_from_is_the_tail_of_events() -> None:
    session = Session("s", clock=lambda: 1)
    for i in range(5):
        session.append("x-test/note", {"i": i})
    assert session.events_from(0) == session.events
    assert session.events_from(3) == session.events[3:]
    assert session.events_from(5) == ()
    assert session.events_from(9) == ()
    session.append("x-test/note", {"i": 5})  # no snapshot cached now
    assert session.events_from(4) == session.events[4:]
    assert isinstance(session.events_from(2), tuple)


@pytest.mark.parametrize("bad", [-1, 1.0, True, "1", 2**53], ids=["negative", "float", "bool", "str", "unsafe"])
def test_events_from_refuses_what_is_not_an_offset(bad: object) -> None:
    session = Session("s", clock=lambda: 1)
    with pytest.raises(TypeError, match="SessionLogOffset must be a non-negative safe integer"):
        session.events_from(bad)  # type: ignore[arg-type]
