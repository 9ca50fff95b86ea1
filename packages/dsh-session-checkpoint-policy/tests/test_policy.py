"""Checkpoint policy scenarios 1-24 of spec/policy.md §5, on asyncio and trio.

Every test that gates a flush wraps its work in ``anyio.fail_after`` and releases the gate in ``finally`` (the
flush is shielded: a gate left closed would hang the run forever).

Mutation checks (each guard removed from a *copy* of ``_policy.py`` put first on ``PYTHONPATH``, the suite run;
the tests listed are the ones that fail, both backends):

=========================================  ======================================================================
Guard removed                              Tests that catch it
=========================================  ======================================================================
close inner stream on flush failure        test_stream_flush_failure_fails_closed,
                                           test_native_cancel_during_stream_flush
close inner awaitable, tool flush failure  test_inner_wrapper_not_entered_on_failure_or_abort,
                                           test_native_cancel_during_tool_flush, test_agent_without_session_fails_closed,
                                           test_no_never_awaited_warnings
close inner awaitable, tool coop. abort    test_tool_cooperative_abort_during_flush,
                                           test_inner_wrapper_not_entered_on_failure_or_abort,
                                           test_no_never_awaited_warnings
close inner awaitable, pre-step failure    test_pre_step_flush_failure_propagates, test_no_never_awaited_warnings
shield around the flush                    test_native_cancel_during_tool_flush, test_native_cancel_during_stream_flush
post-flush checkpoint_if_cancelled         test_native_cancel_during_tool_flush, test_native_cancel_during_stream_flush,
                                           test_no_never_awaited_warnings
cooperative signal check (tools)           test_tool_cooperative_abort_during_flush,
                                           test_inner_wrapper_not_entered_on_failure_or_abort
flush after the adapter (stream)           test_request_checkpoint_before_adapter, test_stream_flush_failure_fails_closed,
                                           test_native_cancel_during_stream_flush, test_entry_point_plugin_checkpoints, ...
flush after the body (tools)               test_tool_checkpoint_before_body, test_tool_flush_failure_fails_closed,
                                           test_parallel_tool_checkpoints_serialize, test_usage_example_runs, ...
flush after the default (pre-step)         test_pre_step_flushes_before_default, test_pre_step_flush_failure_propagates,
                                           test_entry_point_plugin_checkpoints
=========================================  ======================================================================

Without the inner ``trylast`` wrappers the signal-check and close mutants would be invisible (the tool runtime's
terminal re-checks the signal; an unstarted async generator is collected silently).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import pluggy
import pytest
from anyio.abc import TaskGroup
from dsh.session_checkpoint_policy import NAME, REQUIRES, CheckpointPolicy
from dsh.session_persistence import (
    CancelSignal,
    Deferred,
    Host,
    MemoryBackend,
    ModelRequest,
    PersistenceCoordinator,
    PreStepDecision,
    PreStepInput,
    Session,
    SessionStore,
    ToolExecution,
    ToolExecutionResult,
    aborted_before_dispatch_result,
    error_result,
    hookimpl,
)
from dsh.session_persistence.backend import event_to_builtins
from dsh.session_persistence.events import FinishChunk, FinishReason, StreamChunk, TextDeltaChunk

pytestmark = pytest.mark.anyio

# =================================================================================================
# Rig: a host, a store, a stub persistence (FlushProbe), the three boundary terminals, and inner wrappers
# registered ``trylast`` so they sit *inside* the policy (what makes its own guarantees observable: the
# tool runtime terminal re-checks the signal too, spec/policy.md §4.3).
# =================================================================================================

SESSION_ID = "s1"

#: Generous bound for every test: nothing here waits on real time, this only turns a hang into a failure.
TIMEOUT = 10


class DiskUnavailable(OSError):
    """The failure the stub persistence raises (its message is what tool error results must carry)."""

    def __init__(self) -> None:
        super().__init__("disk unavailable")


class FlushProbe:
    """Stub persistence: one ``session_flush`` implementation that logs, counts, and can gate or fail."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.flushed: list[str] = []
        self.gate: anyio.Event | None = None
        self.error: BaseException | None = None

    @hookimpl
    def session_flush(self, session: Session) -> Awaitable[None]:
        return self._flush(session)

    async def _flush(self, session: Session) -> None:
        self.flushed.append(session.id)
        self.log.append("flush:start")
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            self.log.append("flush:fail")
            raise self.error
        self.log.append("flush:end")


