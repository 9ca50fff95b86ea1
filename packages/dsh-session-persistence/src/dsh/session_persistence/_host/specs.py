"""Hook specifications for dsh sessions plugins (the public face is :mod:`dsh.session_persistence.hookspecs`).

Every hook of the project is specified here, once: pluggy refuses a second specification of the same
hook name, so backends, the checkpoint policy and the agent runtimes import :data:`hookspec`'s sibling
``hookimpl`` (from :mod:`dsh.session_persistence`) and implement these hooks; they never declare their
own. The :class:`~dsh.session_persistence.Host` adds these specs and is the only caller: nobody calls
``pm.hook.<name>(...)`` directly, the host offers one typed method per hook and enforces the rules
written in each docstring below.

Hooks fall into three groups:

* **session lifecycle** (emitted by ``SessionStore``): ``session_created``, ``session_event``,
  ``session_flush``, ``session_disposed``;
* **agent boundaries** (``llm_stream``, ``tools_execute``, ``agent_pre_step``): ``firstresult`` hooks
  that return an *inert* async object. Exactly one terminal implementation (registered ``trylast`` by
  the runtime that owns the boundary, and necessarily ``async``), every other implementation a
  new-style wrapper (``wrapper=True``) that wraps the object it receives from ``yield``;
* **discovery and notifications**: ``dsh_session_backends``, ``agent_error``, ``agent_status``.

Every hook receives ``host``, the calling host, as its first argument. pluggy passes an implementation
only the arguments it names, so implementations that do not need it leave it out; module-level plugins
loaded from an entry point (which have no constructor to receive the host) use it to reach
``host.sessions``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import pluggy

if TYPE_CHECKING:
    from .._model.events import SessionEvent, StreamChunk
    from .boundaries import ModelRequest, PreStepDecision, PreStepInput, ToolExecution, ToolExecutionResult
    from .host import Host
    from .session import Session

__all__ = [
    "PROJECT_NAME",
    "Agent",
    "agent_error",
    "agent_pre_step",
    "agent_status",
    "dsh_session_backends",
    "hookspec",
    "llm_stream",
    "session_created",
    "session_disposed",
    "session_event",
    "session_flush",
    "tools_execute",
]

#: The pluggy project name, shared by the spec and impl markers and used as the entry-point group.
PROJECT_NAME = "dsh.session"

#: Marker for the specifications below. Plugins use the matching ``hookimpl`` marker instead.
hookspec = pluggy.HookspecMarker(PROJECT_NAME)


@runtime_checkable
class Agent(Protocol):
    """What the agent hooks (``agent_pre_step``, ``agent_error``, ``agent_status``) receive as ``agent``.

    The agent driving a turn exposes its live session, so a plugin (the checkpoint policy, say) can reach the
    session the turn appends to. The reference :class:`~dsh.session_persistence.AgentLoop` is one.
    """

    @property
    def session(self) -> Session:
        """The live session this agent appends to."""
        ...


# -------------------------------------------------------------------------------------------------
# Session lifecycle hooks (emitted by SessionStore)
# -------------------------------------------------------------------------------------------------


@hookspec
def session_created(host: Host, session: Session) -> None:
    """A new live session is about to be published by the store.

    :param host: The calling :class:`~dsh.session_persistence.Host` (name it only if needed).
    :param session: The session, already carrying its header and any seed events.

    A raising implementation **vetoes** publication: the exception propagates to the caller of
    ``SessionStore.create``, later implementations are not called, and the store rolls the session
    back with a paired :func:`session_disposed`.

    Use in plugins
    ==============

    Backends attach here (open or create storage, start a write-behind controller). Keep it quick:
    this hook is synchronous.
    """


@hookspec
def session_event(host: Host, session: Session, event: SessionEvent) -> None:
    """An event was committed to ``session``'s log.

    :param host: The calling :class:`~dsh.session_persistence.Host` (name it only if needed).
    :param session: The session the event was appended to.
    :param event: The committed event (frozen; ``event.seq`` is its position in the log).

    Called synchronously, after the commit: the append is already final. Each implementation is
    isolated: a raising one is logged as ``session "<id>": session/event listener threw: <err>``, never
    undoes the append and never stops later implementations. Wrappers are refused for this hook (the
    host calls each implementation on its own to isolate it).

    Use in plugins
    ==============

    Must not block and must not await: copy the event somewhere (the coordinator hands it to the
    session's write-behind controller) and return. Returning an awaitable is an error (it is closed
    and logged, never awaited).
    """


@hookspec
def session_flush(host: Host, session: Session) -> Awaitable[object] | None:
    """Make everything appended to ``session`` so far durable.

    :param host: The calling :class:`~dsh.session_persistence.Host` (name it only if needed).
    :param session: The live session to flush.
    :return: An awaitable that completes once the session's events up to now are durable, or
        ``None`` when there is nothing to do.

    ``SessionStore.flush`` starts the awaitables of every implementation concurrently, waits for all
    of them to settle, then raises the failure of the **first-registered** failing implementation.
    This is the durability barrier the checkpoint policy relies on. Wrappers are refused for this
    hook (each implementation is called on its own so its result keeps its registration slot).

    Use in plugins
    ==============

    Do no I/O in the synchronous part; return a coroutine (or other awaitable) that does it.
    """


@hookspec
def session_disposed(host: Host, session: Session) -> None:
    """``session`` is being retired from the store (or its creation was vetoed).

    :param host: The calling :class:`~dsh.session_persistence.Host` (name it only if needed).
    :param session: The session being disposed.

    Each implementation is isolated like :func:`session_event`: a raising one is logged as
    ``session "<id>": session/disposed listener threw: <err>`` and never stops later ones. Wrappers
    are refused for this hook.

    Use in plugins
    ==============

    Release per-session resources. A backend schedules its final drain here.
    """


# -------------------------------------------------------------------------------------------------
# Agent boundary hooks (firstresult; one async terminal; everything else is a wrapper)
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def llm_stream(host: Host, request: ModelRequest) -> AsyncIterator[StreamChunk] | None:
    """Return an **unstarted** async iterator of the model's stream chunks for ``request``.

    :param host: The calling :class:`~dsh.session_persistence.Host` (name it only if needed).
    :param request: The model request (messages, config, system prompt, tool schemas, session id
        and the turn's cancellation signal).
    :return: The stream. Obtaining it must perform no work; the first pull runs the chain.

    Stops at first non-None result. Exactly one terminal implementation exists, registered
    ``trylast=True`` by the LLM runtime; it must be an async generator function (the host refuses
    anything else at registration, and refuses a second terminal). It converts adapter failures into
    a final ``finish`` chunk.

    Use in plugins
    ==============

    Implement a new-style wrapper::

        @hookimpl(wrapper=True)
        def llm_stream(request):
            inner = yield
            return my_async_generator(inner, request)

    The code around ``yield`` must be pure and cheap (look-ups only); all effects go inside the
    returned async generator. Do not ``yield`` a chunk while inside a cancel scope or task group.
    A wrapper that declines to run ``inner`` must ``await inner.aclose()``. Wrapper exceptions
    propagate out of the iteration (they are not converted into error chunks).
    """


@hookspec(firstresult=True)
def tools_execute(host: Host, execution: ToolExecution) -> Awaitable[ToolExecutionResult] | None:
    """Return an **unstarted** awaitable that dispatches one tool call and yields its result.

    :param host: The calling :class:`~dsh.session_persistence.Host` (name it only if needed).
    :param execution: The call (id, name, parsed arguments, agent, parent token, signal, turn, step).
    :return: The awaitable result. Obtaining it must perform no work.

    Stops at first non-None result. Exactly one terminal implementation exists, registered
    ``trylast=True`` by the tool runtime; it must be an ``async def`` (coroutine function). The tool
    runtime awaits the chain and converts any ``Exception`` escaping it into a final error result.

    Use in plugins
    ==============

    Implement a new-style wrapper returning a :class:`~dsh.session_persistence.Deferred`::

        @hookimpl(wrapper=True)
        def tools_execute(execution):
            inner = yield
            return Deferred(run_after_my_check, inner, execution)

    A wrapper that declines to run ``inner`` must call ``inner.close()`` (``Deferred.close``
    propagates down the chain so nothing warns "coroutine was never awaited").
    """


@hookspec(firstresult=True)
def agent_pre_step(host: Host, agent: Agent, pre_step: PreStepInput) -> Awaitable[PreStepDecision] | None:
    """Return an **unstarted** awaitable of the decision taken before a step's request derivation.

    :param host: The calling :class:`~dsh.session_persistence.Host` (name it only if needed).
    :param agent: The agent running the turn.
    :param pre_step: The claimed messages, turn, step, signal and the loop's ``default`` decision
        (``enter`` with the claimed messages).
    :return: The awaitable decision (``enter`` with messages, or ``reject``).

    Stops at first non-None result. Exactly one terminal implementation exists, registered
    ``trylast=True`` by the agent loop; it is an ``async def`` returning ``pre_step.default``. A
    raising chain ends the turn with an ``error`` reason before ``step/start``.

    Use in plugins
    ==============

    Same wrapper shape as :func:`tools_execute` (return a ``Deferred`` around ``inner``). Compaction
    and the checkpoint policy live here.
    """


# -------------------------------------------------------------------------------------------------
# Backend discovery
# -------------------------------------------------------------------------------------------------


@hookspec
def dsh_session_backends(host: Host) -> list[type[object]]:
    """Return the session backend classes this plugin provides.

    :param host: The calling :class:`~dsh.session_persistence.Host` (name it only if needed).
    :return: Backend classes, each with a class attribute ``NAME`` (``"memory"``, ``"jsonl"``...).

    The host merges the lists of every implementation into one mapping by ``NAME``; two different
    classes with the same ``NAME`` are an error.

    Use in plugins
    ==============

    Declare your plugin module under the ``dsh.session`` entry-point group so
    ``Host.load_entrypoints()`` finds it once the distribution is installed.
    """
    raise NotImplementedError  # pragma: no cover - specification only


# -------------------------------------------------------------------------------------------------
# Agent notifications (called by the reference loop)
# -------------------------------------------------------------------------------------------------


@hookspec
def agent_error(host: Host, agent: Agent, turn: int, step: int, error: Exception) -> None:
    """The agent's driver contained an error at its boundary (reported once per failure).

    :param host: The calling :class:`~dsh.session_persistence.Host` (name it only if needed).
    :param agent: The agent whose turn failed.
    :param turn: The failing turn.
    :param step: The step the failure happened in (the step being prepared for a pre-step failure).
    :param error: The exception that ended the turn.

    Each implementation is isolated (a raising one is logged, later ones still run). Wrappers are
    refused for this hook.

    Use in plugins
    ==============

    Report or record; do not raise and do not block.
    """


@hookspec
def agent_status(host: Host, agent: Agent, status: str) -> None:
    """The agent's driver changed status.

    :param host: The calling :class:`~dsh.session_persistence.Host` (name it only if needed).
    :param agent: The agent.
    :param status: ``"running"`` or ``"idle"``.

    Each implementation is isolated (a raising one is logged, later ones still run). Wrappers are
    refused for this hook.

    Use in plugins
    ==============

    Observe only; do not raise and do not block.
    """
