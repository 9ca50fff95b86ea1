"""The reference loop logs ``request/context`` only when the log has none in force, without walking the whole log
each step (it scans only what was appended since its last step; a cut log is scanned again)."""

from __future__ import annotations

import pytest
from dsh.session_persistence import Host, SessionStore
from dsh.session_persistence.loop import AgentLoop
from dsh.session_persistence.testing import ScriptedAdapter, TextResponse

pytestmark = pytest.mark.anyio


def _loop(turns: int) -> AgentLoop:
    host = Host()
    store = SessionStore(host)
    adapter = ScriptedAdapter([TextResponse(f"answer {i}") for i in range(turns)], provider="p", model="m")
    return AgentLoop(host, store, adapter, [], session_id="ctx")


def _contexts(loop: AgentLoop) -> list[int]:
    return [e.seq for e in loop.session.events if e.type == "request/context"]


async def test_the_context_is_logged_once_over_many_turns() -> None:
    loop = _loop(5)
    for i in range(5):
        await loop.run_turn(f"question {i}")
    assert len(_contexts(loop)) == 1
    loop.close()


async def test_a_log_cut_below_its_context_gets_one_again() -> None:
    loop = _loop(3)
    await loop.run_turn("first")
    await loop.run_turn("second")  # its step found the first turn's context
    loop.session.truncate(0)
    await loop.run_turn("third")
    assert len(_contexts(loop)) == 1  # the cut removed the first; the third turn logged its own
    loop.close()


def _refill(loop: AgentLoop, length: int) -> None:
    """Balanced turns (and one opaque event if needed) up to ``length`` events, none of them a context."""
    turn = 100
    while len(loop.session.events) < length - 1:
        loop.session.append("turn/start", {"turn": turn})
        loop.session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
        turn += 1
    if len(loop.session.events) < length:
        loop.session.append("x-test/note", {"filler": True})
    assert len(loop.session.events) == length and not _contexts(loop)


async def test_a_log_cut_and_refilled_to_the_scanned_length_gets_one_again() -> None:
    loop = _loop(3)
    await loop.run_turn("first")
    first = len(loop.session.events)
    await loop.run_turn("second")  # its step scanned up to `first` + the 4 events a step logs before its request
    loop.session.truncate(0)
    _refill(loop, first)  # the third step scans at the very length the second one did, over other events
    await loop.run_turn("third")
    assert len(_contexts(loop)) == 1
    loop.close()
