"""Tools carry their schema into the model request; finish kinds are validated; loops name themselves from adapters."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from dsh.session_persistence import CancelSignal, Host, SessionStore
from dsh.session_persistence.events import FINISH_KINDS, AssistantChunk, FinishChunk, FinishReason, RequestHeader
from dsh.session_persistence.loop import ANY_OBJECT_SCHEMA, AgentLoop, FunctionTool, ToolDefinitionError, tool_spec
from dsh.session_persistence.testing import ScriptedAdapter, ScriptedTool, TextResponse, ToolCallResponse
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.anyio

ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


class OldStyleTool:
    """A tool written before tools had schemas: only name, parallel and run."""

    name = "legacy"
    parallel = False

    async def run(self, arguments: Any, call_id: str, signal: CancelSignal) -> str:
        return "old"


def add(a: int, b: int) -> int:
    return a + b


async def test_request_carries_description_and_parameters_and_the_header_records_them() -> None:
    host = Host()
    store = SessionStore(host)
    model = ScriptedAdapter([ToolCallResponse((("c1", "add", {"a": 2, "b": 3}),)), TextResponse("5")])
    tools = [
        FunctionTool("add", add, "Add two integers.", ADD_SCHEMA),
        ScriptedTool("echo", description="Echo the input."),
        OldStyleTool(),
    ]
    agent = AgentLoop(host, store, model, tools)
    result = await agent.run_turn("2 + 3?")
    assert (result.reason.kind, result.text) == ("completed", "5")
    expected = [
        {"name": "add", "description": "Add two integers.", "parameters": ADD_SCHEMA},
        {"name": "echo", "description": "Echo the input.", "parameters": dict(ANY_OBJECT_SCHEMA)},
        {"name": "legacy", "description": "", "parameters": dict(ANY_OBJECT_SCHEMA)},
    ]
    assert [dict(t) for t in model.requests[0].tools] == expected
    assert [dict(t) for t in model.requests[1].tools] == expected
    headers = [e for e in agent.session.events if type(e) is RequestHeader]
    assert len(headers) == 1 and list(headers[0].data.header.tools) == expected  # type: ignore[arg-type]
    results = [e for e in agent.session.events if e.type == "tool/result"]
    assert results[0].data.message.content[0].content[0].text == "5"  # type: ignore[union-attr]
    assert (agent.provider, agent.model) == ("scripted", "scripted")  # named by the adapter


async def test_function_tool_async_body_call_id_and_non_object_arguments() -> None:
    seen: list[str] = []

    async def send(to: str, call_id: str) -> dict[str, Any]:
        seen.append(call_id)
        return {"sent": to}

    tool = FunctionTool("send", send, with_call_id=True)
    assert await tool.run({"to": "x"}, "c9", CancelSignal()) == '{"sent": "x"}'
    assert seen == ["c9"]
    with pytest.raises(TypeError, match="expects a JSON object"):
        await tool.run([1], "c10", CancelSignal())


@pytest.mark.parametrize(
    ("parameters", "error", "match"),
    [
        ({"type": "array"}, ValueError, 'must have type "object"'),
        ([1], TypeError, "must be a JSON schema object"),
        ({"type": "object", "default": float("nan")}, ValueError, "plain JSON"),
    ],
)
def test_bad_parameter_schemas_are_refused_when_the_tool_is_built(parameters: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        FunctionTool("bad", add, parameters=parameters)
    with pytest.raises(error, match=match):
        AgentLoop(Host(), SessionStore(Host()), ScriptedAdapter([]), [ScriptedTool("bad", parameters=parameters)])


def test_tool_spec_needs_a_name_and_a_str_description() -> None:
    with pytest.raises(ValueError, match="non-empty str name"):
        tool_spec(object())
    with pytest.raises(TypeError, match="description must be a str"):
        tool_spec(ScriptedTool("x", description=3))  # type: ignore[arg-type]


def test_a_loop_without_names_says_how_to_name_it() -> None:
    class Anonymous:
        def stream(self, request: Any) -> Any:
            raise NotImplementedError

    with pytest.raises(ValueError, match="pass provider= and model="):
        AgentLoop(Host(), SessionStore(Host()), Anonymous())


@given(st.text(max_size=12))
def test_finish_kinds_are_validated_on_construction_and_decode(kind: str) -> None:
    wire = msgspec.json.encode({"type": "finish", "reason": {"kind": kind}})
    if kind in FINISH_KINDS:
        assert FinishReason(kind=kind).kind == kind
        assert msgspec.json.decode(wire, type=FinishChunk).reason.kind == kind
    else:
        with pytest.raises(ValueError, match="finish kind must be one of"):
            FinishReason(kind=kind)
        with pytest.raises(msgspec.ValidationError, match="finish kind must be one of"):
            msgspec.json.decode(wire, type=FinishChunk)


def test_a_stored_chunk_with_an_unknown_finish_kind_does_not_decode() -> None:
    line = {
        "type": "assistant/chunk",
        "seq": 0,
        "time": 1,
        "data": {"turn": 1, "step": 1, "chunk": {"type": "finish", "reason": {"kind": "banana"}}},
    }
    with pytest.raises(msgspec.ValidationError, match="finish kind"):
        msgspec.convert(line, AssistantChunk)


def _record(amount: int, call_id: str) -> str:
    return f"paid {amount}"


def _found(amount: int, call_id: str) -> None:
    return None


def _no_call_id(amount: int) -> str:
    return f"paid {amount}"


def test_a_check_without_the_call_id_in_the_body_is_refused_when_the_tool_is_built() -> None:
    # The body would record its effect under no call id, and the check would then say "did not happen".
    with pytest.raises(ToolDefinitionError, match="with_call_id=True"):
        FunctionTool("pay", _record, check=_found)
    assert FunctionTool("pay", _record, with_call_id=True, check=_found).reconcile is not None


@pytest.mark.parametrize(
    ("fn", "check", "what"),
    [
        (_no_call_id, None, "function"),
        (lambda amount: "paid", None, "function"),
        (_record, _no_call_id, "check"),
    ],
)
def test_a_function_that_takes_no_call_id_is_refused_when_the_tool_is_built(fn: Any, check: Any, what: str) -> None:
    with pytest.raises(ToolDefinitionError, match=f"the {what}.* no call_id parameter"):
        FunctionTool("pay", fn, with_call_id=True, check=check)


def test_call_id_as_a_keyword_or_through_kwargs_is_accepted() -> None:
    def keyword_only(amount: int, *, call_id: str) -> str:
        return "paid"

    def any_keywords(**kwargs: Any) -> str:
        return "paid"

    for fn in (keyword_only, any_keywords, lambda amount, call_id: "paid"):
        FunctionTool("pay", fn, with_call_id=True, check=fn)
    with pytest.raises(ToolDefinitionError):  # positional-only cannot be passed as call_id=
        FunctionTool("pay", lambda amount, call_id, /: "paid", with_call_id=True)
