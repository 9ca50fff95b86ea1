"""The integration rig: a host composed from installed plugins, a JSONL-backed coordinator and probes.

``open_stack`` builds what a user would: ``Host()`` + ``load_entrypoints()`` (JSONL backend and checkpoint policy
found through the ``dsh.session`` entry-point group), a ``SessionStore``, the backend looked up by name and a
``PersistenceCoordinator``. Probes registered beside them record what the assertions need:

* :class:`FlushProbe`: a ``session_flush`` implementation logging the log length at each flush start ("durable
  prefix at each boundary"); it can gate the Nth flush or fail from the Nth flush on;
* :class:`ErrorProbe`: records ``agent_error`` notifications.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from dsh.session_persistence import (
    Host,
    PersistenceCoordinator,
    Session,
    SessionStore,
    aborted_before_dispatch_result,
    hookimpl,
)
from dsh.session_persistence.backend import event_to_builtins
from dsh.session_persistence.events import SessionEvent
from dsh.session_persistence.loop import AgentLoop, TurnResult
from dsh.session_persistence.testing import ScriptedAdapter

POLICY_PLUGIN = "session-checkpoint-policy"
LONG_WINDOW_MS = 600_000


class DiskUnavailable(OSError):
    """The failure the flush probe injects."""

    def __init__(self) -> None:
        super().__init__("disk unavailable")


class FlushProbe:
    """Logs ``len(session.events)`` at each flush start; gates flush number ``gate_at``; fails from ``fail_from``."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.gate_at: int | None = None
        self.gate = anyio.Event()
        self.gated = anyio.Event()
        self.fail_from: int | None = None

    @hookimpl
    def session_flush(self, session: Session) -> Awaitable[None]:
        return self._flush(session)

    async def _flush(self, session: Session) -> None:
        self.starts.append(len(session.events))
        number = len(self.starts)
        if number == self.gate_at:
            self.gated.set()
            await self.gate.wait()
        if self.fail_from is not None and number >= self.fail_from:
            raise DiskUnavailable


class ErrorProbe:
    """Records ``agent_error`` notifications as ``(turn, step, error)``."""

    def __init__(self) -> None:
        self.errors: list[tuple[int, int, Exception]] = []

    @hookimpl
    def agent_error(self, turn: int, step: int, error: Exception) -> None:
        self.errors.append((turn, step, error))


@dataclass
class Stack:
    host: Host
    store: SessionStore
    backend: Any
    coordinator: PersistenceCoordinator
    flushes: FlushProbe
    errors: ErrorProbe
    extra: list[object] = field(default_factory=list)

    async def durable(self, session_id: str) -> list[SessionEvent]:
        """What the backend holds for ``session_id`` right now (no repair)."""
        stored = await self.backend.load_stored(session_id)
        return [] if stored is None else list(stored.events)

    async def durable_types(self, session_id: str) -> list[str]:
        return [e.type for e in await self.durable(session_id)]


@asynccontextmanager
async def open_stack(
    root: Path, *, policy: bool = True, window_ms: int = LONG_WINDOW_MS, probe: bool = True
) -> AsyncIterator[Stack]:
    """A fresh host on ``root`` (JSONL, no compression); ``policy=False`` unregisters the discovered policy."""
    host = Host()
    host.load_entrypoints()
    assert host.get_plugin(POLICY_PLUGIN) is not None, "the checkpoint policy is not installed as an entry point"
    if not policy:
        host.unregister(name=POLICY_PLUGIN)
    store = SessionStore(host, check_turns=True)
    backend_cls: Any = host.dsh_session_backends()["jsonl"]
    backend = backend_cls(root, compression="none")
    flushes = FlushProbe()
    errors = ErrorProbe()
    if probe:
        host.register(flushes, name="flush-probe")
    host.register(errors, name="error-probe")
    async with PersistenceCoordinator(host, backend, write_batch_max_delay_ms=window_ms) as coordinator:
        yield Stack(host, store, backend, coordinator, flushes, errors)


def types(events: Any) -> list[str]:
    return [e.type for e in events]


def data(event: SessionEvent | TurnResult) -> Any:
    """The JSON payload of an event (of a turn result: of its ``turn/end`` event)."""
    return event_to_builtins(event.event if isinstance(event, TurnResult) else event)["data"]


def of_type(events: Any, event_type: str) -> list[SessionEvent]:
    return [e for e in events if e.type == event_type]


def turn_end_reason(events: Any) -> Any:
    return data(of_type(events, "turn/end")[-1])["reason"]


async def wait_until(predicate: Any) -> None:
    """Poll ``predicate()`` every millisecond until true (bounded: a hang fails the test after 10 s).

    Polling on purpose: the predicates read state of the loop and the session that has no event to wait on.
    """
    with anyio.fail_after(10):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.001)


# The agent-loop tests' shared pieces (test_agent_loop*.py).

SID = "work"
ABORTED_BEFORE_DISPATCH = aborted_before_dispatch_result().to_builtins()


def make_loop(stack: Stack, adapter: ScriptedAdapter, tools: list[Any] | None = None, **kw: Any) -> AgentLoop:
    return AgentLoop(
        stack.host, stack.store, adapter, tools or [], provider="scripted", model="m1", session_id=SID, **kw
    )


def result_of(event: SessionEvent) -> dict[str, Any]:
    """A tool/result's result block as ``{"content", "is_error"}`` (comparable with ``to_builtins()``)."""
    block = data(event)["message"]["content"][0]
    return {"content": block["content"], "is_error": block.get("isError", False)}


class ReadingTool:
    """A tool whose body reads the durable log at dispatch (scenario 27)."""

    parallel = False

    def __init__(self, stack: Stack, name: str = "probe") -> None:
        self.stack = stack
        self.name = name
        self.seen: list[list[str]] = []

    async def run(self, arguments: Any, call_id: str, signal: Any) -> str:
        self.seen.append(await self.stack.durable_types(SID))
        return "read"