class LlmTerminal:
    """The LLM runtime's terminal: a toy adapter that logs its dispatch and streams two chunks."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    @hookimpl(trylast=True)
    async def llm_stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self.log.append("adapter")
        yield TextDeltaChunk(index=0, text="hello")
        yield FinishChunk(reason=FinishReason(kind="stop"))


class RecordedStream:
    """An async iterator around an inner stream recording whether it was pulled and whether it was closed."""

    def __init__(self, inner: AsyncIterator[StreamChunk], log: list[str]) -> None:
        self._inner = inner
        self.log = log
        self.pulled = False
        self.closed = False

    def __aiter__(self) -> RecordedStream:
        return self

    async def __anext__(self) -> StreamChunk:
        if not self.pulled:
            self.pulled = True
            self.log.append("inner-stream")
        return await self._inner.__anext__()

    async def aclose(self) -> None:
        self.closed = True
        aclose = getattr(self._inner, "aclose", None)
        if aclose is not None:
            await aclose()


class InnerStreamWrapper:
    """A stream wrapper registered ``trylast``: it sits inside the policy; remembers the streams it built."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.built: list[RecordedStream] = []

    @hookimpl(wrapper=True, trylast=True)
    def llm_stream(
        self, request: ModelRequest
    ) -> Generator[None, AsyncIterator[StreamChunk], AsyncIterator[StreamChunk]]:
        inner = yield
        stream = RecordedStream(inner, self.log)
        self.built.append(stream)
        return stream


class RecordedAwaitable:
    """An awaitable around an inner awaitable recording whether it was awaited and whether it was closed."""

    def __init__(self, inner: Awaitable[Any], log: list[str], label: str) -> None:
        self._inner = inner
        self.log = log
        self.label = label
        self.entered = False
        self.closed = False

    def __await__(self) -> Generator[Any, None, Any]:
        self.entered = True
        self.log.append(self.label)
        return (yield from self._inner.__await__())

    def close(self) -> None:
        self.closed = True
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()


class InnerToolWrapper:
    """A ``tools_execute`` wrapper registered ``trylast``, so it sits inside the policy."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.built: list[RecordedAwaitable] = []

    @hookimpl(wrapper=True, trylast=True)
    def tools_execute(
        self, execution: ToolExecution
    ) -> Generator[None, Awaitable[ToolExecutionResult], Awaitable[ToolExecutionResult]]:
        inner = yield
        recorded = RecordedAwaitable(inner, self.log, "inner-wrapper")
        self.built.append(recorded)
        return recorded


class InnerPreStepWrapper:
    """An ``agent_pre_step`` wrapper registered ``trylast`` (inside the policy), returning a ``Deferred``."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.built: list[RecordedAwaitable] = []

    @hookimpl(wrapper=True, trylast=True)
    def agent_pre_step(
        self, agent: object, pre_step: PreStepInput
    ) -> Generator[None, Awaitable[PreStepDecision], Awaitable[PreStepDecision]]:
        inner = yield
        recorded = RecordedAwaitable(inner, self.log, "inner-pre-step")
        self.built.append(recorded)
        return Deferred(_await, recorded)


async def _await(inner: Awaitable[Any]) -> Any:
    return await inner


Body = Callable[[ToolExecution], Awaitable[None]]


class ToolRuntime:
    """A small tool runtime (spec/policy.md §1.5): prepare, dispatch through the chain, post-execute.

    The terminal re-checks the signal (defence in depth) and runs the body. Any ``Exception`` escaping the chain
    becomes a *final* error result that bypasses post-execute; ``BaseException`` (native cancellation) propagates.
    """

    def __init__(self, host: Host, log: list[str]) -> None:
        self.host = host
        self.log = log
        self.deny = False
        self.body: Body | None = None

    @hookimpl(trylast=True)
    async def tools_execute(self, execution: ToolExecution) -> ToolExecutionResult:
        if execution.signal.aborted:
            return aborted_before_dispatch_result()
        self.log.append("body")
        if self.body is not None:
            await self.body(execution)
        return ToolExecutionResult(content=({"type": "text", "text": f"ok {execution.call_id}"},))

    async def run(self, execution: ToolExecution) -> ToolExecutionResult:
        # prepare: abort check, then the pre-execute policy; neither reaches tools_execute.
        if execution.signal.aborted:
            return aborted_before_dispatch_result()
        if self.deny:
            return error_result("denied by policy")
        chain = self.host.tools_execute(execution)
        try:
            result = await chain
        except Exception as exc:
            return error_result(str(exc))  # final: post-execute is bypassed
        self.log.append("post-execute")
        return result


