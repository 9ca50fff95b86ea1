"""Tool schemas: what the model is told about each tool, and a tool built from a plain function.

A tool offers the model three things: its ``name``, a ``description`` and a JSON schema of its ``parameters``
(an object schema). :func:`tool_spec` is the one rule that turns a tool into the mapping a model request carries
(``{"name", "description", "parameters"}``); a provider adapter translates that mapping to its own wire form.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from .._host.boundaries import ToolExecutionResult
from .._model.errors import ToolDefinitionError
from .._model.jsonvalue import NotLosslessJsonError, snapshot_json

if TYPE_CHECKING:
    from .._host.boundaries import CancelSignal

__all__ = ["ANY_OBJECT_SCHEMA", "FunctionTool", "check_parameters", "tool_spec"]

#: The parameter schema of a tool that declares none: any JSON object.
ANY_OBJECT_SCHEMA: Mapping[str, Any] = {"type": "object"}


def check_parameters(name: str, parameters: object) -> dict[str, Any]:
    """A fresh copy of ``parameters`` if it is a JSON object schema, else ``ValueError`` naming the tool.

    A model calls a tool with one JSON object of arguments, so the schema must describe an object: a JSON
    object whose ``type`` (when given) is ``"object"``.
    """
    if not isinstance(parameters, Mapping):
        raise TypeError(f"tool {name!r}: parameters must be a JSON schema object, got {type(parameters).__name__}")
    try:
        schema = snapshot_json(dict(parameters), f"tool {name!r} parameters")
    except NotLosslessJsonError as exc:
        raise ValueError(f"tool {name!r}: parameters must be plain JSON ({exc})") from exc
    assert isinstance(schema, dict)
    if schema.get("type", "object") != "object":
        raise ValueError(f'tool {name!r}: the parameters schema must have type "object", got {schema["type"]!r}')
    return schema


def tool_spec(tool: object) -> dict[str, Any]:
    """``{"name", "description", "parameters"}`` of ``tool``, as a model request carries it.

    A tool without ``description`` / ``parameters`` attributes (written before tools carried schemas) gets an
    empty description and :data:`ANY_OBJECT_SCHEMA`.
    """
    name = getattr(tool, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tool needs a non-empty str name, got {name!r}")
    description = getattr(tool, "description", None) or ""
    if not isinstance(description, str):
        raise TypeError(f"tool {name!r}: description must be a str, got {type(description).__name__}")
    parameters = getattr(tool, "parameters", None)
    schema = check_parameters(name, ANY_OBJECT_SCHEMA if parameters is None else parameters)
    return {"name": name, "description": description, "parameters": schema}


async def _run_in_daemon_thread(func: Callable[[], Any]) -> Any:
    """``func()`` on a new daemon thread; the wait is cancellable and a cancelled wait abandons the thread.

    Not anyio's worker threads nor the loop's default executor: the interpreter joins those at exit, so a sync
    check that hangs past its bound would keep the process alive after everything else has finished. A daemon
    thread is left behind instead (its eventual answer is dropped). The answer is handed back through the event
    loop's own thread-safe entry (asyncio's ``call_soon_threadsafe``, trio's token).
    """
    done = anyio.Event()
    box: list[Any] = []
    wake: Callable[[Callable[[], object]], object]
    try:
        wake = asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:  # not asyncio: anyio's other backend
        import trio

        wake = trio.lowlevel.current_trio_token().run_sync_soon

    def target() -> None:
        try:
            box.append((True, func()))
        except BaseException as exc:  # handed to the waiter, raised there
            box.append((False, exc))
        with contextlib.suppress(Exception):  # the loop is gone: nobody waits any more
            wake(done.set)

    threading.Thread(target=target, name="dsh reconciliation check", daemon=True).start()
    await done.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _require_call_id(name: str, what: str, fn: Callable[..., Any]) -> None:
    """Refuse ``fn`` if it cannot be called with a ``call_id=`` keyword (``**kwargs`` takes it too)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return  # no signature to read (some builtins): the call itself will tell
    for param in params:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            return
        if param.name == "call_id" and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            return
    raise ToolDefinitionError(
        f"tool {name!r}: the {what} is called with call_id=..., but {fn!r} has no call_id parameter"
    )


