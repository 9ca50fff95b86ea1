"""The turn/step invariant companion on the real stack (the suite's autouse ``turn_invariants`` fixture).

Every ``Host`` built in this suite carries ``dsh.session_persistence.invariant``'s companion; a recorded violation
fails the test at teardown. These tests show it watches the composed stack and reports a broken order without
undoing the append on a session no coordinator holds; a session a coordinator holds refuses the event instead.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore, TurnInvariantError
from dsh.session_persistence.invariant import HostWatch, find_companion
from dsh.session_persistence.loop import AgentLoop
from dsh.session_persistence.testing import ScriptedAdapter, ScriptedTool, TextResponse, ToolCallResponse
from loop_rig import open_stack, types

pytestmark = pytest.mark.anyio


async def test_the_stack_host_carries_the_companion_and_a_real_turn_is_clean(
    tmp_path: Path, turn_invariants: HostWatch
) -> None:
    async with open_stack(tmp_path) as stack:
        companion = find_companion(stack.host)
        assert companion is not None and companion in turn_invariants.companions
        adapter = ScriptedAdapter([ToolCallResponse((("c1", "add", {"a": 2, "b": 3}),)), TextResponse("5")])
        add = ScriptedTool("add", output=lambda args, call_id: str(args["a"] + args["b"]))
        loop = AgentLoop(stack.host, stack.store, adapter, [add], provider="scripted", model="m1", session_id="inv")
        with anyio.fail_after(10):
            await loop.run_turn("What is 2 + 3?")
        assert "tool/result" in types(loop.session.events)
        loop.close()
    assert companion.violations == ()


async def test_a_broken_order_is_reported_in_memory_and_refused_where_it_would_be_persisted(
    tmp_path: Path, turn_invariants: HostWatch
) -> None:
    host = Host()
    host.load_entrypoints()
    store = SessionStore(host)  # no check_turns: a session no coordinator holds accepts any order
    scratch = store.create("scratch")
    scratch.append("turn/start", {"turn": 1})
    scratch.append("turn/start", {"turn": 2})
    assert [(v.session_id, v.seq, v.rule) for v in turn_invariants.violations] == [("scratch", 1, "turn-open")]
    store.dispose(scratch)  # never persisted: no coordinator was running
    backend_cls = host.dsh_session_backends()["jsonl"]
    async with PersistenceCoordinator(host, backend_cls(tmp_path, compression="none")) as persistence:
        session = store.create("broken")
        session.append("turn/start", {"turn": 1})
        # Held by a coordinator, the session refuses what the loader would refuse, before it is written (it used to
        # be acknowledged, and the whole session then loaded as corrupt).
        with pytest.raises(TurnInvariantError, match="rule turn-open"):
            session.append("turn/start", {"turn": 2})
        session.append("step/start", {"turn": 1, "step": 1})
        await store.flush(session)
        store.dispose(session)
        inspection = await persistence.inspect("broken")
    assert types(inspection.events)[:2] == ["turn/start", "step/start"]
    stored = await backend_cls(tmp_path, compression="none").load_stored("broken")
    assert stored is not None
    assert types(stored.events) == ["turn/start", "step/start"]
    assert len(turn_invariants.violations) == 1  # the refused append was never committed, so never reported
    # The violation was deliberate: clear it so the fixture's teardown check passes.
    for companion in turn_invariants.companions:
        companion.clear()
