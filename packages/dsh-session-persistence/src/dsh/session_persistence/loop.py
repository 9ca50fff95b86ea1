"""A small, real reference agent loop that drives a model adapter and tools through the boundary hooks.

:class:`AgentLoop` is what the integration suite, the crash tests and the demo run: it records the canonical events
of a turn in order::

    turn/start
      step/start, user/message..., request/header, request/context?,
      assistant/chunk..., assistant/message (citing the chunk seqs),
      (tool/call, tool/result citing the call seq)...,
      step/end
      ... more steps while the model needs to see tool results ...
    turn/end {completed | max-tokens | blocked | aborted{cause} | error{message, code}}

Everything it calls goes through the :class:`~dsh.session_persistence.Host` facade (``agent_pre_step``,
``llm_stream``, ``tools_execute``), so wrappers such as the checkpoint policy see every boundary. It owns the
*terminal* implementation of each boundary hook, registered ``trylast=True`` once per host:

* ``llm_stream``: an async generator that calls the adapter and converts an adapter exception into a final
  ``finish`` chunk of kind ``error`` (``aborted`` when the turn's signal is aborted);
* ``tools_execute``: checks the signal, runs the tool body, converts a body exception into an error result and a
  success that finished after a cooperative abort into the canonical ``ABORTED`` result;
* ``agent_pre_step``: returns ``pre_step.default``.

Model adapters implement :class:`ModelAdapter`: ``stream(request)`` returns an async iterator of stream chunks, the
msgspec ``StreamChunk`` structs of :mod:`dsh.session_persistence._events` (``TextDeltaChunk``, ``BlockEndChunk``,
``FinishChunk``...), **not** their JSON dicts. Tools implement :class:`Tool`.

Not implemented (documented deviations from the full harness loop): the inbox (``agent/inbox/spliced`` events,
followup/steer queues), ``agent/request`` / ``agent/request-error`` / ``agent/turn-stopping`` hooks, tool
pre-/post-execute policy and approval. A turn is started explicitly with :meth:`AgentLoop.run_turn`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import anyio
import msgspec
from msgspec import UNSET

from ._boundaries import (
    CancelSignal,
    ModelRequest,
    PreStepDecision,
    PreStepInput,
    ToolExecution,
    ToolExecutionResult,
    TurnAborted,
    aborted_before_dispatch_result,
    aborted_result,
    error_result,
)
from ._events import (
    BlockEndChunk,
    BlockStartChunk,
    FinishChunk,
    FinishReason,
    LlmFailure,
    Message,
    ReasoningDeltaChunk,
    RequestContext,
    StreamChunk,
    TextBlock,
    TextDeltaChunk,
    ToolCallDeltaChunk,
    TurnEnd,
    TurnStart,
    UsageChunk,
    UserSource,
)
from ._host import hookimpl

if TYPE_CHECKING:
    from ._host import Host
    from ._session import Session, SessionStore

__all__ = [
    "DEFAULT_MAX_PARALLEL_TOOL_CALLS",
    "RUNTIME_PLUGIN_NAME",
    "AgentLoop",
    "LlmError",
    "ModelAdapter",
    "Tool",
    "ToolOutput",
]

#: Default bound on concurrently dispatched parallel-safe tool calls (spec/policy.md §1.5).
DEFAULT_MAX_PARALLEL_TOOL_CALLS = 10

#: The name under which the loop runtime (the three boundary terminals) is registered in a host.
RUNTIME_PLUGIN_NAME = "dsh-agent-loop"

#: What a tool body may return: plain text (a successful text result) or a full result.
ToolOutput = str | ToolExecutionResult

_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()


# -------------------------------------------------------------------------------------------------
# Public protocols


@runtime_checkable
class ModelAdapter(Protocol):
    """A model provider adapter.

    ``stream(request)`` returns an async iterator of ``StreamChunk`` **structs** (from
    :mod:`dsh.session_persistence._events`); the last one should be a ``FinishChunk`` whose reason kind is
    ``stop``, ``tool-calls``, ``max-tokens``, ``error`` or ``aborted``. The adapter should stop when
    ``request.signal`` is aborted (the loop also races the stream against the signal, so a hanging adapter is
    cancelled natively). An exception escaping the adapter becomes a final ``finish{error}`` chunk.
    """

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]: ...


class Tool(Protocol):
    """A tool the model can call.

    :attr name: The tool name the model uses.
    :attr parallel: ``True`` if calls may overlap other parallel-safe calls (anything else is exclusive).
    :meth run: The body: ``await tool.run(arguments, call_id, signal)`` with the parsed JSON arguments, the model's
        call id (use it as an idempotency key for side effects) and the turn's cooperative signal. Returns text or a
        :class:`ToolExecutionResult`; an exception becomes an error result ``"Error: <message>"``.
    """

    @property
    def name(self) -> str: ...

    @property
    def parallel(self) -> bool: ...

    async def run(self, arguments: Any, call_id: str, signal: CancelSignal) -> ToolOutput: ...


class LlmError(Exception):
    """The model stream finished with ``error`` (or ``aborted`` without a cooperative abort).

    ``failure`` holds the structured facts recorded in ``turn/end {error}`` (``message``, ``code``...).
    """

    def __init__(self, failure: Mapping[str, Any]) -> None:
        super().__init__(str(failure.get("message", "model request failed")))
        self.failure: dict[str, Any] = dict(failure)


# -------------------------------------------------------------------------------------------------
# Helpers


def _builtins(value: object) -> Any:
    """Plain JSON (camelCase, lists, no UNSET fields) of a msgspec struct or JSON value."""
    return _json_decoder.decode(_json_encoder.encode(value))


def _abort_cause(cause: object) -> dict[str, Any]:
    """The ``turn/end`` form of a cancel cause: ``"user"`` -> ``{"kind": "user"}``; dicts/structs kept."""
    if isinstance(cause, str):
        return {"kind": cause}
    if isinstance(cause, msgspec.Struct):
        out: dict[str, Any] = _builtins(cause)
        return out
    if isinstance(cause, Mapping) and isinstance(cause.get("kind"), str):
        return dict(cause)
    return {"kind": "user"}


def _unwrap(exc: Exception) -> Exception:
    """The only leaf of a task group's single-exception group (anyio/trio always wrap), else ``exc``."""
    while True:
        inner = getattr(exc, "exceptions", None)
        if not isinstance(inner, tuple) or len(inner) != 1 or not isinstance(inner[0], Exception):
            return exc
        exc = inner[0]


