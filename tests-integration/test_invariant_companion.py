"""The turn/step invariant companion on the real stack (the suite's autouse ``turn_invariants`` fixture).

Every ``Host`` built in this suite carries ``dsh.session_persistence.invariant``'s companion; a recorded violation
fails the test at teardown. These tests show it watches the composed stack and catches a broken order without
undoing the append (which the coordinator then persists like any other event).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from dsh.session_persistence import Host, PersistenceCoordinator, SessionPersistenceCorruptionError, SessionStore
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


async def test_a_broken_order_is_reported_at_append_time_and_still_persisted(
    tmp_path: Path, turn_invariants: HostWatch
) -> None:
    host = Host()
    host.load_entrypoints()
    store = SessionStore(host)  # no check_turns: the store accepts any order, the companion reports it
    backend_cls = host.dsh_session_backends()["jsonl"]
    async with PersistenceCoordinator(host, backend_cls(tmp_path, compression="none")) as persistence:
        session = store.create("broken")
        session.append("turn/start", {"turn": 1})
        session.append("turn/start", {"turn": 2})
        assert [(v.session_id, v.seq, v.rule) for v in turn_invariants.violations] == [("broken", 1, "turn-open")]
        session.append("step/start", {"turn": 2, "step": 1})
        await store.flush(session)
        store.dispose(session)
        # Without the companion the break would surface only here, when the log is read back.
        with pytest.raises(SessionPersistenceCorruptionError, match="rule turn-open"):
            await persistence.inspect("broken")
    stored = await backend_cls(tmp_path, compression="none").load_stored("broken")
    assert stored is not None
    assert types(stored.events) == ["turn/start", "turn/start", "step/start"]  # nothing undone
    assert len(turn_invariants.violations) == 1  # one report per break, no cascade
    # The violation was deliberate: clear it so the fixture's teardown check passes.
    for companion in turn_invariants.companions:
        companion.clear()