class PreStepTerminal:
    """The agent loop's pre-step terminal: returns the default decision."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    @hookimpl(trylast=True)
    async def agent_pre_step(self, agent: object, pre_step: PreStepInput) -> PreStepDecision:
        self.log.append("default")
        return pre_step.default


@dataclass
class FakeAgent:
    """The duck-typed agent contract the policy relies on: ``.session``."""

    session: Session


@dataclass
class Rig:
    """Host + store + stub persistence + terminals + inner wrappers + the policy, and one live session."""

    log: list[str] = field(default_factory=list)
    with_policy: bool = True
    with_persistence: bool = True

    def __post_init__(self) -> None:
        self.host = Host()
        self.store = SessionStore(self.host)
        self.probe = FlushProbe(self.log)
        if self.with_persistence:
            self.host.register(self.probe, name="probe")
        self.llm = LlmTerminal(self.log)
        self.tools = ToolRuntime(self.host, self.log)
        self.pre = PreStepTerminal(self.log)
        self.inner_stream = InnerStreamWrapper(self.log)
        self.inner_tool = InnerToolWrapper(self.log)
        self.inner_pre = InnerPreStepWrapper(self.log)
        for plugin, name in (
            (self.llm, "llm"),
            (self.tools, "tools"),
            (self.pre, "loop"),
            (self.inner_stream, "inner-stream"),
            (self.inner_tool, "inner-tool"),
            (self.inner_pre, "inner-pre-step"),
        ):
            self.host.register(plugin, name=name)
        self.policy = CheckpointPolicy()
        if self.with_policy:
            self.host.register(self.policy, name=NAME)
        self.session = self.store.create(SESSION_ID)
        self.agent = FakeAgent(self.session)

    # -- boundary values --------------------------------------------------------------------------------

    def request(self, session_id: str | None = SESSION_ID, signal: CancelSignal | None = None) -> ModelRequest:
        return ModelRequest(session_id=session_id, messages=(), config={}, signal=signal or CancelSignal())

    def execution(
        self,
        *,
        call_id: str = "call-1",
        agent: object | None = None,
        top_level: bool = True,
        parent: object | None = None,
        signal: CancelSignal | None = None,
    ) -> ToolExecution:
        return ToolExecution(
            call_id=call_id,
            name="probe_tool",
            arguments={},
            signal=signal or CancelSignal(),
            agent=(agent if agent is not None else self.agent) if top_level else None,
            parent=parent,
            turn=1,
            step=1,
        )

    def pre_step(self, signal: CancelSignal | None = None) -> PreStepInput:
        return PreStepInput(
            messages=(), turn=1, step=1, signal=signal or CancelSignal(), default=PreStepDecision.enter()
        )

    # -- drivers ----------------------------------------------------------------------------------------

    async def drain(self, request: ModelRequest | None = None) -> list[StreamChunk]:
        stream = self.host.llm_stream(request or self.request())
        chunks: list[StreamChunk] = []
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            async for chunk in stream:
                chunks.append(chunk)
        return chunks

    @contextlib.asynccontextmanager
    async def gated_tasks(self) -> AsyncIterator[tuple[TaskGroup, anyio.Event]]:
        """Gate the stub flush and open a task group, all under ``anyio.fail_after(TIMEOUT)``.

        The gate is released in a ``finally`` *inside* the task group: the flush is shielded, so a gate released
        only after the group exits would deadlock a failing (or timed-out) test forever.
        """
        gate = anyio.Event()
        self.probe.gate = gate
        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                try:
                    yield tg, gate
                finally:
                    gate.set()


# =================================================================================================
# Scenarios
# =================================================================================================

CANONICAL_ABORTED_BEFORE_DISPATCH = {
    "content": [{"type": "text", "text": "Error: tool call aborted before dispatch"}],
    "is_error": True,
    "error": {
        "message": "tool call aborted before dispatch",
        "info": {"name": "AbortError", "code": "ABORTED_BEFORE_DISPATCH"},
    },
}


# -------------------------------------------------------------------------------------------------
# llm_stream (scenarios 1-5, 13, 19)


async def test_request_checkpoint_before_adapter() -> None:
    """1. Gated flush: only ``flush:start`` while pending; release: flush, then the adapter."""
    rig = Rig()
    chunks: list[Any] = []

    async def drain() -> None:
        chunks.extend(await rig.drain())

    async with rig.gated_tasks() as (tg, gate):
        tg.start_soon(drain)
        await anyio.wait_all_tasks_blocked()
        assert rig.log == ["flush:start"]
        gate.set()
    assert rig.log == ["flush:start", "flush:end", "inner-stream", "adapter"]
    assert len(chunks) == 2
    assert rig.probe.flushed == [SESSION_ID]


async def test_obtaining_a_stream_runs_nothing() -> None:
    """2. Building the chain without iterating flushes nothing and dispatches nothing."""
    rig = Rig()
    with anyio.fail_after(TIMEOUT):
        stream = rig.host.llm_stream(rig.request())
        await anyio.wait_all_tasks_blocked()
        assert rig.log == []
        assert rig.probe.flushed == []
        await stream.aclose()  # type: ignore[attr-defined]
    assert rig.log == []


@pytest.mark.parametrize("session_id", [None, "unknown"], ids=["no-session-id", "unknown-id"])
async def test_request_pass_through(session_id: str | None) -> None:
    """3/4. No session id, or an id not live in the store: the adapter runs, zero flushes."""
    rig = Rig()
    with anyio.fail_after(TIMEOUT):
        chunks = await rig.drain(rig.request(session_id))
    assert rig.log == ["inner-stream", "adapter"]
    assert rig.probe.flushed == []
    assert len(chunks) == 2


async def test_request_pass_through_for_disposed_session() -> None:
    """4. A detached id (the session was disposed) is not live: pass through."""
    rig = Rig()
    rig.store.dispose(rig.session)
    with anyio.fail_after(TIMEOUT):
        await rig.drain()
    assert rig.log == ["inner-stream", "adapter"]
    assert rig.probe.flushed == []


async def test_stream_flush_failure_fails_closed() -> None:
    """5. The flush raises: the consumer gets that error, the adapter never runs, the inner stream is closed."""
    rig = Rig()
    rig.probe.error = DiskUnavailable()
    with anyio.fail_after(TIMEOUT), pytest.raises(DiskUnavailable, match="disk unavailable"):
        await rig.drain()
    assert rig.log == ["flush:start", "flush:fail"]
    (inner,) = rig.inner_stream.built
    assert not inner.pulled
    assert inner.closed


async def test_unregistering_removes_every_flush() -> None:
    """13 / P18. One drained stream flushes once; after unregistering the policy nothing flushes any more."""
    rig = Rig()
    with anyio.fail_after(TIMEOUT):
        await rig.drain()
        assert rig.probe.flushed == [SESSION_ID]
        rig.host.unregister(rig.policy)
        await rig.drain()
        await rig.tools.run(rig.execution())
        await rig.host.agent_pre_step(rig.agent, rig.pre_step())
    assert rig.probe.flushed == [SESSION_ID]
    assert rig.log.count("adapter") == 2
    assert "body" in rig.log
    assert "default" in rig.log


async def test_native_cancel_during_stream_flush() -> None:
    """19. Native cancel during a gated stream flush: the flush completes, no adapter, no chunk, cancel propagates."""
    rig = Rig()
    chunks: list[Any] = []
    scope = anyio.CancelScope()

    async def consume() -> None:
        with scope:
            stream = rig.host.llm_stream(rig.request())
            try:
                async for chunk in stream:
                    chunks.append(chunk)
            finally:
                await stream.aclose()  # type: ignore[attr-defined]

    async with rig.gated_tasks() as (tg, gate):
        tg.start_soon(consume)
        await anyio.wait_all_tasks_blocked()
        scope.cancel()
        await anyio.wait_all_tasks_blocked()
        # The shield holds: the flush is still pending, not torn.
        assert rig.log == ["flush:start"]
        gate.set()
    assert scope.cancelled_caught
    assert rig.log == ["flush:start", "flush:end"]
    assert chunks == []
    (inner,) = rig.inner_stream.built
    assert not inner.pulled
    assert inner.closed


async def test_no_flush_per_chunk() -> None:
    """P14. A multi-chunk stream is flushed once, before the first pull, not per chunk."""
    rig = Rig()
    with anyio.fail_after(TIMEOUT):
        chunks = await rig.drain()
    assert len(chunks) == 2
    assert rig.probe.flushed == [SESSION_ID]


async def test_stream_flush_failure_from_store_when_session_dies_before_first_pull() -> None:
    """P3. The live session is resolved when the chain is built; if it is disposed before the first pull the
    store refuses the flush and the request fails closed (the adapter never runs)."""
    rig = Rig()
    with anyio.fail_after(TIMEOUT):
        stream = rig.host.llm_stream(rig.request())
        rig.store.dispose(rig.session)
        with pytest.raises(Exception, match="not live"):
            await stream.__anext__()
        await stream.aclose()  # type: ignore[attr-defined]
    assert "adapter" not in rig.log


# -------------------------------------------------------------------------------------------------
# tools_execute (scenarios 6-10, 15-18, 20)


async def test_tool_checkpoint_before_body() -> None:
    """6. Gated flush: only ``flush:start`` while pending; release: flush, inner chain, body; success."""
    rig = Rig()
    results: list[ToolExecutionResult] = []

    async def call() -> None:
        results.append(await rig.tools.run(rig.execution()))

    async with rig.gated_tasks() as (tg, gate):
        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        assert rig.log == ["flush:start"]
        gate.set()
    assert rig.log == ["flush:start", "flush:end", "inner-wrapper", "body", "post-execute"]
    (result,) = results
    assert not result.is_error
    assert result.content == ({"type": "text", "text": "ok call-1"},)
    assert rig.probe.flushed == [SESSION_ID]


async def test_tool_cooperative_abort_during_flush() -> None:
    """7. Cooperative abort while the flush is gated: the canonical ABORTED_BEFORE_DISPATCH result; the inner
    chain is closed, not entered; the body never runs."""
    rig = Rig()
    signal = CancelSignal()
    results: list[ToolExecutionResult] = []

    async def call() -> None:
        results.append(await rig.tools.run(rig.execution(signal=signal)))

    async with rig.gated_tasks() as (tg, gate):
        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        signal.abort("user")
        gate.set()
    (result,) = results
    assert result.to_builtins() == CANONICAL_ABORTED_BEFORE_DISPATCH
    assert rig.log == ["flush:start", "flush:end", "post-execute"]
    (inner,) = rig.inner_tool.built
    assert not inner.entered
    assert inner.closed


async def test_tool_flush_failure_fails_closed() -> None:
    """8/17. The flush raises: a final error result ``Error: disk unavailable``; no body, no post-execute."""
    rig = Rig()
    rig.probe.error = DiskUnavailable()
    with anyio.fail_after(TIMEOUT):
        result = await rig.tools.run(rig.execution())
    assert result.to_builtins() == {
        "content": [{"type": "text", "text": "Error: disk unavailable"}],
        "is_error": True,
    }
    assert rig.log == ["flush:start", "flush:fail"]
    assert "body" not in rig.log
    assert "post-execute" not in rig.log


@pytest.mark.parametrize("case", ["nested", "agent-less"])
async def test_tool_pass_through(case: str) -> None:
    """9/10. A nested call (``parent`` set) or an agent-less call: zero flushes, the body runs."""
    rig = Rig()
    execution = rig.execution(parent=object()) if case == "nested" else rig.execution(top_level=False)
    with anyio.fail_after(TIMEOUT):
        result = await rig.tools.run(execution)
    assert not result.is_error
    assert rig.probe.flushed == []
    assert rig.log == ["inner-wrapper", "body", "post-execute"]


async def test_tool_signal_aborted_before_call_never_flushes() -> None:
    """15. Signal already aborted: the runtime's prepare answers ABORTED_BEFORE_DISPATCH; zero flushes."""
    rig = Rig()
    signal = CancelSignal()
    signal.abort("user")
    with anyio.fail_after(TIMEOUT):
        result = await rig.tools.run(rig.execution(signal=signal))
    assert result.to_builtins() == CANONICAL_ABORTED_BEFORE_DISPATCH
    assert rig.probe.flushed == []
    assert rig.log == []


