"""Continuation child: a payment agent on the JSONL backend, SIGKILLed by the parent at a named point.

Usage: ``python continue_child.py <phase> <root> <marker> [--backend B] [--compression C] [--check KIND]
[--kill-in WHERE]``

* ``start``: create the session, run turn 1 ("charge 20 EUR, then notify"); the model calls ``charge`` then
  ``notify``; ``charge`` writes ``ledger/<call id>`` (O_EXCL: a second charge under one id fails loudly).
* ``resume``: ``AgentLoop.resume`` (which reconciles), then ``continue_interrupted`` while there is an interrupted
  turn; writes ``result.json`` (the findings, each continuation's turn and reason) when it returns.

``--kill-in charge|check|notify``: the point where the child writes ``<where>`` to the marker and blocks (the
parent SIGKILLs it): inside ``charge`` after the ledger write, inside the charge check, inside ``notify`` after the
outbox write, right after ``resume`` returned (``resumed``). ``--check ok|raise|hang|cannot-tell|none`` chooses what ``charge``'s reconciliation check does (none:
the tool offers no check). Every model request's messages are appended to ``requests.jsonl`` (one JSON line per
request, written before the answer streams), so the parent sees what the model was shown.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
from dsh.session_persistence import Host, ModelRequest, PersistenceCoordinator, SessionStore
from dsh.session_persistence.events import StreamChunk
from dsh.session_persistence.loop import AgentLoop, FunctionTool, Reconciliation
from dsh.session_persistence.testing import TextResponse, ToolCallResponse

SESSION_ID = "continue-crash"


def write_once(path: Path, text: str, *, mode: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> None:
    fd = os.open(path, mode, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def append_line(path: Path, line: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


class PaymentsModel:
    """Decides from what it is shown: charge and notify first; after the charge's result, notify; then done."""

    provider = "scripted"
    model = "payments"

    def __init__(self, root: Path) -> None:
        self.root = root

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return self._play(request)

    async def _play(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        append_line(self.root / "requests.jsonl", msgspec.json.encode(list(request.messages)))
        results = [
            block
            for message in request.messages
            for block in message.content
            if getattr(block, "tool_call_id", None) is not None
        ]
        notified = any(b.tool_call_id.startswith("notify") and not b.is_error for b in results)  # type: ignore[attr-defined]
        if not results:
            response: Any = ToolCallResponse(
                (("charge-1", "charge", {"amount_eur": 20}), ("notify-1", "notify", {"to": "you@example.com"}))
            )
        elif not notified:
            response = ToolCallResponse(((f"notify-{len(request.messages)}", "notify", {"to": "you@example.com"}),))
        else:
            response = TextResponse("Paid once and notified.")
        for chunk in response.chunks():
            await anyio.lowlevel.checkpoint()
            yield chunk


async def block(marker: Path, where: str) -> None:
    write_once(marker, where)
    await anyio.sleep_forever()


def tools(args: argparse.Namespace, root: Path, marker: Path) -> list[FunctionTool]:
    ledger, outbox = root / "ledger", root / "outbox"
    ledger.mkdir(exist_ok=True)
    outbox.mkdir(exist_ok=True)

    async def charge(amount_eur: int, call_id: str) -> str:
        write_once(ledger / call_id, f"{amount_eur}", mode=os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        if args.kill_in == "charge":
            await block(marker, "charge")
        return f"charged {amount_eur} EUR"

    async def check_charge(amount_eur: int, call_id: str) -> Reconciliation:
        if args.kill_in == "check":
            await block(marker, "check")
        if args.check == "raise":
            raise ConnectionError("ledger unreachable")
        if args.check == "hang":
            await anyio.sleep_forever()
        if args.check == "cannot-tell":
            return Reconciliation.cannot_tell("ledger is being migrated")
        if (ledger / call_id).exists():
            return Reconciliation.happened(f"charged {(ledger / call_id).read_text()} EUR", "found in the ledger")
        return Reconciliation.did_not_happen("no ledger entry for this call id")

    async def notify(to: str, call_id: str) -> str:
        write_once(outbox / call_id, to, mode=os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        if args.kill_in == "notify":
            await block(marker, "notify")
        return f"notified {to}"

    def check_notify(to: str, call_id: str) -> Reconciliation:  # sync: runs in a worker thread
        if (outbox / call_id).exists():
            return Reconciliation.happened(f"notified {to}")
        return Reconciliation.did_not_happen()

    return [
        FunctionTool("charge", charge, with_call_id=True, check=None if args.check == "none" else check_charge),
        FunctionTool("notify", notify, with_call_id=True, check=check_notify),
    ]


async def run(args: argparse.Namespace) -> None:
    root, marker = Path(args.root), Path(args.marker)
    host = Host()
    host.load_entrypoints()  # the JSONL backend and the checkpoint policy
    store = SessionStore(host, check_turns=True)
    backend: Any = host.dsh_session_backends()["jsonl"](root / "sessions", compression=args.compression)  # type: ignore[call-arg]
    model = PaymentsModel(root)
    async with PersistenceCoordinator(host, backend) as coordinator:
        if args.phase == "start":
            loop = AgentLoop(host, store, model, tools(args, root, marker), session_id=SESSION_ID)
            await loop.run_turn("Charge the 20 EUR deposit, then notify me.")
            write_once(root / "result.json", json.dumps({"unexpected": "turn 1 ended"}))
            return
        loop = await AgentLoop.resume(
            host, store, coordinator, SESSION_ID, model, tools(args, root, marker), reconcile_timeout=0.5
        )
        if args.kill_in == "resumed":
            await block(marker, "resumed")  # the findings must already be durable: nothing else flushes them
        findings = [msgspec.to_builtins(e.data) for e in loop.session.events if e.type == "tool/reconcile"]
        turns = []
        while loop.interrupted_turn is not None:
            result = await loop.continue_interrupted()
            turns.append({"turn": result.turn, "reason": result.reason.kind, "text": result.text})
        await store.flush(loop.session)
        write_once(root / "result.json", json.dumps({"findings": findings, "continued": turns}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["start", "resume"])
    parser.add_argument("root")
    parser.add_argument("marker")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--compression", choices=["zstd", "none"], default="none")
    parser.add_argument("--check", choices=["ok", "raise", "hang", "cannot-tell", "none"], default="ok")
    parser.add_argument("--kill-in", choices=["charge", "check", "notify", "resumed", "nowhere"], default="nowhere")
    args = parser.parse_args(argv)
    anyio.run(run, args, backend=args.backend)


if __name__ == "__main__":
    main(sys.argv[1:])