def _error_text(exc: BaseException) -> str:
    """The error chain text: each message (or type name when empty), outermost first."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(str(current) or type(current).__name__)
        current = current.__cause__
    return ": ".join(parts)


def _aborted(signal: CancelSignal) -> bool:
    """``signal.aborted`` read through a call: it can change across an await, which mypy's narrowing ignores."""
    return signal.aborted


def _as_result(output: object) -> ToolExecutionResult:
    if isinstance(output, ToolExecutionResult):
        return output
    if isinstance(output, str):
        return ToolExecutionResult(content=({"type": "text", "text": output},))
    return ToolExecutionResult(content=({"type": "text", "text": json.dumps(output)},))


class _Assembler:
    """Builds the assistant message's content blocks from stream chunks (by block index, in index order)."""

    def __init__(self) -> None:
        self.kinds: dict[int, str] = {}
        self.text: dict[int, list[str]] = {}
        self.tool: dict[int, dict[str, Any]] = {}
        self.done: dict[int, Any] = {}
        self.usage: Any = None
        self.finish: FinishReason | None = None

    def feed(self, chunk: StreamChunk) -> None:
        kind = type(chunk)
        if kind is BlockStartChunk:
            self.kinds[chunk.index] = chunk.block_type  # type: ignore[union-attr]
        elif kind is TextDeltaChunk or kind is ReasoningDeltaChunk:
            self.kinds.setdefault(chunk.index, "text" if kind is TextDeltaChunk else "reasoning")  # type: ignore[union-attr]
            self.text.setdefault(chunk.index, []).append(chunk.text)  # type: ignore[union-attr]
        elif kind is ToolCallDeltaChunk:
            assert isinstance(chunk, ToolCallDeltaChunk)
            self.kinds.setdefault(chunk.index, "tool-call")
            entry = self.tool.setdefault(chunk.index, {"id": chunk.id, "name": "", "arguments": []})
            if chunk.name is not UNSET:
                entry["name"] = chunk.name
            entry["arguments"].append(chunk.arguments_delta)
        elif kind is BlockEndChunk:
            assert isinstance(chunk, BlockEndChunk)
            self.done[chunk.index] = _builtins(chunk.block)
        elif kind is UsageChunk:
            assert isinstance(chunk, UsageChunk)
            self.usage = _builtins(chunk.usage)
        elif kind is FinishChunk:
            assert isinstance(chunk, FinishChunk)
            self.finish = chunk.reason
        else:
            raise TypeError(f"model adapter yielded {type(chunk).__name__}, expected a StreamChunk struct")

    def blocks(self, *, interrupted: bool) -> list[Any]:
        """Content blocks in index order; interrupted: partial text kept, half-streamed tool calls dropped."""
        out: list[Any] = []
        for index in sorted(set(self.kinds) | set(self.done)):
            if index in self.done:
                out.append(self.done[index])
                continue
            kind = self.kinds.get(index)
            if kind in ("text", "reasoning"):
                text = "".join(self.text.get(index, ()))
                if text:
                    out.append({"type": kind, "text": text})
            elif kind == "tool-call" and not interrupted and index in self.tool:
                entry = self.tool[index]
                out.append(
                    {
                        "type": "tool-call",
                        "id": entry["id"],
                        "name": entry["name"],
                        "arguments": "".join(entry["arguments"]),
                    }
                )
        return out