@dataclass(eq=False)
class FunctionTool:
    """A tool whose body is a plain function called with the model's arguments as keywords.

    ``FunctionTool("add", add, "Add two integers.", {"type": "object", "properties": {...}})`` runs
    ``add(**arguments)`` (sync or async). A returned ``str`` or ``ToolExecutionResult`` is the result as is;
    anything else is sent as JSON text. An exception becomes an error result.

    Side effects: set ``with_call_id=True`` and the body also receives ``call_id=``, the model's id of this call,
    stable across a crash: use it as the idempotency key of the effect (the key a payment provider deduplicates
    on, the name of the row or file the effect creates). Then give ``check`` (which requires ``with_call_id=True``;
    both functions must take a ``call_id`` parameter, else :class:`ToolDefinitionError` when the tool is built),
    a function (sync or async) called as ``check(**arguments, call_id=...)`` that looks the effect up by that key
    and returns a :class:`~dsh.session_persistence.loop.Reconciliation`: ``Reconciliation.happened(result)``,
    ``Reconciliation.did_not_happen()`` or ``Reconciliation.cannot_tell()``. After a crash left the call's outcome
    unknown, a resumed loop asks it (bounded in time; a sync check runs on a daemon thread of its own, so one that
    hangs cannot keep the process from exiting) and tells the model.
    """

    name: str
    fn: Callable[..., Any]
    description: str = ""
    parameters: Mapping[str, Any] | None = None
    parallel: bool = False
    with_call_id: bool = False
    check: Callable[..., Any] | None = None
    _checked: dict[str, Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._checked = tool_spec(self)
        if self.check is not None and not callable(self.check):
            raise TypeError(f"tool {self.name!r}: check must be callable, got {type(self.check).__name__}")
        if self.check is not None and not self.with_call_id:
            # The check looks the effect up by the call id; a body that never receives it cannot record the effect
            # under it, so the check would report "did not happen" for an effect that did.
            raise ToolDefinitionError(
                f"tool {self.name!r}: a check finds the tool's effect by its call id, so the body must receive it: "
                "pass with_call_id=True and record the effect under call_id"
            )
        if self.with_call_id:
            _require_call_id(self.name, "function (with_call_id=True)", self.fn)
        if self.check is not None:
            _require_call_id(self.name, "check", self.check)

    @property
    def reconcile(self) -> Callable[[Any, str], Awaitable[Any]] | None:
        """The reconciliation check the loop calls as ``reconcile(arguments, call_id)`` (``None`` without ``check``)."""
        return None if self.check is None else self._reconcile

    async def _reconcile(self, arguments: Any, call_id: str) -> Any:
        check = self.check
        assert check is not None
        if not isinstance(arguments, dict):
            raise TypeError(f"tool {self.name!r} expects a JSON object of arguments, got {type(arguments).__name__}")
        kwargs = {**arguments, "call_id": call_id}
        if inspect.iscoroutinefunction(check):
            return await check(**kwargs)
        # A blocking lookup (a database, an HTTP API) must not stall the event loop, and must be abandonable when it
        # hangs: the caller's deadline then releases this wait, and the thread cannot hold the process at exit.
        return await _run_in_daemon_thread(lambda: check(**kwargs))

    async def run(self, arguments: Any, call_id: str, signal: CancelSignal) -> str | ToolExecutionResult:
        """Call the function with the arguments object as keywords (``TypeError`` if it is not an object)."""
        if not isinstance(arguments, dict):
            raise TypeError(f"tool {self.name!r} expects a JSON object of arguments, got {type(arguments).__name__}")
        kwargs = dict(arguments)
        if self.with_call_id:
            kwargs["call_id"] = call_id
        output = self.fn(**kwargs)
        if inspect.isawaitable(output):
            output = await output
        if isinstance(output, (str, ToolExecutionResult)):
            return output
        return json.dumps(output)
