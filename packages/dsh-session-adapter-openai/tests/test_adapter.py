"""The adapter against a scripted OpenAI-compatible server on loopback (real HTTP, the real ``openai`` SDK)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.to_thread
import dsh.session_checkpoint_policy  # noqa: F401 - the front-door test needs a checkpoint policy installed
import pytest
from dsh.session_adapter_openai import OpenAIChatAdapter
from dsh.session_adapter_openai.testing import (
    FakeChatServer,
    StatusReply,
    StreamReply,
    chunk,
    text_reply,
    tool_call_reply,
    usage_chunk,
)
from dsh.session_persistence import Host, SessionStore, ToolExecutionResult, open_sessions
from dsh.session_persistence.events import (
    AssistantChunk,
    AssistantMessage,
    ReasoningBlock,
    StreamChunk,
    TextBlock,
    TextDeltaChunk,
    ToolCallBlock,
)
from dsh.session_persistence.loop import AgentLoop, CancelSignal, FunctionTool, ModelRequest, TurnResult

pytestmark = pytest.mark.anyio

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    with FakeChatServer() as fake:
        yield fake


def adapter(server: FakeChatServer, **kw: Any) -> OpenAIChatAdapter:
    return OpenAIChatAdapter("fake-model", base_url=server.base_url, api_key="test-key", max_retries=0, **kw)


async def one_turn(
    model: OpenAIChatAdapter, text: str = "hi", tools: list[Any] | None = None
) -> tuple[AgentLoop, TurnResult]:
    agent = AgentLoop(Host(), SessionStore(Host()), model, tools or [], system="Be brief.")
    with anyio.fail_after(30):
        result = await agent.run_turn(text)
    return agent, result


def chunk_types(agent: AgentLoop) -> list[str]:
    return [e.data.chunk.__struct_config__.tag for e in agent.session.events if type(e) is AssistantChunk]  # type: ignore[union-attr]


async def test_text_usage_and_stop_and_what_is_sent(server: FakeChatServer) -> None:
    server.add(text_reply("Hello there friend", usage=(12, 3)))
    async with adapter(server) as model:
        agent, result = await one_turn(model)
    assert (result.reason.kind, result.text) == ("completed", "Hello there friend")
    assert [(u.input_tokens, u.output_tokens) for u in result.usage] == [(12, 3)]
    assert chunk_types(agent) == ["block-start", *["text-delta"] * 3, "block-end", "usage", "finish"]
    (body,) = server.requests
    assert body["model"] == "fake-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert "tools" not in body
    assert server.headers[0]["authorization"] == "Bearer test-key"
    assert (agent.provider, agent.model) == ("openai-compatible", "fake-model")


async def test_streamed_tool_calls_run_and_go_back_as_tool_messages(server: FakeChatServer) -> None:
    server.add(
        tool_call_reply([("call_a", "get_weather", {"city": "Lisbon"}), ("call_b", "get_weather", {"city": "Oslo"})]),
        text_reply("Lisbon is sunny, Oslo is cold."),
    )
    seen: list[str] = []

    def weather(city: str) -> str:
        seen.append(city)
        return {"Lisbon": "sunny", "Oslo": "cold"}[city]

    tool = FunctionTool("get_weather", weather, "Current weather of a city.", CITY)
    async with adapter(server) as model:
        agent, result = await one_turn(model, "Weather in Lisbon and Oslo?", [tool])
    assert (result.reason.kind, result.text) == ("completed", "Lisbon is sunny, Oslo is cold.")
    assert seen == ["Lisbon", "Oslo"]
    first, second = server.requests
    assert first["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Current weather of a city.", "parameters": CITY},
        }
    ]
    calls = [b for e in agent.session.events if type(e) is AssistantMessage for b in e.data.message.content]
    assert [b for b in calls if isinstance(b, ToolCallBlock)] == [
        ToolCallBlock(id="call_a", name="get_weather", arguments='{"city": "Lisbon"}'),
        ToolCallBlock(id="call_b", name="get_weather", arguments='{"city": "Oslo"}'),
    ]
    assert second["messages"][2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
            },
            {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        ],
    }
    assert second["messages"][3:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "cold"},
    ]


async def test_text_blocks_of_one_result_stay_separate_in_the_tool_message(server: FakeChatServer) -> None:
    # A reconciliation finding reaches the model as a text block before the tool's own result: glued together it
    # read "...for the same purpose.sent 100 EUR". Each block ends where the model can see it end.
    server.add(tool_call_reply([("call_a", "send", {"city": "Oslo"})]), text_reply("Done."))

    def send(city: str) -> ToolExecutionResult:
        blocks = ({"type": "text", "text": "Do not repeat it for the same purpose."}, {"type": "text", "text": "sent"})
        return ToolExecutionResult(content=blocks)

    async with adapter(server) as model:
        _, result = await one_turn(model, "Send it.", [FunctionTool("send", send, "Send.", CITY)])
    assert result.reason.kind == "completed"
    assert server.requests[1]["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_a",
        "content": "Do not repeat it for the same purpose.\n\nsent",
    }


@pytest.mark.parametrize(
    ("reply", "kind", "code"),
    [
        (text_reply("cut", finish="length"), "max-tokens", None),
        (text_reply("filtered", finish="content_filter"), "error", "CONTENT_FILTER"),
        (StreamReply([chunk({"content": "half"})]), "error", "INCOMPLETE_STREAM"),
        (
            StreamReply([chunk({"content": "half"})], error={"message": "overloaded", "type": "server_error"}),
            "error",
            "PROVIDER_ERROR",
        ),
    ],
    ids=["length", "content-filter", "no-finish", "error-event"],
)
async def test_finish_reasons_and_stream_errors(
    server: FakeChatServer, reply: StreamReply, kind: str, code: str | None
) -> None:
    server.add(reply)
    async with adapter(server) as model:
        _, result = await one_turn(model)
    assert result.reason.kind == kind
    assert (result.reason.error.code if result.reason.error else None) == code


@pytest.mark.parametrize(
    ("status", "headers", "code"),
    [
        (429, {"retry-after": "2", "x-request-id": "req-42"}, "RATE_LIMIT"),
        (401, {}, "AUTHENTICATION"),
        (403, {}, "PERMISSION_DENIED"),
        (404, {}, "NOT_FOUND"),
        (400, {}, "BAD_REQUEST"),
        (422, {}, "BAD_REQUEST"),
        (500, {}, "PROVIDER_ERROR"),
        (503, {"retry-after-ms": "1500"}, "PROVIDER_ERROR"),
    ],
)
async def test_http_errors_become_typed_failures(
    server: FakeChatServer, status: int, headers: dict[str, str], code: str
) -> None:
    server.add(StatusReply(status, {"error": {"message": f"fake {status}", "type": "x"}}, headers))
    async with adapter(server) as model:
        _, result = await one_turn(model)
    failure = result.reason.error
    assert result.reason.kind == "error" and failure is not None
    assert (failure.code, failure.status) == (code, status)
    assert "fake" in failure.message
    if status == 429:
        assert (failure.request_id, failure.provider_retry_after_ms) == ("req-42", 2000)
    if status == 503:
        assert failure.provider_retry_after_ms == 1500


async def test_connection_refused_is_a_connection_failure() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the request: nothing listens there
    async with OpenAIChatAdapter("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0) as model:
        _, result = await one_turn(model)
    assert result.reason.kind == "error" and result.reason.error is not None
    assert result.reason.error.code == "CONNECTION"


class FirstText:
    """Wraps an adapter; ``seen`` is set once the first text delta went through to the loop."""

    def __init__(self, inner: OpenAIChatAdapter) -> None:
        self.inner = inner
        self.provider, self.model = inner.provider, inner.model
        self.seen = anyio.Event()

    async def stream(self, request: Any) -> AsyncIterator[StreamChunk]:
        chunks = self.inner.stream(request)
        try:
            async for item in chunks:
                yield item
                if isinstance(item, TextDeltaChunk):
                    self.seen.set()
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]


async def test_cancelling_the_turn_closes_the_http_stream(server: FakeChatServer) -> None:
    held = StreamReply([chunk({"content": "thinking"})], hold=True)
    server.add(held)
    async with adapter(server) as model:
        watched = FirstText(model)
        agent = AgentLoop(Host(), SessionStore(Host()), watched)

        async def cancel_after_first_text() -> None:
            await watched.seen.wait()
            agent.cancel("user")

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_after_first_text)
            with anyio.fail_after(30):
                result = await agent.run_turn("hi")
        # Still inside the client's lifetime: the stream itself was closed, not the whole client.
        assert await anyio.to_thread.run_sync(held.closed.wait, 30)  # the server saw the stream go away
    assert result.reason.kind == "aborted"
    partial = [e for e in agent.session.events if type(e) is AssistantMessage]
    assert partial[0].data.interrupted is True and partial[0].data.message.content == (TextBlock(text="thinking"),)


async def test_reasoning_is_stored_and_not_sent_back(server: FakeChatServer) -> None:
    server.add(
        StreamReply(
            [
                chunk({"reasoning_content": "Let me think."}),
                chunk({"content": "42"}),
                chunk({}, "stop"),
                usage_chunk(5, 7, cached=3),
            ]
        ),
        text_reply("again 42"),
    )
    async with adapter(server) as model:
        agent, result = await one_turn(model)
        assert result.text == "42" and result.usage[0].cache_read_tokens == 3
        message = next(e for e in agent.session.events if type(e) is AssistantMessage)
        assert message.data.message.content == (ReasoningBlock(text="Let me think."), TextBlock(text="42"))
        with anyio.fail_after(30):
            await agent.run_turn("again")
    assert server.requests[1]["messages"][2] == {"role": "assistant", "content": "42"}


async def test_through_the_front_door_with_options(server: FakeChatServer) -> None:
    server.add(text_reply("stored"))
    model = adapter(server, options={"temperature": 0.5}, include_usage=False)
    async with model, open_sessions(backend="memory") as sessions:
        agent = await sessions.create("s1", model)
        assert (await agent.run_turn("hi")).text == "stored"
        view = await sessions.inspect("s1")
    assert view.events[-1].type == "turn/end"
    assert server.requests[0]["temperature"] == 0.5 and "stream_options" not in server.requests[0]


def test_bad_construction_is_refused() -> None:
    with pytest.raises(ValueError, match="model must be"):
        OpenAIChatAdapter("", api_key="k")
    with pytest.raises(ValueError, match="must not set messages, stream"):
        OpenAIChatAdapter("m", api_key="k", options={"stream": False, "messages": []})


async def test_a_cooperative_abort_ends_the_stream_and_closes_it(server: FakeChatServer) -> None:
    """Driven directly (no loop racing it natively): an aborted signal stops the read and closes the stream."""
    held = StreamReply([chunk({"content": "thinking"})], hold=True)
    server.add(held)
    signal = CancelSignal()
    request = ModelRequest(session_id=None, messages=(), config={}, signal=signal)
    kinds: list[str] = []
    async with adapter(server) as model:
        stream = model.stream(request)
        with anyio.fail_after(30):
            async for item in stream:
                kinds.append(item.__struct_config__.tag)
                if isinstance(item, TextDeltaChunk):
                    signal.abort("user")
        assert await anyio.to_thread.run_sync(held.closed.wait, 30)  # closed by the adapter, the client lives on
    assert kinds == ["block-start", "text-delta", "finish"]