@dataclass(eq=False)
class _Slot:
    """One started tool call: its block, ``tool/call`` seq and (once dispatched) its result."""

    block: dict[str, Any]
    call_seq: int
    done: anyio.Event = field(default_factory=anyio.Event)
    result: ToolExecutionResult | None = None
    committed: bool = False


# -------------------------------------------------------------------------------------------------
# The runtime plugin: the three boundary terminals (one per host)


class _Runtime:
    """Terminal implementations of the boundary hooks, shared by every :class:`AgentLoop` of one host."""

    def __init__(self) -> None:
        self.loops: dict[str, AgentLoop] = {}

    @hookimpl(trylast=True)
    async def llm_stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """Dispatch to the adapter of the loop owning ``request.session_id``; adapter failures -> finish chunk."""
        try:
            stream = self._adapter(request).stream(request)
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                await _aclose(stream)
        except Exception as exc:
            aborted = request.signal.aborted
            failure = LlmFailure(message=_error_text(exc), code="ABORTED" if aborted else "ADAPTER_ERROR")
            yield FinishChunk(reason=FinishReason(kind="aborted" if aborted else "error", error=failure))

    def _adapter(self, request: ModelRequest) -> ModelAdapter:
        loop = self.loops.get(request.session_id) if request.session_id is not None else None
        if loop is None:
            raise LookupError(f"no agent loop serves session {request.session_id!r}")
        return loop.adapter

    @hookimpl(trylast=True)
    async def tools_execute(self, execution: ToolExecution) -> ToolExecutionResult:
        """Check the signal, run the tool body; body exceptions become error results."""
        signal = execution.signal
        if signal.aborted:
            return aborted_before_dispatch_result()
        agent = execution.agent
        tool = agent.tools.get(execution.name) if isinstance(agent, AgentLoop) else None
        if tool is None:
            return error_result(f"unknown tool {execution.name!r}")
        try:
            output = await tool.run(execution.arguments, execution.call_id, signal)
        except Exception as exc:
            return error_result(_error_text(exc))
        result = _as_result(output)
        if _aborted(signal) and not result.is_error:
            return aborted_result()
        return result

    @hookimpl(trylast=True)
    async def agent_pre_step(self, pre_step: PreStepInput) -> PreStepDecision:
        """The loop's own decision: enter with the claimed messages."""
        return pre_step.default


