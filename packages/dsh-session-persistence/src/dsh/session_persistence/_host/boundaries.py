"""Values carried by the agent boundary hooks, plus the two helpers the boundary chains need.

* :class:`CancelSignal` / :class:`TurnAborted`: the cooperative cancellation channel (turn semantics,
  first cause wins). Native anyio cancellation is the other channel and is never converted into it.
* :class:`Deferred`: an inert awaitable that coroutine-hook wrappers return around the inner object,
  so an abandoned chain can be closed without leaking "coroutine ... was never awaited".
* :class:`ModelRequest`, :class:`ToolExecution`, :class:`ToolExecutionResult`, :class:`PreStepInput`,
  :class:`PreStepDecision`: the hook arguments and results.

The value types are frozen **dataclasses**, not msgspec Structs: they are in-process carriers of live
objects (a signal with an ``anyio.Event``, an agent handle, an opaque parent token) and are never
encoded, so msgspec's strength (a validating wire codec) does not apply, while ``dataclasses.replace``
is exactly what a wrapper needs to substitute one field (e.g. a fused signal). Wire values inside them
(messages, chunks) are the msgspec Structs of :mod:`._events`.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Literal, ParamSpec, TypeVar

import anyio

from .._model.codes import (
    TOOL_ABORTED,
    TOOL_ABORTED_BEFORE_DISPATCH,
    TOOL_ABORTED_BEFORE_DISPATCH_TEXT,
    TOOL_ABORTED_TEXT,
)

if TYPE_CHECKING:
    from .._model.events import Message
    from .specs import Agent

__all__ = [
    "CancelSignal",
    "Deferred",
    "ModelRequest",
    "PreStepDecision",
    "PreStepInput",
    "ToolExecution",
    "ToolExecutionResult",
    "TurnAborted",
    "aborted_before_dispatch_result",
    "aborted_result",
    "error_result",
]

_T = TypeVar("_T")
_I = TypeVar("_I")
_P = ParamSpec("_P")


# -------------------------------------------------------------------------------------------------
# Cooperative cancellation


class TurnAborted(Exception):
    """Raised by :meth:`CancelSignal.raise_if_aborted`; ``reason`` is the signal's first cause."""

    def __init__(self, reason: object) -> None:
        super().__init__(f"turn aborted: {reason!r}")
        self.reason = reason


class CancelSignal:
    """The cooperative cancellation signal of one agent activity (a turn).

    ``abort(reason)`` is idempotent and **the first cause wins**: later calls change nothing, so the
    reason ``turn/end`` records is the one that actually stopped the turn. Code checks the signal
    between awaits (:meth:`raise_if_aborted`) or waits for it (:meth:`wait`). This is not anyio
    cancellation: nothing is torn down, the holder is expected to stop.
    """

    __slots__ = ("_aborted", "_event", "_reason")

    def __init__(self) -> None:
        self._aborted = False
        self._reason: object = None
        # Created lazily: anyio.Event() needs a running event loop, a signal may be built outside one.
        self._event: anyio.Event | None = None

    @property
    def aborted(self) -> bool:
        """Whether :meth:`abort` was called."""
        return self._aborted

    @property
    def reason(self) -> object:
        """The first cause passed to :meth:`abort` (``None`` while not aborted)."""
        return self._reason

    def abort(self, reason: object) -> bool:
        """Abort with ``reason`` unless already aborted; return whether this call aborted."""
        if self._aborted:
            return False
        self._aborted = True
        self._reason = reason
        if self._event is not None:
            self._event.set()
        return True

    async def wait(self) -> None:
        """Return once the signal is aborted (immediately if it already is)."""
        if self._aborted:
            return
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()

    def raise_if_aborted(self) -> None:
        """Raise :class:`TurnAborted` carrying :attr:`reason` if the signal is aborted."""
        if self._aborted:
            raise TurnAborted(self._reason)

    def __repr__(self) -> str:
        state = f"aborted, reason={self._reason!r}" if self._aborted else "active"
        return f"<CancelSignal {state}>"


# -------------------------------------------------------------------------------------------------
# Deferred


def _close(obj: object) -> None:
    close = getattr(obj, "close", None)
    if callable(close):
        close()