async def test_tool_denied_never_flushes() -> None:
    """16. Pre-execute policy denies the call: an error result, zero flushes."""
    rig = Rig()
    rig.tools.deny = True
    with anyio.fail_after(TIMEOUT):
        result = await rig.tools.run(rig.execution())
    assert result.is_error
    assert rig.probe.flushed == []
    assert rig.log == []


async def test_native_cancel_during_tool_flush() -> None:
    """18. Native cancel of the caller's scope during a gated tool flush: the flush completes, the body is never
    entered, and the cancellation propagates (never converted into a result)."""
    rig = Rig()
    results: list[ToolExecutionResult] = []
    scope = anyio.CancelScope()

    async def call() -> None:
        with scope:
            results.append(await rig.tools.run(rig.execution()))

    async with rig.gated_tasks() as (tg, gate):
        tg.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        scope.cancel()
        await anyio.wait_all_tasks_blocked()
        assert rig.log == ["flush:start"]  # shielded: not torn
        gate.set()
    assert scope.cancelled_caught
    assert results == []
    assert rig.log == ["flush:start", "flush:end"]
    (inner,) = rig.inner_tool.built
    assert not inner.entered
    assert inner.closed


@pytest.mark.parametrize("path", ["flush-failure", "cooperative-abort"])
async def test_inner_wrapper_not_entered_on_failure_or_abort(path: str) -> None:
    """20. A wrapper registered ``trylast`` (inside the policy) is closed, not entered, on either path."""
    rig = Rig()
    signal = CancelSignal()
    if path == "flush-failure":
        rig.probe.error = DiskUnavailable()
    else:

        async def abort_during_flush(execution: ToolExecution) -> None:
            raise AssertionError("body must not run")

        rig.tools.body = abort_during_flush
        # Abort from inside the flush itself: deterministic, no gate needed.
        original = rig.probe._flush

        async def flush_then_abort(session: Any) -> None:
            await original(session)
            signal.abort("user")

        rig.probe._flush = flush_then_abort  # type: ignore[method-assign]
    with anyio.fail_after(TIMEOUT):
        result = await rig.tools.run(rig.execution(signal=signal))
    assert result.is_error
    (inner,) = rig.inner_tool.built
    assert not inner.entered
    assert inner.closed
    assert "inner-wrapper" not in rig.log
    assert "body" not in rig.log


