"""Realistic session builders shared by the JSONL backend tests (pure data, no I/O)."""

from __future__ import annotations

import random
from typing import Any

from dsh.session_persistence.backend import SessionEvent, SessionHeader, StorageMetadata, decode_event

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "the",
    "agent",
    "reads",
    "files,",
    "plans",
    "edits",
    "and",
    "runs",
    "the",
    "test",
    "suite;",
    "résumé",
    "naïve",
    "开发",
    "ok",
]


def header(session_id: str = "s1", cwd: str | None = "/home/me/project", **extra: Any) -> SessionHeader:
    kwargs: dict[str, Any] = {"id": session_id, "created_at": 1_700_000_000_000, **extra}
    if cwd is not None:
        kwargs["cwd"] = cwd
    return SessionHeader(**kwargs)


def storage(
    session_id: str = "s1", cwd: str | None = "/home/me/project", cut: int = 0, **extra: Any
) -> StorageMetadata:
    return StorageMetadata(header(session_id, cwd, **extra), cut)


class Builder:
    """Appends wire-form events with contiguous seqs and increasing times."""

    def __init__(self, start_seq: int = 0, seed: int = 1) -> None:
        self.events: list[SessionEvent] = []
        self.seq = start_seq
        self.time = 1_700_000_000_000 + start_seq * 7
        self.rng = random.Random(seed)

    def add(self, etype: str, data: dict[str, Any], **envelope: Any) -> SessionEvent:
        self.time += self.rng.randint(1, 40)
        event = decode_event({"type": etype, "seq": self.seq, "time": self.time, "data": data, **envelope})
        self.seq += 1
        self.events.append(event)
        return event

    def turn_start(self, turn: int) -> None:
        self.add("turn/start", {"turn": turn})

    def turn_end(self, turn: int) -> None:
        self.add("turn/end", {"turn": turn, "reason": {"kind": "completed"}})

    def user(self, turn: int, text: str) -> None:
        msg = {
            "id": f"u{turn}",
            "role": "user",
            "content": [{"type": "text", "text": text}],
            "source": {"kind": "user"},
        }
        self.add("user/message", msg, surfaceOp="append")

    def request_header(self) -> None:
        tools = [
            {"name": n, "description": f"{n} tool", "parameters": {"type": "object"}} for n in ("read", "edit", "bash")
        ]
        header = {
            "config": {"provider": "openai", "model": "gpt-x"},
            "system": "You are a careful agent. " * 8,
            "tools": tools,
        }
        self.add("request/header", {"header": header, "reason": "initial"})

    def step(self, turn: int, step: int, *, tokens: int = 40, tool: bool = True) -> None:
        self.add("step/start", {"turn": turn, "step": step})
        base = {"turn": turn, "step": step}
        self.add("assistant/chunk", {**base, "chunk": {"type": "block-start", "index": 0, "blockType": "text"}})
        pieces = []
        for _ in range(tokens):
            piece = self.rng.choice(WORDS) + " "
            pieces.append(piece)
            self.add("assistant/chunk", {**base, "chunk": {"type": "text-delta", "index": 0, "text": piece}})
        text = "".join(pieces)
        block = {"type": "text", "text": text}
        self.add("assistant/chunk", {**base, "chunk": {"type": "block-end", "index": 0, "block": block}})
        content: list[dict[str, Any]] = [block]
        call_id = f"call-{turn}-{step}"
        if tool:
            args = ['{"path', '": "src/', "main", '.py"}']
            for i, part in enumerate(args):
                chunk = {"type": "tool-call-delta", "index": 1, "id": call_id, "argumentsDelta": part}
                if i == 0:
                    chunk["name"] = "read"
                self.add("assistant/chunk", {**base, "chunk": chunk})
            content.append({"type": "tool-call", "id": call_id, "name": "read", "arguments": "".join(args)})
        usage = {"inputTokens": 1200, "outputTokens": tokens}
        self.add("assistant/chunk", {**base, "chunk": {"type": "usage", "usage": usage}})
        self.add(
            "assistant/chunk",
            {**base, "chunk": {"type": "finish", "reason": {"kind": "tool-calls" if tool else "stop"}}},
        )
        message = {
            "id": f"a{turn}-{step}",
            "role": "assistant",
            "content": content,
            "source": {"kind": "model", "provider": "openai", "model": "gpt-x"},
        }
        self.add("assistant/message", {**base, "message": message, "usage": usage}, surfaceOp="append")
        if tool:
            self.add("tool/call", {**base, "callId": call_id, "name": "read", "arguments": "".join(args)})
            result = {
                "id": f"r{turn}-{step}",
                "role": "user",
                "content": [
                    {
                        "type": "tool-result",
                        "toolCallId": call_id,
                        "content": [{"type": "text", "text": "def main():\n    return 42\n" * 3}],
                    }
                ],
                "source": {"kind": "tool", "callId": call_id},
            }
            self.add("tool/result", {**base, "message": result}, surfaceOp="append")
        self.add("step/end", {"turn": turn, "step": step})

    def turn(self, turn: int, *, steps: int = 2, tokens: int = 40) -> None:
        self.turn_start(turn)
        if turn == 0:
            self.request_header()
        self.user(turn, f"please do task {turn}: " + " ".join(self.rng.choice(WORDS) for _ in range(20)))
        for s in range(steps):
            self.step(turn, s, tokens=tokens, tool=s < steps - 1)
        self.turn_end(turn)


def session_events(turns: int = 3, *, steps: int = 2, tokens: int = 40, seed: int = 1) -> list[SessionEvent]:
    """A realistic balanced log: request header, user messages, streamed steps with tool calls."""
    b = Builder(seed=seed)
    for t in range(turns):
        b.turn(t, steps=steps, tokens=tokens)
    return b.events


def turn_batches(turns: int = 3, **kw: Any) -> list[list[SessionEvent]]:
    """The same log cut into one batch per turn (how write-behind typically flushes)."""
    events = session_events(turns, **kw)
    batches: list[list[SessionEvent]] = []
    current: list[SessionEvent] = []
    for event in events:
        current.append(event)
        if event.type == "turn/end":
            batches.append(current)
            current = []
    if current:
        batches.append(current)
    return batches