class Deferred(Generic[_T]):
    """An inert awaitable: ``await Deferred(fn, inner, *args)`` runs ``await fn(inner, *args)``.

    Constructing it runs nothing, not even ``fn``: no coroutine exists until it is awaited. If the chain
    is abandoned instead, :meth:`close` closes ``inner`` (a coroutine, or another ``Deferred`` which
    closes its own inner in turn), so the terminal coroutine at the bottom of the chain is closed
    rather than garbage-collected unawaited. This is why coroutine-hook wrappers return a ``Deferred``
    rather than an ``async def`` closure, so building it runs nothing.

    Awaitable once, like a coroutine.
    """

    __slots__ = ("_args", "_coro", "_fn", "_inner", "_kwargs", "_state")

    def __init__(
        self,
        fn: Callable[Concatenate[_I, _P], Awaitable[_T]],
        inner: _I,
        /,
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> None:
        self._fn: Callable[..., Awaitable[_T]] = fn
        self._inner: object = inner
        self._args: tuple[object, ...] = args
        self._kwargs: dict[str, object] = kwargs
        self._coro: Awaitable[_T] | None = None
        self._state: Literal["pending", "started", "closed"] = "pending"

    def __await__(self) -> Generator[Any, None, _T]:
        if self._state != "pending":
            raise RuntimeError(f"cannot await a Deferred that is already {self._state}")
        self._state = "started"
        try:
            self._coro = self._fn(self._inner, *self._args, **self._kwargs)
        except BaseException:
            # ``fn`` never took ownership of ``inner``: close it so it is not leaked unawaited.
            _close(self._inner)
            raise
        # Drop our references: from now on ``fn`` owns ``inner`` (it awaits or closes it).
        self._inner = None
        self._args = ()
        self._kwargs = {}
        return (yield from self._coro.__await__())

    def close(self) -> None:
        """Abandon the chain: before start, close ``inner``; once started, close the running ``fn``.

        Idempotent.
        """
        state, self._state = self._state, "closed"
        if state == "pending":
            inner, self._inner = self._inner, None
            _close(inner)
        elif state == "started":
            _close(self._coro)

    def __repr__(self) -> str:
        name = getattr(self._fn, "__qualname__", repr(self._fn))
        return f"<Deferred {name} {self._state}>"


# -------------------------------------------------------------------------------------------------
# Boundary values


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    """The argument of ``llm_stream``: one model call.

    :param session_id: The session the request was derived from (``None`` for a request built
        outside any session; the checkpoint policy does not flush then).
    :param messages: The model-visible messages (``Session.derive_messages()``).
    :param config: The call config (provider, model and options from the request header).
    :param system: The system prompt, if any.
    :param tools: The tools offered to the model, one mapping each: ``{"name": str, "description": str,
        "parameters": <JSON schema of the arguments object>}``, in the order the loop was given them.
    :param signal: The turn's cooperative cancellation signal.
    """

    session_id: str | None
    messages: tuple[Message, ...]
    config: Mapping[str, Any]
    signal: CancelSignal
    system: str | None = None
    tools: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolExecution:
    """The argument of ``tools_execute``: one tool dispatch.

    :param call_id: The model's tool call id.
    :param name: The tool name.
    :param arguments: The parsed JSON arguments.
    :param agent: The agent running the call, ``None`` for an agent-less dispatch.
    :param parent: Opaque token of the outer execution for a nested (transport) sub-dispatch, else
        ``None``. A call with a parent has no ``tool/call`` event of its own.
    :param signal: The caller's cooperative cancellation signal.
    :param turn: The turn of the call (``None`` without an agent).
    :param step: The step of the call (``None`` without an agent).
    """

    call_id: str
    name: str
    arguments: Any
    signal: CancelSignal
    agent: Agent | None = None
    parent: object | None = None
    turn: int | None = None
    step: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolExecutionResult:
    """The result of a tool dispatch (the value ``tools_execute``'s awaitable produces).

    :param content: Content blocks as JSON objects (``{"type": "text", "text": ...}``).
    :param is_error: Whether the result reports a failure to the model.
    :param error: Structured failure facts (``{"message": ..., "info": {"name": ..., "code": ...}}``).
    """

    content: tuple[Mapping[str, Any], ...]
    is_error: bool = False
    error: Mapping[str, Any] | None = None

    def to_builtins(self) -> dict[str, Any]:
        """Plain JSON form (fresh copies): ``{"content", "is_error"[, "error"]}``; ``error`` only if set."""
        out: dict[str, Any] = {
            "content": [copy.deepcopy(dict(block)) for block in self.content],
            "is_error": self.is_error,
        }
        if self.error is not None:
            out["error"] = copy.deepcopy(dict(self.error))
        return out


def error_result(message: str) -> ToolExecutionResult:
    """A final error result whose only content is the text ``"Error: <message>"``."""
    return ToolExecutionResult(content=({"type": "text", "text": f"Error: {message}"},), is_error=True)


def _abort_result(text: str, code: str) -> ToolExecutionResult:
    message = text.removeprefix("Error: ")
    return ToolExecutionResult(
        content=({"type": "text", "text": text},),
        is_error=True,
        error={"message": message, "info": {"name": "AbortError", "code": code}},
    )


def aborted_before_dispatch_result() -> ToolExecutionResult:
    """The canonical result of a call cancelled before its body ran (code ``ABORTED_BEFORE_DISPATCH``)."""
    return _abort_result(TOOL_ABORTED_BEFORE_DISPATCH_TEXT, TOOL_ABORTED_BEFORE_DISPATCH)


def aborted_result() -> ToolExecutionResult:
    """The canonical result of a call cancelled after its body started (code ``ABORTED``)."""
    return _abort_result(TOOL_ABORTED_TEXT, TOOL_ABORTED)


@dataclass(frozen=True, slots=True, kw_only=True)
class PreStepDecision:
    """The decision of ``agent_pre_step``: ``enter`` the step with ``messages``, or ``reject`` it.

    Use :meth:`enter` / :meth:`reject`. A ``reject`` decision carries no messages.
    """

    kind: Literal["enter", "reject"]
    messages: tuple[Message, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("enter", "reject"):
            raise ValueError(f'pre-step decision kind must be "enter" or "reject", got {self.kind!r}')
        if self.kind == "reject" and self.messages:
            raise ValueError("a reject pre-step decision carries no messages")

    @classmethod
    def enter(cls, messages: tuple[Message, ...] = ()) -> PreStepDecision:
        """Enter the step with ``messages`` (appended as ``user/message`` events)."""
        return cls(kind="enter", messages=tuple(messages))

    @classmethod
    def reject(cls) -> PreStepDecision:
        """Do not enter the step; the turn ends ``blocked``."""
        return cls(kind="reject")


@dataclass(frozen=True, slots=True, kw_only=True)
class PreStepInput:
    """The ``pre_step`` argument of ``agent_pre_step``.

    :param messages: The input claimed from the inbox for this step.
    :param turn: The current turn.
    :param step: The step about to start.
    :param signal: The turn's cooperative cancellation signal.
    :param default: The loop's own decision (``enter`` with the claimed messages, plus any runtime
        context message); the terminal returns it.
    """

    messages: tuple[Message, ...]
    turn: int
    step: int
    signal: CancelSignal
    default: PreStepDecision
