"""The checkpoint policy: three new-style wrappers that flush the live session at semantic boundaries.

Each boundary hook returns an *inert* async object; the wrappers below only wrap that object
in the synchronous part around ``yield`` (look-ups, no effects) and do the flush inside the object they return:

* ``llm_stream``: an async generator that flushes before its first pull of the inner stream;
* ``tools_execute``: a :class:`~dsh.session_persistence.Deferred` that flushes before the tool chain
  and body, and answers ``ABORTED_BEFORE_DISPATCH`` when the cooperative signal fired during the flush;
* ``agent_pre_step``: a ``Deferred`` that flushes before the rest of the pre-step chain.

Every flush goes through ``SessionStore.flush`` (never a raw hook broadcast), runs shielded (a native cancel must
not tear a durability barrier) and is followed by ``checkpoint_if_cancelled`` so a native cancel that arrived during
the flush still stops before the inner chain. Native cancellation is re-raised, never turned into a result.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Generator
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
from dsh.session_persistence import (
    CancelSignal,
    Deferred,
    ModelRequest,
    PreStepDecision,
    PreStepInput,
    ToolExecution,
    ToolExecutionResult,
    aborted_before_dispatch_result,
    hookimpl,
)

if TYPE_CHECKING:
    from dsh.session_persistence import Agent, Host, Session, SessionStore
    from dsh.session_persistence.events import StreamChunk

__all__ = ["NAME", "REQUIRES", "CheckpointPolicy"]

#: The plugin name (the entry-point name and the name diagnostics use).
NAME = "session-checkpoint-policy"

#: The services this policy joins (documentation; see :attr:`CheckpointPolicy.REQUIRES`).
REQUIRES: tuple[str, ...] = ("llm", "session-persistence", "sessions", "tools")


# -------------------------------------------------------------------------------------------------
# Look-ups (the synchronous part of each wrapper: cheap and effect-free)


def _active_store(host: Host) -> SessionStore | None:
    """The host's store when checkpoints can mean anything: a store exists and persistence is registered.

    Without a store there is no live session to flush; without a ``session_flush`` implementation (no persistence
    backend) ``SessionStore.flush`` would be a no-op, so the policy passes through instead (rule P2).
    """
    store = host.sessions
    if store is None or not host.has_session_flush():
        return None
    return store


def _agent_session(agent: Agent) -> Session:
    """The agent's session (an :class:`~dsh.session_persistence.hookspecs.Agent` exposes its live session)."""
    return agent.session


# -------------------------------------------------------------------------------------------------
# Effects (inside the returned objects)


async def _checkpoint(store: SessionStore, session: Session) -> None:
    """Flush ``session`` shielded, then honour a native cancel that arrived meanwhile."""
    with anyio.CancelScope(shield=True):
        await store.flush(session)
    # The shield held a native cancel back; surface it now so the inner chain never starts after one.
    await anyio.lowlevel.checkpoint_if_cancelled()


def _close(inner: object) -> None:
    """Dispose of an inner awaitable that will not be awaited (a coroutine or a ``Deferred``)."""
    close = getattr(inner, "close", None)
    if callable(close):
        close()


async def _aclose(inner: object, *, shield: bool) -> None:
    """``await inner.aclose()`` if the stream has one (an ``AsyncIterator`` need not).

    ``shield`` is for the fail-closed path, where the inner stream was never started and must be closed even though
    a native cancel may be pending (closing an unstarted async generator awaits nothing). After iteration started,
    closing is not shielded: a cancelled consumer must not wait on a hanging adapter's cleanup.
    """
    aclose = getattr(inner, "aclose", None)
    if not callable(aclose):
        return
    with anyio.CancelScope(shield=shield):
        result = aclose()
        if inspect.isawaitable(result):
            await result


async def _stream_after_checkpoint(
    inner: AsyncIterator[StreamChunk], store: SessionStore, session: Session
) -> AsyncGenerator[StreamChunk, None]:
    """Flush ``session`` on the first pull, then re-yield ``inner``'s chunks (rule P3/P5).

    No chunk is yielded inside a cancel scope (the flush's shield is left first), and there is no flush per chunk.
    """
    try:
        await _checkpoint(store, session)
    except BaseException:
        # Fail closed: the inner chain (and the adapter at its bottom) never starts.
        await _aclose(inner, shield=True)
        raise
    try:
        async for chunk in inner:
            yield chunk
    finally:
        await _aclose(inner, shield=False)


