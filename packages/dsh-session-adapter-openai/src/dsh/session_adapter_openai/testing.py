"""A scripted OpenAI-compatible chat server on loopback, for testing agents without a network or a key.

::

    with FakeChatServer([text_reply("Hello!")]) as server:
        model = OpenAIChatAdapter("fake-model", base_url=server.base_url, api_key="test", max_retries=0)
        ...
    server.requests[0]["messages"]  # what the adapter sent

The server speaks ``POST /v1/chat/completions`` (``stream=true``, server-sent events) on ``127.0.0.1`` in a thread
of its own, so it serves asyncio and trio clients alike. Each request gets the next scripted reply:

* :class:`StreamReply`: chunks as ``data:`` events, then ``data: [DONE]`` (or an ``error`` event, or an abrupt end);
  with ``hold=True`` it keeps the stream open after its chunks until the client goes away (``held`` and ``closed``
  events tell a test when each happened);
* :class:`StatusReply`: an HTTP error status with a JSON body and headers.

The chunk builders (:func:`text_reply`, :func:`tool_call_reply`, :func:`chunk`) write the OpenAI wire form.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = [
    "FakeChatServer",
    "StatusReply",
    "StreamReply",
    "chunk",
    "text_reply",
    "tool_call_reply",
    "usage_chunk",
]

#: How long a held stream waits for its client to go away before giving up (a test bound, not a timing promise).
HOLD_LIMIT_S = 60.0


def chunk(delta: Mapping[str, Any] | None = None, finish_reason: str | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with one choice carrying ``delta`` and ``finish_reason``."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake-model",
        "choices": [{"index": 0, "delta": dict(delta or {}), "finish_reason": finish_reason}],
    }


def usage_chunk(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    """The final usage-only chunk (``stream_options.include_usage``)."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake-model",
            "choices": [], "usage": usage}  # fmt: skip


@dataclass
class StreamReply:
    """A streamed reply: ``chunks`` as events, then ``[DONE]`` unless ``error`` or ``truncate`` or ``hold``."""

    chunks: Sequence[Mapping[str, Any]]
    error: Mapping[str, Any] | None = None
    truncate: bool = False
    hold: bool = False
    held: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)


@dataclass
class StatusReply:
    """An HTTP error: ``status`` with ``body`` (JSON) and extra ``headers``."""

    status: int
    body: Mapping[str, Any] = field(default_factory=lambda: {"error": {"message": "fake error", "type": "fake"}})
    headers: Mapping[str, str] = field(default_factory=dict)


Reply = StreamReply | StatusReply


def text_reply(text: str, *, finish: str = "stop", usage: tuple[int, int] | None = None) -> StreamReply:
    """``text`` streamed word by word, then ``finish`` (and a usage chunk when given)."""
    words = text.split(" ")
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": word if i == 0 else " " + word}) for i, word in enumerate(words)]
    chunks.append(chunk({}, finish))
    if usage is not None:
        chunks.append(usage_chunk(*usage))
    return StreamReply(chunks)


def tool_call_reply(calls: Iterable[tuple[str, str, Any]], *, pieces: int = 3) -> StreamReply:
    """Tool calls ``(id, name, arguments)`` streamed as the OpenAI API does: arguments split into ``pieces``."""
    chunks = [chunk({"role": "assistant", "content": None})]
    for index, (call_id, name, arguments) in enumerate(calls):
        text = json.dumps(arguments)
        step = max(1, -(-len(text) // pieces))
        parts = [text[i : i + step] for i in range(0, len(text), step)] or [""]
        for n, part in enumerate(parts):
            call: dict[str, Any] = {"index": index, "function": {"arguments": part}}
            if n == 0:
                call.update({"id": call_id, "type": "function"})
                call["function"]["name"] = name
            chunks.append(chunk({"tool_calls": [call]}))
    chunks.append(chunk({}, "tool_calls"))
    return StreamReply(chunks)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        owner = self.server.owner
        with owner._lock:
            owner.requests.append(body)
            owner.paths.append(self.path)
            owner.headers.append({k.lower(): v for k, v in self.headers.items()})
            reply = owner._script.popleft() if owner._script else None
        if not self.path.endswith("/chat/completions"):
            reply = StatusReply(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
        if reply is None:
            reply = StatusReply(500, {"error": {"message": "the fake server has no reply left", "type": "script"}})
        if isinstance(reply, StatusReply):
            self._status(reply)
        else:
            self._stream(reply)

    def _status(self, reply: StatusReply) -> None:
        data = json.dumps(dict(reply.body)).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, reply: StreamReply) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        try:
            for item in reply.chunks:
                self.wfile.write(b"data: " + json.dumps(dict(item)).encode() + b"\n\n")
                self.wfile.flush()
            if reply.hold:
                reply.held.set()
                deadline = time.monotonic() + HOLD_LIMIT_S
                while time.monotonic() < deadline:
                    self.wfile.write(b": keep-alive\n\n")  # fails once the client has closed the stream
                    self.wfile.flush()
                    time.sleep(0.02)
                return
            if reply.error is not None:
                self.wfile.write(b"data: " + json.dumps({"error": dict(reply.error)}).encode() + b"\n\n")
            elif not reply.truncate:
                self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except OSError:
            reply.closed.set()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: FakeChatServer


class FakeChatServer:
    """The scripted server (see the module docstring); a context manager that starts and stops it."""

    def __init__(self, replies: Iterable[Reply] = ()) -> None:
        self._script: deque[Reply] = deque(replies)
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def add(self, *replies: Reply) -> None:
        """Append replies to the script."""
        with self._lock:
            self._script.extend(replies)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1`` (the ``base_url`` of an ``openai`` client)."""
        if self._server is None:
            raise RuntimeError("the fake server is not running")
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> FakeChatServer:
        """Listen on a free loopback port and serve in a daemon thread."""
        server = _Server(("127.0.0.1", 0), _Handler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> FakeChatServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