async def test_agent_without_session_fails_closed() -> None:
    """The duck-typed contract: a top-level call's agent must expose ``.session``; if not, fail closed."""
    rig = Rig()
    with anyio.fail_after(TIMEOUT):
        result = await rig.tools.run(rig.execution(agent=object()))
    assert result.is_error
    assert "session" in result.content[0]["text"]
    assert "body" not in rig.log
    (inner,) = rig.inner_tool.built
    assert inner.closed


# -------------------------------------------------------------------------------------------------
# agent_pre_step (scenarios 11, 12)


async def test_pre_step_flushes_before_default() -> None:
    """11. Exactly one flush, for the agent's session, before the default decision (returned unchanged)."""
    rig = Rig()
    other = rig.store.create("other")
    pre_step = rig.pre_step()
    with anyio.fail_after(TIMEOUT):
        decision = await rig.host.agent_pre_step(FakeAgent(other), pre_step)
    assert decision is pre_step.default
    assert rig.probe.flushed == ["other"]
    assert rig.log == ["flush:start", "flush:end", "inner-pre-step", "default"]


async def test_pre_step_flush_failure_propagates() -> None:
    """12. The flush raises: the call raises it; the inner chain and the default never run."""
    rig = Rig()
    rig.probe.error = DiskUnavailable()
    with anyio.fail_after(TIMEOUT), pytest.raises(DiskUnavailable):
        await rig.host.agent_pre_step(rig.agent, rig.pre_step())
    assert rig.log == ["flush:start", "flush:fail"]
    (inner,) = rig.inner_pre.built
    assert not inner.entered
    assert inner.closed