async def _tool_after_checkpoint(
    inner: Awaitable[ToolExecutionResult], store: SessionStore, agent: Agent, signal: CancelSignal
) -> ToolExecutionResult:
    """Flush the agent's session before the rest of the tool chain and the body (rules P7, P9, P10)."""
    try:
        await _checkpoint(store, _agent_session(agent))
    except BaseException:
        _close(inner)
        raise
    if signal.aborted:
        # Cooperative abort during the flush: the call is durable but must not dispatch.
        _close(inner)
        return aborted_before_dispatch_result()
    return await inner


async def _pre_step_after_checkpoint(
    inner: Awaitable[PreStepDecision], store: SessionStore, agent: Agent
) -> PreStepDecision:
    """Flush the agent's session before the rest of the pre-step chain (rules P11, P12)."""
    try:
        await _checkpoint(store, _agent_session(agent))
    except BaseException:
        _close(inner)
        raise
    return await inner


# -------------------------------------------------------------------------------------------------
# The plugin


class CheckpointPolicy:
    """Semantic durability checkpoints for a persisted agent.

    Register one instance beside a persistence backend (or let ``Host.load_entrypoints()`` register the
    ``session-checkpoint-policy`` entry point, which is the same thing; do not do both)::

        host.register(CheckpointPolicy(), name=NAME)

    It flushes the live session, through ``host.sessions.flush(session)``:

    * before a model stream for a live session is first pulled (``llm_stream``);
    * before a top-level tool call's chain and body run (``tools_execute``; nested and agent-less calls pass);
    * before each step's pre-step chain (``agent_pre_step``).

    A failed flush is fail-closed: the adapter / tool body / rest of the pre-step chain never runs and the error
    propagates. Without ``host.sessions`` or without any ``session_flush`` implementation the policy passes through.
    The policy holds no state; unregistering it removes every flush.
    """

    #: The plugin name.
    NAME = NAME
    #: The services the policy joins: the model runtime, a persistence backend, the session store, the tools.
    REQUIRES = REQUIRES

    @hookimpl(wrapper=True)
    def llm_stream(
        self, host: Host, request: ModelRequest
    ) -> Generator[None, AsyncIterator[StreamChunk], AsyncIterator[StreamChunk]]:
        """Wrap the stream so the live session named by ``request.session_id`` is flushed before the first pull."""
        inner = yield
        store = _active_store(host)
        if store is None or request.session_id is None:
            return inner
        session = store.get(request.session_id)
        if session is None:
            # Detached or unknown id: nothing live to checkpoint (rule P4).
            return inner
        return _stream_after_checkpoint(inner, store, session)

    @hookimpl(wrapper=True)
    def tools_execute(
        self, host: Host, execution: ToolExecution
    ) -> Generator[None, Awaitable[ToolExecutionResult], Awaitable[ToolExecutionResult]]:
        """Wrap a top-level call so its agent's session is flushed before the chain and body run."""
        inner = yield
        if execution.agent is None or execution.parent is not None:
            # Agent-less, or a nested transport sub-dispatch reusing the outer call's checkpoint (rule P8).
            return inner
        store = _active_store(host)
        if store is None:
            return inner
        return Deferred(_tool_after_checkpoint, inner, store, execution.agent, execution.signal)

    @hookimpl(wrapper=True)
    def agent_pre_step(
        self, host: Host, agent: Agent, pre_step: PreStepInput
    ) -> Generator[None, Awaitable[PreStepDecision], Awaitable[PreStepDecision]]:
        """Wrap the pre-step chain so the agent's session is flushed before it runs."""
        inner = yield
        store = _active_store(host)
        if store is None:
            return inner
        return Deferred(_pre_step_after_checkpoint, inner, store, agent)

    def __repr__(self) -> str:
        return f"<CheckpointPolicy {NAME!r}>"
