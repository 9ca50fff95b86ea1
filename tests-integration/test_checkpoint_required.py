"""An agent on persisted sessions refuses to start without a checkpoint policy, unless the caller opts out.

The in-process half runs on hosts assembled by hand (the JSONL backend registered, the policy not); the fresh-venv
half (test_fresh_venv_refuses.py) proves the same on a real interpreter with only the core and the JSONL wheels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dsh.session_checkpoint_policy import CheckpointPolicy
from dsh.session_persistence import (
    CheckpointPolicyMissingError,
    Host,
    PersistenceCoordinator,
    SessionPersistenceError,
    SessionStore,
    open_sessions,
)
from dsh.session_persistence.loop import AgentLoop
from dsh.session_persistence.testing import ScriptedAdapter, TextResponse
from dsh.session_persistence_jsonl import JsonlBackend

pytestmark = pytest.mark.anyio

HINT = "pip install dsh-session-checkpoint-policy"


def bare_host() -> Host:
    """A host with the JSONL backend's plugin only: what `pip install dsh-session-persistence-jsonl` registers."""
    host = Host()
    host.load_entrypoints()
    host.unregister(name="session-checkpoint-policy")
    assert not host.has_checkpoint_policy()
    return host


def stored(root: Path) -> dict[str, bytes]:
    """Every stored file's bytes but the lease's lock files (what a refused agent must leave alone)."""
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file() and "lock" not in p.name}


def adapter() -> ScriptedAdapter:
    return ScriptedAdapter([TextResponse("hi")], provider="scripted", model="demo")


def test_error_is_typed_and_names_the_install() -> None:
    assert issubclass(CheckpointPolicyMissingError, SessionPersistenceError)
    assert HINT in str(CheckpointPolicyMissingError())


def test_policy_is_recognised_by_shape() -> None:
    host = Host()
    assert not host.has_checkpoint_policy()
    host.register(CheckpointPolicy(), name="my-own-policy")
    assert host.has_checkpoint_policy()
    full = Host()
    full.load_entrypoints()
    assert full.has_checkpoint_policy()


async def test_agent_loop_refuses_on_a_persisting_host(tmp_path: Path) -> None:
    host = bare_host()
    store = SessionStore(host)
    async with PersistenceCoordinator(host, JsonlBackend(tmp_path)):
        with pytest.raises(CheckpointPolicyMissingError, match=HINT):
            AgentLoop(host, store, adapter(), session_id="s1")
        assert store.get("s1") is None  # refused before a session was made
    assert stored(tmp_path) == {}


async def test_agent_loop_refuses_at_run_turn_when_persistence_came_later(tmp_path: Path) -> None:
    host = bare_host()
    store = SessionStore(host)
    agent = AgentLoop(host, store, adapter(), session_id="s1")  # no persistence yet: nothing to checkpoint
    async with PersistenceCoordinator(host, JsonlBackend(tmp_path)):
        with pytest.raises(CheckpointPolicyMissingError, match=HINT):
            await agent.run_turn("hello")
        store.dispose(agent.session)
    assert stored(tmp_path) == {}


async def test_open_sessions_refuses_create_resume_and_fork(tmp_path: Path) -> None:
    async with open_sessions(tmp_path) as sessions:  # the full install: stores one session to resume
        agent = await sessions.create("s1", adapter())
        await agent.run_turn("hello")
    before = stored(tmp_path)
    async with open_sessions(tmp_path, host=bare_host()) as sessions:
        assert [h.id for h in await sessions.list()] == ["s1"]  # reading needs no policy
        with pytest.raises(CheckpointPolicyMissingError, match=HINT):
            await sessions.create("s2", adapter())
        with pytest.raises(CheckpointPolicyMissingError, match=HINT):
            await sessions.resume_or_create("s1", adapter())
        with pytest.raises(CheckpointPolicyMissingError, match=HINT):
            await sessions.fork("s1", adapter(), turn=1)
    assert stored(tmp_path) == before


async def test_explicit_opt_out_runs_without_checkpoints(tmp_path: Path) -> None:
    async with open_sessions(tmp_path, host=bare_host(), require_checkpoint_policy=False) as sessions:
        agent = await sessions.create("s1", adapter())
        result = await agent.run_turn("hello")
        assert result.text == "hi"
    host = bare_host()
    async with PersistenceCoordinator(host, JsonlBackend(tmp_path / "manual")):
        loop = AgentLoop(host, SessionStore(host), adapter(), session_id="s2", require_checkpoint_policy=False)
        assert (await loop.run_turn("hello")).text == "hi"
        loop.close()


async def test_without_persistence_there_is_nothing_to_checkpoint() -> None:
    host = Host()
    loop = AgentLoop(host, SessionStore(host), adapter(), session_id="mem")
    assert (await loop.run_turn("hello")).text == "hi"
