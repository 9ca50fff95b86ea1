"""`dsh-sessions list` counts user turns for an Agents SDK session: two runs (each a tool call and an answer, so
two model responses each) show TURNS 2, not the four response turns the log holds.

The count is the core's CLI: it counts user turns since core 0.3; with a 0.2 core (which this package's range
admits, and tools/compat-matrix installs) the same log lists the four response turns, and nothing else differs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from dsh.session_openai_agents import DshSession, DurableRunHooks
from dsh.session_persistence import open_sessions
from dsh.session_persistence.events import TurnStart

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the SDK's Runner runs on asyncio only
async def test_two_runs_list_as_two_turns(tmp_path: Path) -> None:
    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    root = tmp_path / "sessions"
    async with open_sessions(root) as sessions, DshSession(sessions, "sdk") as session:
        for n in (1, 2):
            model = ScriptedModel(
                [[function_call("add", {"a": n, "b": n}, call_id=f"c{n}")], [assistant_message(str(2 * n))]]
            )
            agent = Agent(name="calc", model=model, tools=[add])
            await Runner.run(agent, f"{n} + {n}?", session=session, hooks=DurableRunHooks(session))
        events = sessions.store.get("sdk").events  # type: ignore[union-attr]
        assert len([e for e in events if type(e) is TurnStart]) == 4  # one per model response
    (listed,) = list_json(root)["sessions"]
    assert listed["turns"] == (2 if core_minor() >= (0, 3) else 4)


def core_minor() -> tuple[int, int]:
    """The installed core's (major, minor)."""
    major, minor = metadata.version("dsh-session-persistence").split(".")[:2]
    return int(major), int(minor)


def list_json(root: Path) -> dict[str, Any]:
    cli = os.path.join(os.path.dirname(sys.executable), "dsh-sessions")
    done = subprocess.run(
        [cli, "--root", str(root), "list", "--json"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document
