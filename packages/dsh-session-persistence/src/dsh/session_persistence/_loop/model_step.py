"""The model half of an agent step: log the request header and context, stream the model's answer through the
``llm_stream`` boundary into ``assistant/chunk`` events, record the ``assistant/message``, then hand its tool calls
to the tool half (:class:`~.tool_calls.ToolSteps`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

import anyio
from msgspec import UNSET

from .._host.boundaries import CancelSignal, ModelRequest, TurnAborted
from .._model.events import (
    BlockEndChunk,
    BlockStartChunk,
    FinishChunk,
    FinishReason,
    ReasoningDeltaChunk,
    RequestContext,
    RequestContextData,
    StreamChunk,
    TextDeltaChunk,
    ToolCallDeltaChunk,
    UsageChunk,
)
from .latest import LatestOfType
from .protocols import LlmError, _aclose, _builtins

if TYPE_CHECKING:
    from .._host.host import Host
    from .._host.session import Session

__all__ = ["Assembler", "ModelSteps"]


class Assembler:
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


class ModelSteps:
    """The model-request part of :class:`~dsh.session_persistence.loop.AgentLoop` (a mixin holding no state)."""

    host: Host
    provider: str
    model: str
    system: str | None
    _session: Session
    _tool_specs: tuple[Any, ...]
    _requested: bool
    #: The log's last ``request/context`` event, looked for only among the events appended since the last step.
    _context_scan: LatestOfType[RequestContext]

    #: The tool half of the step (``ToolSteps._run_tools`` in AgentLoop); declared, never defined here.
    _run_tools: Callable[[int, int, list[dict[str, Any]], CancelSignal], Awaitable[None]]

    def _log_request(self) -> None:
        session = self._session
        previous = session.request_header()
        header: dict[str, Any] = {"config": {"provider": self.provider, "model": self.model}}
        if self.system is not None:
            header["system"] = self.system
        if self._tool_specs:
            header["tools"] = [dict(spec) for spec in self._tool_specs]
        if not self._requested:
            self._requested = True
            session.append("request/header", {"header": header, "reason": "initial" if previous is None else "resume"})
        elif previous is None or _builtins(previous) != header:
            session.append("request/header", {"header": header, "reason": "change"})
        context = self._request_context()
        if context is None or (context.provider, context.model) != (self.provider, self.model):
            session.append("request/context", {"provider": self.provider, "model": self.model})

    def _request_context(self) -> RequestContextData | None:
        """The request context in force: the data of the log's last ``request/context`` event.

        Scans only the events appended since the last call (a step used to walk the whole log back to the context
        logged in the first turn: quadratic over a long session); a log cut since (``truncate``) is scanned again.
        """
        found = self._context_scan.find(self._session)
        return None if found is None else found.data

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
            tools=self._tool_specs,
        )
        stream = self.host.llm_stream(request)
        assembler = Assembler()
        chunk_seqs: list[int] = []
        error: Exception | None = None
        try:
            signal.raise_if_aborted()
        except TurnAborted:
            # Never iterated: dispose of the unstarted chain.
            await _aclose(stream)
            raise

        async def watch(scope: anyio.CancelScope) -> None:
            # Race the iteration against the cooperative signal, so a hanging adapter stops.
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