def _runtime(host: Host) -> _Runtime:
    plugin = host.get_plugin(RUNTIME_PLUGIN_NAME)
    if plugin is None:
        plugin = _Runtime()
        host.register(plugin, name=RUNTIME_PLUGIN_NAME)
    if not isinstance(plugin, _Runtime):
        raise TypeError(f"plugin {RUNTIME_PLUGIN_NAME!r} is registered but is not the agent loop runtime")
    return plugin


# -------------------------------------------------------------------------------------------------
# The loop


class AgentLoop:
    """A reference agent: one live session, one model adapter, some tools, one turn at a time.

    :param host: The plugin host (its ``SessionStore`` is ``store``).
    :param store: The session store; the loop's session lives there.
    :param adapter: The model adapter (:class:`ModelAdapter`).
    :param tools: The tools the model may call (:class:`Tool`), by their ``name``.
    :param provider: Provider name recorded in ``request/header``/``request/context``.
    :param model: Model name recorded likewise.
    :param session_id: Id of the new session to create (``None``: the store picks one).
    :param session: An existing live session of ``store`` to drive instead (used by :meth:`resume`).
    :param system: Optional system prompt (part of the request header).
    :param max_parallel_tool_calls: Bound on concurrently dispatched parallel-safe calls (positive int).

    The loop is the ``agent`` the boundary hooks receive; it exposes :attr:`session`. Call :meth:`close` when done
    (it detaches the loop from the host runtime; disposing the session is the caller's business).
    """

    def __init__(
        self,
        host: Host,
        store: SessionStore,
        adapter: ModelAdapter,
        tools: Iterable[Tool] = (),
        *,
        provider: str,
        model: str,
        session_id: str | None = None,
        session: Session | None = None,
        system: str | None = None,
        max_parallel_tool_calls: int = DEFAULT_MAX_PARALLEL_TOOL_CALLS,
    ) -> None:
        if type(max_parallel_tool_calls) is not int or max_parallel_tool_calls < 1:
            raise ValueError("max_parallel_tool_calls must be a positive integer")
        if not provider or not model:
            raise ValueError("provider and model must be non-empty")
        self.host = host
        self.store = store
        self.adapter = adapter
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
        self.provider = provider
        self.model = model
        self.system = system
        self.max_parallel_tool_calls = max_parallel_tool_calls
        self._runtime = _runtime(host)
        if session is None:
            session = store.create(session_id)
        elif not store.is_live(session):
            raise ValueError(f'session "{session.id}" is not live in this store')
        if session.id in self._runtime.loops:
            raise ValueError(f'session "{session.id}" already has an agent loop')
        self._session = session
        self._runtime.loops[session.id] = self
        self._signal: CancelSignal | None = None
        self._slots: list[_Slot] = []  # the current step's started tool calls
        self._requested = False  # whether this loop instance already logged a request header
        self._closed = False

    @classmethod
    async def resume(
        cls,
        host: Host,
        store: SessionStore,
        persistence: Any,
        session_id: str,
        adapter: ModelAdapter,
        tools: Iterable[Tool] = (),
        *,
        provider: str,
        model: str,
        system: str | None = None,
        max_parallel_tool_calls: int = DEFAULT_MAX_PARALLEL_TOOL_CALLS,
    ) -> AgentLoop:
        """Load a stored session and continue it in a new loop.

        ``persistence.load(session_id)`` returns the balanced (crash-repaired) view; a new live session is seeded
        with it through ``store`` (which appends ``session/end-seed``). The next :meth:`run_turn` continues the turn
        numbering and logs its first request header with reason ``resume``. Loading a session that is live with an
        open turn raises ``LiveTurnOpenError``; a live id cannot be seeded twice (``SessionAlreadyExistsError``).
        """
        view = await persistence.load(session_id)
        session = store.create(
            session_id, seed=view.events, meta=view.meta, inherited_event_count=view.inherited_event_count
        )
        return cls(
            host,
            store,
            adapter,
            tools,
            provider=provider,
            model=model,
            session=session,
            system=system,
            max_parallel_tool_calls=max_parallel_tool_calls,
        )

    # ---------------------------------------------------------------------------------------------
    # Read side

    @property
    def session(self) -> Session:
        """The live session this loop appends to (the checkpoint policy flushes it)."""
        return self._session

    @property
    def running(self) -> bool:
        """Whether a turn is in progress."""
        return self._signal is not None

    @property
    def signal(self) -> CancelSignal | None:
        """The running turn's cancellation signal (``None`` while idle)."""
        return self._signal

    def last_turn(self) -> int:
        """The number of the last turn started in the session (0 if none)."""
        for event in reversed(self._session.events):
            if type(event) is TurnStart:
                return event.data.turn
        return 0

    # ---------------------------------------------------------------------------------------------
    # Control

    def cancel(self, cause: object = "user") -> bool:
        """Abort the running turn cooperatively with ``cause`` (first cause wins); no-op while idle.

        ``cause`` is a kind string (``"user"``, ``"parent"``, ``"disposed"``), a ``{"kind": ...}`` dict or an
        abort-cause struct; ``turn/end`` records it as ``aborted {reason: cause}``. Returns whether this call
        aborted the turn.
        """
        signal = self._signal
        if signal is None:
            return False
        return signal.abort(cause)

    def close(self) -> None:
        """Detach from the host runtime (the session stays live in the store). Idempotent."""
        if not self._closed:
            self._closed = True
            if self._runtime.loops.get(self._session.id) is self:
                del self._runtime.loops[self._session.id]

    async def dispatch_nested(self, name: str, arguments: Any, *, parent: object, signal: CancelSignal) -> Any:
        """Dispatch a nested (transport) sub-call from inside a composite tool body.

        ``parent`` is the outer call's opaque token (e.g. its call id); the sub-call has no ``tool/call`` event and
        the checkpoint policy does not flush for it. Returns the :class:`ToolExecutionResult`.
        """
        execution = ToolExecution(
            call_id=f"{parent}/{name}", name=name, arguments=arguments, signal=signal, agent=self, parent=parent
        )
        return await self._execute(execution)

    # ---------------------------------------------------------------------------------------------
    # A turn

    async def run_turn(self, messages: str | Message | Sequence[str | Message]) -> TurnEnd:
        """Run one turn with ``messages`` as the user input; return the ``turn/end`` event.

        Errors are contained: a failing turn ends ``error`` (and ``agent_error`` is notified), a cancelled one
        ``aborted``. Native (anyio) cancellation is not swallowed: the turn is closed ``aborted {disposed}`` (unless
        already aborted) and the cancellation propagates.
        """
        if self._closed:
            raise RuntimeError("this agent loop is closed")
        if self._signal is not None:
            raise RuntimeError("a turn is already running on this agent loop")
        if self._session.has_open_turn():
            raise RuntimeError(f'session "{self._session.id}" has an open turn')
        signal = CancelSignal()
        self._signal = signal
        self.host.agent_status(self, "running")
        try:
            return await self._turn(self._user_messages(messages), signal)
        finally:
            self._signal = None
            self.host.agent_status(self, "idle")

    def _user_messages(self, messages: str | Message | Sequence[str | Message]) -> list[Message]:
        items: Sequence[str | Message] = [messages] if isinstance(messages, (str, Message)) else messages
        turn = self.last_turn() + 1
        out: list[Message] = []
        for index, item in enumerate(items):
            if isinstance(item, Message):
                out.append(item)
            else:
                out.append(
                    Message(
                        id=f"user-{turn}-{index}", role="user", content=(TextBlock(text=item),), source=UserSource()
                    )
                )
        return out

    async def _turn(self, claimed: list[Message], signal: CancelSignal) -> TurnEnd:
        session = self._session
        turn = self.last_turn() + 1
        session.append("turn/start", {"turn": turn})
        step = 0
        ends: str | None = None
        reason: dict[str, Any]
        try:
            try:
                while True:
                    signal.raise_if_aborted()
                    step += 1
                    pre_step = PreStepInput(
                        messages=tuple(claimed),
                        turn=turn,
                        step=step,
                        signal=signal,
                        default=PreStepDecision.enter(tuple(claimed)),
                    )
                    claimed = []
                    decision = await self.host.agent_pre_step(self, pre_step)
                    signal.raise_if_aborted()
                    if decision.kind == "reject":
                        ends = "blocked"
                        break
                    if not decision.messages and (ends is not None or step == 1):
                        ends = ends or "completed"
                        break
                    session.append("step/start", {"turn": turn, "step": step})
                    try:
                        for message in decision.messages:
                            session.append("user/message", _builtins(message))
                        outcome = await self._step(turn, step, signal)
                    finally:
                        session.append("step/end", {"turn": turn, "step": step})
                    if outcome == "max-tokens" or (outcome == "completed" and ends != "max-tokens"):
                        ends = outcome
                    signal.raise_if_aborted()
                    if ends is not None:
                        break
                reason = {"kind": ends}
            except Exception as raised:
                exc = _unwrap(raised)
                if signal.aborted:
                    reason = {"kind": "aborted", "reason": _abort_cause(signal.reason)}
                else:
                    failure = (
                        exc.failure if isinstance(exc, LlmError) else {"message": _error_text(exc), "code": "UNKNOWN"}
                    )
                    reason = {"kind": "error", "error": failure}
                    self.host.agent_error(self, turn, step, exc)
        except BaseException:
            # Native cancellation (host teardown): close the turn honestly, then let the cancellation go on.
            signal.abort("disposed")
            session.append(
                "turn/end", {"turn": turn, "reason": {"kind": "aborted", "reason": _abort_cause(signal.reason)}}
            )
            raise
        event = session.append("turn/end", {"turn": turn, "reason": reason})
        assert isinstance(event, TurnEnd)
        return event

    # ---------------------------------------------------------------------------------------------
    # A step: request, stream, tools

    def _log_request(self) -> None:
        session = self._session
        previous = session.request_header()
        header: dict[str, Any] = {"config": {"provider": self.provider, "model": self.model}}
        if self.system is not None:
            header["system"] = self.system
        if self.tools:
            header["tools"] = [{"name": name} for name in self.tools]
        if not self._requested:
            self._requested = True
            session.append("request/header", {"header": header, "reason": "initial" if previous is None else "resume"})
        elif previous is None or _builtins(previous) != header:
            session.append("request/header", {"header": header, "reason": "change"})
        context = None
        for event in reversed(session.events):
            if type(event) is RequestContext:
                context = event.data
                break
        if context is None or (context.provider, context.model) != (self.provider, self.model):
            session.append("request/context", {"provider": self.provider, "model": self.model})

    async def _step(self, turn: int, step: int, signal: CancelSignal) -> Literal["completed", "max-tokens"] | None:
        session = self._session
        self._log_request()
        signal.raise_if_aborted()
        request = ModelRequest(
            session_id=session.id,
            messages=tuple(session.derive_messages()),
            config={"provider": self.provider, "model": self.model},
            signal=signal,
            system=self.system,
            tools=tuple({"name": name} for name in self.tools),
        )
        stream = self.host.llm_stream(request)
        assembler = _Assembler()
        chunk_seqs: list[int] = []
        error: Exception | None = None
        try:
            signal.raise_if_aborted()
        except TurnAborted:
            # Never iterated: dispose of the unstarted chain.
            await _aclose(stream)
            raise

        async def watch(scope: anyio.CancelScope) -> None:
            # Race the iteration against the cooperative signal, so a hanging adapter stops (spec/policy.md §6.7).
            await signal.wait()
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, tg.cancel_scope)
            try:
                try:
                    async for chunk in stream:
                        signal.raise_if_aborted()
                        event = session.append(
                            "assistant/chunk", {"turn": turn, "step": step, "chunk": _builtins(chunk)}
                        )
                        chunk_seqs.append(event.seq)
                        assembler.feed(chunk)
                finally:
                    await _aclose(stream)
            except Exception as exc:
                error = exc
            finally:
                tg.cancel_scope.cancel()
        if signal.aborted:
            blocks = assembler.blocks(interrupted=True)
            if blocks:
                data: dict[str, Any] = {
                    "turn": turn,
                    "step": step,
                    "message": self._assistant(turn, step, blocks),
                    "interrupted": True,
                }
                if assembler.usage is not None:
                    data["usage"] = assembler.usage
                session.append("assistant/message", data, source_event_seqs=chunk_seqs)
            raise TurnAborted(signal.reason)
        if error is not None:
            raise error
        finish = assembler.finish
        kind = finish.kind if finish is not None else "stop"
        if kind in ("error", "aborted"):
            assert finish is not None
            failure = _builtins(finish.error) if finish.error is not UNSET else {"message": kind, "code": "UNKNOWN"}
            raise LlmError(failure)
        blocks = assembler.blocks(interrupted=False)
        data = {"turn": turn, "step": step, "message": self._assistant(turn, step, blocks)}
        if assembler.usage is not None:
            data["usage"] = assembler.usage
        session.append("assistant/message", data, source_event_seqs=chunk_seqs)
        if kind == "max-tokens":
            return "max-tokens"
        calls = [block for block in blocks if block.get("type") == "tool-call"]
        if not calls:
            return "completed"
        await self._run_tools(turn, step, calls, signal)
        return None

    def _assistant(self, turn: int, step: int, blocks: list[Any]) -> dict[str, Any]:
        return {
            "id": f"assistant-{turn}-{step}",
            "role": "assistant",
            "content": blocks,
            "source": {"kind": "model", "provider": self.provider, "model": self.model},
        }

    # ---------------------------------------------------------------------------------------------
    # Tools

    async def _run_tools(self, turn: int, step: int, calls: list[dict[str, Any]], signal: CancelSignal) -> None:
        self._slots = []
        try:
            await self._schedule(turn, step, calls, signal)
        except BaseException as exc:
            if isinstance(exc, Exception):
                raise  # an internal failure: rethrown without fabricating results (spec/policy.md §1.5)
            # Native cancellation (teardown): close every call so the transcript stays balanced, then propagate.
            started = {slot.block["id"] for slot in self._slots}
            for slot in list(self._slots):
                if not slot.committed:
                    slot.result = aborted_result()
                    self._commit(turn, step, slot)
            for block in calls:
                if block["id"] not in started:
                    slot = self._start_call(turn, step, block)
                    slot.result = aborted_before_dispatch_result()
                    self._commit(turn, step, slot)
            raise
        finally:
            self._slots = []

    async def _schedule(self, turn: int, step: int, calls: list[dict[str, Any]], signal: CancelSignal) -> None:
        index = 0
        while index < len(calls) and not signal.aborted:
            tool = self.tools.get(calls[index]["name"])
            if not self._is_parallel(tool):
                slot = self._start_call(turn, step, calls[index])
                slot.result = await self._dispatch(turn, step, slot, signal)
                self._commit(turn, step, slot)
                index += 1
                continue
            end = index
            while end < len(calls) and self._is_parallel(self.tools.get(calls[end]["name"])):
                end += 1
            index += await self._run_pool(turn, step, calls[index:end], signal)
        for block in calls[index:]:
            # Never started: a synthetic call + ABORTED_BEFORE_DISPATCH pair keeps the transcript balanced.
            slot = self._start_call(turn, step, block)
            slot.result = aborted_before_dispatch_result()
            self._commit(turn, step, slot)

    @staticmethod
    def _is_parallel(tool: Tool | None) -> bool:
        try:
            return tool is not None and tool.parallel is True
        except Exception:  # a throwing concurrency predicate means exclusive
            return False

    async def _run_pool(self, turn: int, step: int, group: list[dict[str, Any]], signal: CancelSignal) -> int:
        """A rolling pool of at most ``max_parallel_tool_calls`` dispatches; results committed in model order."""
        semaphore = anyio.Semaphore(self.max_parallel_tool_calls)
        started: list[_Slot] = []
        committed = 0

        def commit_ready() -> None:
            nonlocal committed
            while committed < len(started) and started[committed].done.is_set():
                self._commit(turn, step, started[committed])
                committed += 1

        async def run(slot: _Slot) -> None:
            try:
                slot.result = await self._dispatch(turn, step, slot, signal)
            finally:
                slot.done.set()
                semaphore.release()

        async with anyio.create_task_group() as tg:
            for block in group:
                commit_ready()
                await semaphore.acquire()
                if signal.aborted:
                    semaphore.release()
                    break
                slot = self._start_call(turn, step, block)
                started.append(slot)
                tg.start_soon(run, slot)
            # Drain started calls, committing each as soon as everything before it is committed.
            for slot in started[committed:]:
                await slot.done.wait()
                commit_ready()
        commit_ready()
        return len(started)

    def _start_call(self, turn: int, step: int, block: dict[str, Any]) -> _Slot:
        event = self._session.append(
            "tool/call",
            {"turn": turn, "step": step, "callId": block["id"], "name": block["name"], "arguments": block["arguments"]},
        )
        slot = _Slot(block=block, call_seq=event.seq)
        self._slots.append(slot)
        return slot

    async def _dispatch(self, turn: int, step: int, slot: _Slot, signal: CancelSignal) -> ToolExecutionResult:
        block = slot.block
        if signal.aborted:  # prepare: never reaches tools_execute
            return aborted_before_dispatch_result()
        try:
            arguments = json.loads(block["arguments"]) if block["arguments"] else {}
        except ValueError as exc:
            return error_result(f"invalid tool arguments: {exc}")
        if block["name"] not in self.tools:
            return error_result(f"unknown tool {block['name']!r}")
        execution = ToolExecution(
            call_id=block["id"],
            name=block["name"],
            arguments=arguments,
            signal=signal,
            agent=self,
            turn=turn,
            step=step,
        )
        return await self._execute(execution)

    async def _execute(self, execution: ToolExecution) -> ToolExecutionResult:
        """Await the ``tools_execute`` chain; any ``Exception`` escaping it is the call's final error result."""
        try:
            result = await self.host.tools_execute(execution)
        except Exception as exc:
            return error_result(str(exc) or type(exc).__name__)
        if execution.signal.aborted and not result.is_error:
            return aborted_result()
        return result

    def _commit(self, turn: int, step: int, slot: _Slot) -> None:
        result = slot.result
        assert result is not None
        call_id = slot.block["id"]
        block: dict[str, Any] = {
            "type": "tool-result",
            "toolCallId": call_id,
            "content": [dict(b) for b in result.content],
        }
        if result.is_error:
            block["isError"] = True
        data: dict[str, Any] = {
            "turn": turn,
            "step": step,
            "message": {
                "id": f"tool-result-{call_id}",
                "role": "user",
                "content": [block],
                "source": {"kind": "tool", "callId": call_id},
            },
        }
        info = result.error.get("info") if result.error is not None else None
        if isinstance(info, Mapping) and isinstance(info.get("name"), str) and isinstance(info.get("code"), str):
            data["error"] = {"name": info["name"], "code": info["code"]}
        self._session.append("tool/result", data, source_event_seqs=[slot.call_seq])
        slot.committed = True

    def __repr__(self) -> str:
        state = "running" if self._signal is not None else "idle"
        return f"<AgentLoop session={self._session.id!r} {state}>"


async def _aclose(stream: object) -> None:
    aclose = getattr(stream, "aclose", None)
    if callable(aclose):
        await aclose()
