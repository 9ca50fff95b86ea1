"""Ids that cannot name a session (empty, a lone surrogate) get one typed error from every entry, before any I/O.

They used to reach the JSONL backend's path encoder and come back as a bare ``ValueError`` (``delete`` alone was
typed). The rule is ``_model/ids.check_session_id``; these tests go through the public entries.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from dsh.session_persistence import (
    Host,
    LifecycleArgumentError,
    PersistenceCoordinator,
    Session,
    SessionIdError,
    SessionPersistenceError,
    SessionStore,
    open_sessions,
)
from dsh.session_persistence.testing import ScriptedAdapter, TextResponse
from dsh.session_persistence_jsonl import JsonlBackend  # the backend whose path encoder used to raise ValueError

pytestmark = pytest.mark.anyio

BAD_IDS = ["", "a\ud800b", "\udcff"]


def model() -> ScriptedAdapter:
    return ScriptedAdapter([TextResponse("hi")], provider="p", model="m")


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_every_coordinator_and_front_door_entry_refuses_a_bad_id_typed(tmp_path: Path, bad: str) -> None:
    async with open_sessions(tmp_path, require_checkpoint_policy=False) as sessions:
        p = sessions.persistence

        async def iterate() -> None:
            async for _ in p.iter_events(bad):
                pass

        entries: dict[str, Callable[[], Awaitable[Any]]] = {
            "load": lambda: p.load(bad),
            "inspect": lambda: p.inspect(bad),
            "read_from": lambda: p.read_from(bad, 0),
            "iter_events": iterate,
            "read_raw": lambda: p.read_raw(bad),
            "append": lambda: p.append(bad, [{"type": "user/message", "seq": 0, "time": 1, "data": {}}]),
            "create": lambda: p.create({"version": 1, "id": bad, "createdAt": 1}),
            "delete": lambda: p.delete(bad),
            "compact": lambda: p.compact(bad),
            "sessions.create": lambda: sessions.create(bad, model()),
            "sessions.resume": lambda: sessions.resume(bad, model()),
            "sessions.resume_or_create": lambda: sessions.resume_or_create(bad, model()),
        }
        for name, entry in entries.items():
            with pytest.raises(SessionIdError) as raised:
                await entry()
            assert isinstance(raised.value, SessionPersistenceError), name
            assert isinstance(raised.value, LifecycleArgumentError), name  # what delete('') raised before
        assert await p.list() == []  # nothing was written


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_live_session_and_a_fork_refuse_a_bad_id(bad: str) -> None:
    with pytest.raises(SessionIdError):
        Session(bad)
    store = SessionStore(Host())
    with pytest.raises(SessionIdError):
        store.create(bad)
    parent = store.create("parent")
    with pytest.raises(SessionIdError):
        store.fork(parent, child_id=bad)
    assert [s.id for s in store.list()] == ["parent"]


async def test_a_coordinator_over_jsonl_refuses_before_the_backend_sees_the_id(tmp_path: Path) -> None:
    async with PersistenceCoordinator(Host(), JsonlBackend(tmp_path, compression="none")) as p:
        with pytest.raises(SessionIdError, match="lone surrogate"):
            await p.load("x\ud800")
    assert not any(name.startswith("x") for _, dirs, files in os.walk(tmp_path) for name in dirs + files)
