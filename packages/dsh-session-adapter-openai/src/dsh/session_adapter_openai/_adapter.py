"""The OpenAI-compatible chat adapter: one streamed ``/chat/completions`` call per model request."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any

import anyio
import openai
from dsh.session_persistence.events import FinishChunk, FinishReason, LlmFailure, StreamChunk
from dsh.session_persistence.loop import ModelRequest

from ._translate import (
    ChunkTranslator,
    chat_messages,
    chat_tools,
    provider_failure,
    sse_payloads,
    stream_failure,
    transport_failure,
)

__all__ = ["OpenAIChatAdapter"]


class OpenAIChatAdapter:
    """A model adapter for any OpenAI-compatible chat-completions endpoint (OpenAI, DeepSeek, vLLM, Ollama...).

    :param model: The model name sent to the endpoint (and recorded in the session).
    :param base_url: The endpoint's base URL (e.g. ``http://localhost:11434/v1``); default: the ``openai`` SDK's
        (``OPENAI_BASE_URL`` or OpenAI's).
    :param api_key: The key; default: ``OPENAI_API_KEY``.
    :param client: A ready ``openai.AsyncOpenAI`` to use instead (then ``base_url``, ``api_key``, ``max_retries``
        and ``timeout`` are not used, and :meth:`aclose` leaves it open).
    :param provider: The provider name recorded in the session.
    :param max_retries: The SDK's retries of failed requests (default 2).
    :param timeout: The SDK's request timeout in seconds.
    :param include_usage: Ask for a final usage chunk (``stream_options.include_usage``); some servers refuse it.
    :param options: Further request parameters sent as they are (``temperature``, ``max_tokens``, ...).

    Each model request is one streamed call. Text and tool-call deltas are forwarded as they arrive; at the end
    every block is closed, then usage and the finish reason follow. Provider failures (HTTP status, connection,
    timeout, an error inside the stream) end the stream with ``finish{error}`` and a stable code; a cancelled turn
    closes the HTTP stream.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: openai.AsyncOpenAI | None = None,
        provider: str = "openai-compatible",
        max_retries: int = 2,
        timeout: float | None = None,
        include_usage: bool = True,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty str")
        if not isinstance(provider, str) or not provider:
            raise ValueError("provider must be a non-empty str")
        reserved = {"model", "messages", "tools", "stream", "stream_options"} & set(options or {})
        if reserved:
            raise ValueError(f"options must not set {', '.join(sorted(reserved))} (the adapter sets them)")
        self.model = model
        self.provider = provider
        self.include_usage = include_usage
        self.options: dict[str, Any] = dict(options or {})
        self._owns_client = client is None
        if client is None:
            extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
            client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=max_retries, **extra)
        self.client = client

    async def aclose(self) -> None:
        """Close the HTTP client if this adapter created it."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> OpenAIChatAdapter:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of the ``chat.completions.create`` call for ``request``."""
        body: dict[str, Any] = dict(self.options)
        body["model"] = self.model
        body["messages"] = chat_messages(request.system, request.messages)
        if request.tools:
            body["tools"] = chat_tools(request.tools)
        body["stream"] = True
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        return body

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """Stream one chat completion as dsh chunks (see the class docstring)."""
        translator = ChunkTranslator()
        create: Any = self.client.chat.completions.with_streaming_response.create
        manager = create(**self.request_body(request))
        try:
            raw = await manager.__aenter__()
        except openai.OpenAIError as exc:
            refused = provider_failure(exc)
            assert refused is not None
            yield FinishChunk(reason=FinishReason(kind="error", error=refused))
            return
        # The SSE body is read here, to its end, rather than through the SDK's stream object: that one stops at
        # [DONE] without closing its inner generators, which trio reports as leaked.
        lines: AsyncIterator[str] = raw.http_response.aiter_lines()
        payloads = sse_payloads(lines)
        failure: LlmFailure | None = None
        try:
            try:
                async for payload in payloads:
                    if failure is not None:
                        continue  # an error event came first; read on to the end of the body
                    error = payload.get("error") if isinstance(payload, dict) else None
                    if error:
                        failure = stream_failure(error)
                        continue
                    for out in translator.feed(payload):
                        yield out
                    if request.signal.aborted:
                        break
            except ValueError as exc:
                failure = LlmFailure(message=f"malformed stream event: {exc}", code="PROVIDER_ERROR")
            except Exception as exc:
                failure = provider_failure(exc) or transport_failure(exc)
                if failure is None:
                    raise
        finally:
            # A normal end, a provider error and a cancelled turn alike: close the HTTP stream, then let the line
            # reader run into the closed stream so every generator under it finishes instead of being leaked.
            with anyio.CancelScope(shield=True):
                await payloads.aclose()  # type: ignore[attr-defined]
                await raw.close()
                await _finish(lines)
                await manager.__aexit__(None, None, None)
        if request.signal.aborted:
            aborted = LlmFailure(message=f"cancelled: {request.signal.reason!r}", code="ABORTED")
            yield FinishChunk(reason=FinishReason(kind="aborted", error=aborted))
            return
        for out in translator.finish(failure):
            yield out

    def __repr__(self) -> str:
        return f"<OpenAIChatAdapter {self.provider}/{self.model} {self.client.base_url}>"


async def _finish(lines: AsyncIterator[str]) -> None:
    """Drive ``lines`` to its end (on a closed stream it raises at once); what it raises is not news any more."""
    try:
        async for _ in lines:
            pass
    except Exception:
        pass
