"""Tool schemas: what the model is told about each tool, and a tool built from a plain function.

A tool offers the model three things: its ``name``, a ``description`` and a JSON schema of its ``parameters``
(an object schema). :func:`tool_spec` is the one rule that turns a tool into the mapping a model request carries
(``{"name", "description", "parameters"}``); a provider adapter translates that mapping to its own wire form.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._host.boundaries import ToolExecutionResult
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


@dataclass(eq=False)
class FunctionTool:
    """A tool whose body is a plain function called with the model's arguments as keywords.

    ``FunctionTool("add", add, "Add two integers.", {"type": "object", "properties": {...}})`` runs
    ``add(**arguments)`` (sync or async). A returned ``str`` or ``ToolExecutionResult`` is the result as is;
    anything else is sent as JSON text. An exception becomes an error result. Set ``with_call_id=True`` to also
    receive ``call_id=`` (use it as an idempotency key for side effects).
    """

    name: str
    fn: Callable[..., Any]
    description: str = ""
    parameters: Mapping[str, Any] | None = None
    parallel: bool = False
    with_call_id: bool = False
    _checked: dict[str, Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._checked = tool_spec(self)

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