# -------------------------------------------------------------------------------------------------
# No persistence / no store (P2)


async def test_without_persistence_every_boundary_passes_through() -> None:
    """P2. No ``session_flush`` implementation registered: the policy is inactive at all three boundaries."""
    rig = Rig(with_persistence=False)
    with anyio.fail_after(TIMEOUT):
        await rig.drain()
        await rig.tools.run(rig.execution())
        await rig.host.agent_pre_step(rig.agent, rig.pre_step())
    assert "flush:start" not in rig.log
    assert rig.log == ["inner-stream", "adapter", "inner-wrapper", "body", "post-execute", "inner-pre-step", "default"]
    # The stream was handed through unchanged (no extra generator around it).
    assert rig.host.llm_stream(rig.request()) is rig.inner_stream.built[-1]


async def test_without_store_every_boundary_passes_through() -> None:
    """P2. ``host.sessions`` is ``None``: nothing to flush, pass through."""
    rig = Rig()
    rig.host.sessions = None
    with anyio.fail_after(TIMEOUT):
        await rig.drain()
        await rig.tools.run(rig.execution())
        await rig.host.agent_pre_step(rig.agent, rig.pre_step())
    assert rig.probe.flushed == []


# -------------------------------------------------------------------------------------------------
# Plugin metadata and registration (scenarios 14, 21, 22)


def test_plugin_metadata_and_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """14. Name, declared requirements, and the entry point ``Host.load_entrypoints()`` registers."""
    assert NAME == "session-checkpoint-policy"
    assert CheckpointPolicy.NAME == NAME
    assert REQUIRES == ("llm", "session-persistence", "sessions", "tools")
    dist = importlib.metadata.distribution("dsh-session-checkpoint-policy")
    (entry,) = [ep for ep in dist.entry_points if ep.group == "dsh.session"]
    assert entry.name == NAME
    assert entry.value == "dsh.session_checkpoint_policy._plugin"
    # Only this distribution takes part (the workspace's other entry points are not under test here).
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: [dist])
    host = Host()
    assert host.load_entrypoints() == 1
    plugin = host.get_plugin(NAME)
    assert plugin is not None
    assert {caller.name for caller in host.get_hookcallers(plugin) or ()} == {
        "llm_stream",
        "tools_execute",
        "agent_pre_step",
    }


async def test_entry_point_plugin_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """14. The module the entry point names is a working zero-config policy (same scenarios 1, 6, 11 order)."""
    dist = importlib.metadata.distribution("dsh-session-checkpoint-policy")
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: [dist])
    rig = Rig(with_policy=False)
    assert rig.host.load_entrypoints() == 1
    with anyio.fail_after(TIMEOUT):
        await rig.drain()
        await rig.tools.run(rig.execution())
        await rig.host.agent_pre_step(rig.agent, rig.pre_step())
    assert rig.log == [
        "flush:start",
        "flush:end",
        "inner-stream",
        "adapter",
        "flush:start",
        "flush:end",
        "inner-wrapper",
        "body",
        "post-execute",
        "flush:start",
        "flush:end",
        "inner-pre-step",
        "default",
    ]
    rig.host.unregister(name=NAME)
    with anyio.fail_after(TIMEOUT):
        await rig.drain()
    assert rig.probe.flushed == [SESSION_ID] * 3


