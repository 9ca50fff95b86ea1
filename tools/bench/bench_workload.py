"""The benchmark workload (section 1): wire-form events and the checkpoint policy's durable points."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

FLUSH = None  # a durable point in the op list
Op = dict[str, Any] | None
CWD = "/home/bench/project"
SESSION_ID = "bench-session"


# --------------------------------------------------------------------------------------------------------------
# The workload


_SYLLABLES = (
    "ka",
    "to",
    "re",
    "mi",
    "su",
    "na",
    "lo",
    "ve",
    "di",
    "pa",
    "ro",
    "te",
    "ni",
    "gu",
    "sha",
    "ber",
    "con",
    "ter",
    "ing",
    "ment",
    "tion",
    "ex",
    "pre",
    "dis",
    "un",
    "fi",
    "le",
    "mo",
)


def _vocabulary(rng: random.Random, size: int = 4000) -> list[str]:
    """Pseudo-words (so text compresses like prose, not like a ten-word loop), most frequent first."""
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(size)]
    return [*["the", "a", "of", "to", "and", "in", "is", "it", "that", "for"], *words, "résumé", "naïve", "开发"]


_VOCAB = _vocabulary(random.Random(1))
_WEIGHTS = [1.0 / (rank + 1) for rank in range(len(_VOCAB))]  # Zipf: word frequencies of natural text


def _words(rng: random.Random, count: int) -> list[str]:
    return rng.choices(_VOCAB, _WEIGHTS, k=count)


def _text(rng: random.Random, size: int) -> str:
    out: list[str] = []
    n = 0
    while n < size:
        batch = _words(rng, 16)
        out.extend(batch)
        n += sum(len(w.encode()) + 1 for w in batch)
    return " ".join(out)


def _code(rng: random.Random, size: int) -> str:
    """A tool result that looks like source code (compresses like real tool output, not like a repeated string)."""
    lines: list[str] = []
    n = 0
    while n < size:
        indent = "    " * rng.randint(0, 3)
        name, func, arg = _words(rng, 3)
        line = f"{indent}{name}_{rng.randint(0, 99)} = {func}({arg}, {rng.randint(0, 10**4)})"
        lines.append(line)
        n += len(line.encode()) + 1
    return "\n".join(lines)


def _tokens(text: str) -> list[str]:
    words = text.split(" ")
    return [w + " " for w in words[:-1]] + [words[-1]]


@dataclass
class _Seqs:
    seq: int = 0
    time: int = 1_700_000_000_000

    def env(self, etype: str, data: dict[str, Any], **extra: Any) -> dict[str, Any]:
        self.time += 3
        out = {"type": etype, "seq": self.seq, "time": self.time, "data": data, **extra}
        self.seq += 1
        return out


def workload(turns: int, seed: int = 7, first_turn: int = 1) -> list[Op]:
    """The benchmark workload: wire-form events (with seq/time) and ``FLUSH`` at the checkpoint policy's barriers.

    Per turn: ``turn/start``, [pre-step barrier], ``step/start``, ``user/message``, (first turn: request header and
    context), [before-request barrier], token-sized ``assistant/chunk`` events (text ~800 B, then two tool-call
    blocks, usage, finish), ``assistant/message`` (~1 KB), then per tool call: ``tool/call``, [before-tool-body
    barrier], ``tool/result`` (~2 KB); ``step/end``, ``turn/end``. A final barrier closes the run.
    """
    rng = random.Random(seed)
    s = _Seqs()
    ops: list[Op] = []
    for turn in range(first_turn, first_turn + turns):
        step = 1
        base = {"turn": turn, "step": step}
        ops.append(s.env("turn/start", {"turn": turn}))
        ops.append(FLUSH)  # agent_pre_step
        ops.append(s.env("step/start", dict(base)))
        user = {
            "id": f"user-{turn}-0",
            "role": "user",
            "content": [{"type": "text", "text": _text(rng, 200)}],
            "source": {"kind": "user"},
        }
        ops.append(s.env("user/message", user, surfaceOp="append"))
        if turn == first_turn:
            header = {
                "config": {"provider": "openai", "model": "gpt-bench"},
                "system": _text(rng, 1500),
                "tools": [{"name": name} for name in ("read_file", "run_tests")],
            }
            ops.append(s.env("request/header", {"header": header, "reason": "initial"}))
            ops.append(s.env("request/context", {"provider": "openai", "model": "gpt-bench"}))
        ops.append(FLUSH)  # llm_stream, before the first pull
        chunk_seqs: list[int] = []

        def chunk(payload: dict[str, Any], base: dict[str, Any] = base, chunk_seqs: list[int] = chunk_seqs) -> None:
            event = s.env("assistant/chunk", {**base, "chunk": payload})
            chunk_seqs.append(event["seq"])
            ops.append(event)

        text = _text(rng, 800)
        chunk({"type": "block-start", "index": 0, "blockType": "text"})
        for token in _tokens(text):
            chunk({"type": "text-delta", "index": 0, "text": token})
        chunk({"type": "block-end", "index": 0, "block": {"type": "text", "text": text}})
        calls = []
        for index, name in ((1, "read_file"), (2, "run_tests")):
            call_id = f"call-{turn}-{index}"
            arguments = json.dumps({"path": f"src/module_{rng.randint(0, 99)}.py", "limit": 400})
            chunk({"type": "block-start", "index": index, "blockType": "tool-call"})
            chunk({"type": "tool-call-delta", "index": index, "id": call_id, "name": name, "argumentsDelta": ""})
            for piece in (arguments[:10], arguments[10:25], arguments[25:]):
                chunk({"type": "tool-call-delta", "index": index, "id": call_id, "argumentsDelta": piece})
            block = {"type": "tool-call", "id": call_id, "name": name, "arguments": arguments}
            chunk({"type": "block-end", "index": index, "block": block})
            calls.append(block)
        usage = {"inputTokens": 1200 + 40 * turn, "outputTokens": 180}
        chunk({"type": "usage", "usage": usage})
        chunk({"type": "finish", "reason": {"kind": "tool-calls"}})
        message = {
            "id": f"assistant-{turn}-{step}",
            "role": "assistant",
            "content": [{"type": "text", "text": text}, *calls],
            "source": {"kind": "model", "provider": "openai", "model": "gpt-bench"},
        }
        ops.append(
            s.env(
                "assistant/message",
                {**base, "message": message, "usage": usage},
                surfaceOp="append",
                sourceEventSeqs=chunk_seqs,
            )
        )
        for block in calls:
            call = s.env(
                "tool/call", {**base, "callId": block["id"], "name": block["name"], "arguments": block["arguments"]}
            )
            ops.append(call)
            ops.append(FLUSH)  # tools_execute, before the tool body
            result = {
                "id": f"tool-result-{block['id']}",
                "role": "user",
                "content": [
                    {
                        "type": "tool-result",
                        "toolCallId": block["id"],
                        "content": [{"type": "text", "text": _code(rng, 2000)}],
                    }
                ],
                "source": {"kind": "tool", "callId": block["id"]},
            }
            ops.append(
                s.env("tool/result", {**base, "message": result}, surfaceOp="append", sourceEventSeqs=[call["seq"]])
            )
        ops.append(s.env("step/end", dict(base)))
        ops.append(s.env("turn/end", {"turn": turn, "reason": {"kind": "completed"}}))
    ops.append(FLUSH)  # end of run
    return ops


def batches(ops: list[Op]) -> Iterator[list[dict[str, Any]]]:
    """The events between consecutive durable points (empty batches skipped)."""
    pending: list[dict[str, Any]] = []
    for op in ops:
        if op is FLUSH:
            if pending:
                yield pending
                pending = []
        else:
            pending.append(op)
    if pending:
        yield pending


_json_encoder = msgspec.json.Encoder()


def raw_json_bytes(events: list[dict[str, Any]]) -> int:
    """Size of the events as plain JSONL (one compact JSON object per line): the "raw JSON" unit."""
    return sum(len(_json_encoder.encode(e)) + 1 for e in events)
