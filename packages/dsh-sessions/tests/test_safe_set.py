"""`pip install dsh-sessions` is the safe set: its requirements are exactly the three distributions an agent needs,
and with them installed an agent from `open_sessions` has the checkpoint policy and the JSONL backend."""

from __future__ import annotations

import importlib.metadata as metadata
import re
from pathlib import Path

import pytest
from dsh.session_persistence import Host
from dsh.session_persistence import open_sessions as core_open_sessions
from dsh.session_persistence.testing import ScriptedAdapter, TextResponse
from dsh.sessions import SAFE_SET, open_sessions

pytestmark = pytest.mark.anyio


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match is not None
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def test_the_distribution_requires_exactly_the_safe_set() -> None:
    required = [_name(r) for r in metadata.requires("dsh-sessions") or [] if "extra ==" not in r]
    assert sorted(required) == sorted(SAFE_SET)
    for dist in SAFE_SET:
        assert metadata.version(dist)


def test_the_pydantic_ai_extra_brings_the_integration() -> None:
    extras = [r for r in metadata.requires("dsh-sessions") or [] if "extra ==" in r]
    assert [(_name(r), r.split("extra ==")[1].strip().strip("'\"")) for r in extras] == [
        ("dsh-session-pydantic-ai", "pydantic-ai")
    ]


def test_the_safe_set_registers_the_policy_and_the_default_backend() -> None:
    host = Host()
    host.load_entrypoints()
    assert host.has_checkpoint_policy()
    assert "jsonl" in host.dsh_session_backends()


def test_open_sessions_is_the_core_front_door() -> None:
    assert open_sessions is core_open_sessions


async def test_an_agent_runs_without_any_opt_out(tmp_path: Path) -> None:
    async with open_sessions(tmp_path) as sessions:
        agent = await sessions.create("safe", ScriptedAdapter([TextResponse("ok")]))
        assert (await agent.run_turn("hello")).text == "ok"
    async with open_sessions(tmp_path) as sessions:
        assert [h.id for h in await sessions.list()] == ["safe"]