class _EagerStream:
    @hookimpl(trylast=True)
    def llm_stream(self, request: Any) -> Any:
        return iter(())


class _EagerTool:
    @hookimpl(trylast=True)
    def tools_execute(self, execution: Any) -> Any:
        return None


class _EagerPreStep:
    @hookimpl(trylast=True)
    def agent_pre_step(self, agent: Any, pre_step: Any) -> Any:
        return None


@pytest.mark.parametrize("plugin_cls", [_EagerStream, _EagerTool, _EagerPreStep])
def test_plain_def_terminal_is_refused(plugin_cls: Callable[[], object]) -> None:
    """21. A plain-``def`` terminal on any boundary hook is refused; the registry is left unchanged."""
    host = Host()
    host.register(CheckpointPolicy(), name=NAME)
    before = host.list_name_plugin()
    with pytest.raises(pluggy.PluginValidationError, match="terminal implementation must be"):
        host.register(plugin_cls())
    assert host.list_name_plugin() == before


@pytest.mark.parametrize(
    "make", [lambda host: LlmTerminal([]), lambda host: ToolRuntime(host, []), lambda host: PreStepTerminal([])]
)
def test_second_async_terminal_is_refused(make: Callable[[Host], object]) -> None:
    """22. A second ``async`` terminal for a boundary hook is refused."""
    host = Host()
    host.register(CheckpointPolicy(), name=NAME)
    host.register(make(host), name="first")
    before = host.list_name_plugin()
    with pytest.raises(pluggy.PluginValidationError, match="exactly one terminal"):
        host.register(make(host), name="second")
    assert host.list_name_plugin() == before


# -------------------------------------------------------------------------------------------------
# Scenario 23: no "never awaited" warnings on any fail/abort path


async def _stream_failure() -> None:
    rig = Rig()
    rig.probe.error = DiskUnavailable()
    with pytest.raises(DiskUnavailable):
        await rig.drain()


async def _tool_failure() -> None:
    rig = Rig()
    rig.probe.error = DiskUnavailable()
    assert (await rig.tools.run(rig.execution())).is_error


async def _tool_abort() -> None:
    rig = Rig()
    signal = CancelSignal()
    original = rig.probe._flush

    async def flush_then_abort(session: Any) -> None:
        await original(session)
        signal.abort("user")

    rig.probe._flush = flush_then_abort  # type: ignore[method-assign]
    result = await rig.tools.run(rig.execution(signal=signal))
    assert result == aborted_before_dispatch_result()


async def _tool_native_cancel() -> None:
    rig = Rig()
    with anyio.CancelScope() as scope:
        original = rig.probe._flush

        async def flush_then_cancel(session: Any) -> None:
            await original(session)
            scope.cancel()

        rig.probe._flush = flush_then_cancel  # type: ignore[method-assign]
        await rig.tools.run(rig.execution())
    assert scope.cancelled_caught
    assert "body" not in rig.log


async def _pre_step_failure() -> None:
    rig = Rig()
    rig.probe.error = DiskUnavailable()
    with pytest.raises(DiskUnavailable):
        await rig.host.agent_pre_step(rig.agent, rig.pre_step())


async def _stream_native_cancel() -> None:
    rig = Rig()
    with anyio.CancelScope() as scope:
        original = rig.probe._flush

        async def flush_then_cancel(session: Any) -> None:
            await original(session)
            scope.cancel()

        rig.probe._flush = flush_then_cancel  # type: ignore[method-assign]
        await rig.drain()
    assert scope.cancelled_caught
    assert "adapter" not in rig.log


async def _abandoned_chains() -> None:
    # Chains built and never run: the consumer closes them (an outer owner abandoning the boundary).
    rig = Rig()
    rig.host.tools_execute(rig.execution()).close()  # type: ignore[attr-defined]
    rig.host.agent_pre_step(rig.agent, rig.pre_step()).close()  # type: ignore[attr-defined]
    await rig.host.llm_stream(rig.request()).aclose()  # type: ignore[attr-defined]


FAIL_AND_ABORT_PATHS: list[Callable[[], Awaitable[None]]] = [
    _stream_failure,
    _stream_native_cancel,
    _tool_failure,
    _tool_abort,
    _tool_native_cancel,
    _pre_step_failure,
    _abandoned_chains,
]


async def test_no_never_awaited_warnings() -> None:
    """23. Every fail/abort path, then ``gc.collect()``: no "coroutine ... was never awaited" warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with anyio.fail_after(TIMEOUT):
            for path in FAIL_AND_ABORT_PATHS:
                await path()
        gc.collect()
        await anyio.lowlevel.checkpoint()
        gc.collect()
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "never awaited" in m], messages


# -------------------------------------------------------------------------------------------------
# Scenario 24: parallel top-level tool checkpoints over the real coordinator


class _RecordingBackend(MemoryBackend):
    """MemoryBackend whose batch appends are logged (start/end), take several scheduling points, and whose first
    append can be held on a gate (so later calls flush while a write is in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.trace: list[tuple[str, int]] = []
        self.first_write_gate: anyio.Event | None = None

    async def append_batch(self, storage: Any, events: Any, *args: Any, **kwargs: Any) -> None:
        self.trace.append(("start", len(events)))
        if len(self.trace) == 1 and self.first_write_gate is not None:
            await self.first_write_gate.wait()
        for _ in range(3):
            await anyio.lowlevel.checkpoint()  # room for a concurrent write to interleave, if one could start
        await super().append_batch(storage, events, *args, **kwargs)
        self.trace.append(("end", len(events)))


async def test_parallel_tool_checkpoints_serialize() -> None:
    """24. Three parallel top-level calls over the real coordinator: backend writes never interleave, no seq is
    duplicated, and each body starts only after its own ``tool/call`` is durable.

    Call 1's checkpoint write is held in flight while calls 2 and 3 record their calls and start their own
    checkpoints, so the coordinator must serialize a second write behind the first.
    """
    host = Host()
    store = SessionStore(host)
    backend = _RecordingBackend()
    log: list[str] = []
    tools = ToolRuntime(host, log)
    host.register(tools, name="tools")
    host.register(CheckpointPolicy(), name=NAME)
    durable_at_body: dict[str, list[str]] = {}
    results: dict[str, ToolExecutionResult] = {}

    async def body(execution: ToolExecution) -> None:
        durable = [event_to_builtins(e) for e in backend.store.events(SESSION_ID)]
        durable_at_body[execution.call_id] = [e["data"]["callId"] for e in durable if e["type"] == "tool/call"]

    tools.body = body
    gate = anyio.Event()
    backend.first_write_gate = gate
    with anyio.fail_after(TIMEOUT):
        async with PersistenceCoordinator(host, backend, write_batch_max_delay_ms=60_000):
            session = store.create(SESSION_ID)
            agent = FakeAgent(session)
            session.append("turn/start", {"turn": 1})
            session.append("step/start", {"turn": 1, "step": 1})

            async def call(call_id: str) -> None:
                session.append(
                    "tool/call", {"turn": 1, "step": 1, "callId": call_id, "name": "probe_tool", "arguments": "{}"}
                )
                execution = ToolExecution(
                    call_id=call_id, name="probe_tool", arguments={}, signal=CancelSignal(), agent=agent, turn=1, step=1
                )
                results[call_id] = await tools.run(execution)

            async with anyio.create_task_group() as tg:
                try:
                    tg.start_soon(call, "c1")
                    await anyio.wait_all_tasks_blocked()
                    assert backend.trace == [("start", 3)]  # call 1's checkpoint write is in flight
                    tg.start_soon(call, "c2")
                    tg.start_soon(call, "c3")
                    await anyio.wait_all_tasks_blocked()
                    assert backend.trace == [("start", 3)]  # calls 2 and 3 wait behind it
                    assert "body" not in log
                finally:
                    gate.set()
            await store.flush(session)
            store.dispose(session)
    assert sorted(results) == ["c1", "c2", "c3"]
    assert all(not r.is_error for r in results.values())
    for call_id in ("c1", "c2", "c3"):
        assert call_id in durable_at_body[call_id], durable_at_body
    # Strictly start/end/start/end: never two batches in flight; the second batch holds calls 2 and 3.
    assert backend.trace == [("start", 3), ("end", 3), ("start", 2), ("end", 2)]
    seqs = [e.seq for e in backend.store.events(SESSION_ID)]
    assert seqs == list(range(5))


def test_public_docstrings_stand_alone() -> None:
    """A user reading help() has no design documents: the public names carry no section references."""
    import inspect

    import dsh.session_checkpoint_policy as face

    docs = [face.__doc__ or ""]
    for name in face.__all__:
        obj = getattr(face, name)
        docs.append(getattr(obj, "__doc__", None) or "" if inspect.isclass(obj) or inspect.isfunction(obj) else "")
        if inspect.isclass(obj):
            docs += [getattr(v, "__doc__", None) or "" for k, v in vars(obj).items() if not k.startswith("_")]
    assert not [doc for doc in docs if "§" in doc]
