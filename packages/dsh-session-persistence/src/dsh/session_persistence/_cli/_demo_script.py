"""The demo's scripted model and tools: no network, no API key, and no test dependency (pytest is not needed).

The tools carry descriptions and parameter schemas, so a real model (``dsh-sessions demo --model NAME``) can play the
same story; the scripted model plays it without them.

The story: turn 1 asks for the weather (a read-only tool, completes normally). Turn 2 asks to pay a restaurant
deposit and email the receipt: the model requests ``pay_deposit`` then ``send_receipt`` (exclusive tools, run one
after the other). The child process is SIGKILLed inside ``pay_deposit``, *after* its side effect (a ledger file) was
written. On resume, ``pay_deposit``'s reconciliation check looks the charge up in the ledger by its call id (found:
charged once), the finding replaces the unknown outcome, and the agent continues the cut turn (as turn 3, which
names turn 2) without a new user message: it sends the receipt that certainly never went out, and ends completed.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio.lowlevel

from .._host.boundaries import CancelSignal, ModelRequest
from .._host.reconcile import Reconciliation
from .._model.events import (
    BlockEndChunk,
    BlockStartChunk,
    FinishChunk,
    FinishReason,
    StreamChunk,
    TextBlock,
    TextDeltaChunk,
    ToolCallBlock,
    ToolCallDeltaChunk,
)

__all__ = [
    "KILL_MARKER",
    "SESSION_ID",
    "SYSTEM",
    "Call",
    "DemoModel",
    "DemoTool",
    "Say",
    "crash_script",
    "demo_tools",
    "resume_script",
]

SESSION_ID = "demo-booking"
#: What the child writes to its marker file once the side effect is done and it is waiting to be killed.
KILL_MARKER = "tool-side-effect"
PROVIDER = "scripted"
MODEL = "demo-model"
#: The system prompt (a real model needs to know it acts through the tools; the scripted model ignores it).
SYSTEM = (
    "You are a concise assistant for restaurant bookings. Act only through the tools, one call at a time when a "
    "step depends on the previous one, and never assume the outcome of a tool call you have not seen."
)

USER_TURNS = (
    "What's the weather in Lisbon tonight?",
    "Book the 19:30 table for two at Taberna, pay the 20 EUR deposit and email the receipt to you@example.com.",
)


def _text_chunks(text: str, index: int) -> list[StreamChunk]:
    words = text.split(" ")
    deltas: list[StreamChunk] = [
        TextDeltaChunk(index=index, text=w + (" " if i < len(words) - 1 else "")) for i, w in enumerate(words)
    ]
    return [
        BlockStartChunk(index=index, block_type="text"),
        *deltas,
        BlockEndChunk(index=index, block=TextBlock(text=text)),
    ]


@dataclass(frozen=True)
class Say:
    """A text answer that ends the turn."""

    text: str

    def chunks(self) -> list[StreamChunk]:
        return [*_text_chunks(self.text, 0), FinishChunk(reason=FinishReason(kind="stop"))]


@dataclass(frozen=True)
class Call:
    """Optional text, then tool calls ``(call_id, name, arguments)``."""

    calls: tuple[tuple[str, str, dict[str, Any]], ...]
    text: str | None = None

    def chunks(self) -> list[StreamChunk]:
        chunks = _text_chunks(self.text, 0) if self.text else []
        for offset, (call_id, name, arguments) in enumerate(self.calls):
            index = offset + (1 if self.text else 0)
            raw = json.dumps(arguments, separators=(",", ":"))
            chunks += [
                BlockStartChunk(index=index, block_type="tool-call"),
                ToolCallDeltaChunk(index=index, id=call_id, name=name, arguments_delta=raw),
                BlockEndChunk(index=index, block=ToolCallBlock(id=call_id, name=name, arguments=raw)),
            ]
        return [*chunks, FinishChunk(reason=FinishReason(kind="tool-calls"))]


class DemoModel:
    """A model adapter that plays one scripted response per request."""

    def __init__(self, script: Iterable[Say | Call]) -> None:
        self._script = iter(script)

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """The (unstarted) stream for ``request``."""
        return self._play()

    async def _play(self) -> AsyncIterator[StreamChunk]:
        response = next(self._script, None)
        if response is None:
            raise RuntimeError("the demo model has nothing more to say")
        for chunk in response.chunks():
            await anyio.lowlevel.checkpoint()
            yield chunk


@dataclass(frozen=True)
class DemoTool:
    """A tool whose body is ``body(arguments, call_id)``, with what a real model needs to call it.

    ``reconcile`` (optional) is the tool's reconciliation check: ``reconcile(arguments, call_id)`` finds out, by
    the call id the body used as its idempotency key, whether an interrupted call took effect.
    """

    name: str
    body: Callable[[Any, str], Awaitable[str]]
    description: str
    parameters: dict[str, Any]
    parallel: bool = False
    reconcile: Callable[[Any, str], Awaitable[Reconciliation]] | None = None

    async def run(self, arguments: Any, call_id: str, signal: CancelSignal) -> str:
        """Run the body."""
        return await self.body(arguments, call_id)


def write_file(path: str, text: str) -> None:
    """Create ``path`` with ``text`` in one write + fsync (a side effect that is really on disk)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_charges(ledger: str) -> list[str]:
    charges = []
    for name in sorted(os.listdir(ledger)):
        with open(os.path.join(ledger, name), encoding="utf-8") as handle:
            charges.append(f"{handle.read().strip()} (by call {name})")
    return charges


def _find_payment(ledger: str, call_id: str) -> Reconciliation:
    """``pay_deposit``'s check: the ledger entry is named by the call id (the idempotency key the body used)."""
    entry = os.path.join(ledger, call_id)
    if not os.path.exists(entry):
        return Reconciliation.did_not_happen("no ledger entry under this call id")
    with open(entry, encoding="utf-8") as handle:
        charged = handle.read().strip()
    others = len(os.listdir(ledger)) - 1
    once = "charged once" if others == 0 else f"charged once under this call id; {others} other charge(s)"
    return Reconciliation.happened(f"paid: {charged}", f"found in the ledger: {once}")


def demo_tools(work: str, after_payment: Callable[[], Awaitable[None]] | None = None) -> list[DemoTool]:
    """The four tools; ``after_payment`` runs inside ``pay_deposit`` after the charge (the child's kill point)."""
    ledger = os.path.join(work, "ledger")
    outbox = os.path.join(work, "outbox")
    os.makedirs(ledger, exist_ok=True)
    os.makedirs(outbox, exist_ok=True)

    async def weather(arguments: Any, call_id: str) -> str:
        return f"{arguments.get('city', '?')}: 18°C, clear sky"

    async def pay(arguments: Any, call_id: str) -> str:
        amount, restaurant = arguments.get("amount_eur"), arguments.get("restaurant")
        write_file(os.path.join(ledger, call_id), f"charged {amount} EUR to {restaurant}\n")
        if after_payment is not None:
            await after_payment()
        return f"paid {amount} EUR to {restaurant}"

    async def find_payment(arguments: Any, call_id: str) -> Reconciliation:
        return _find_payment(ledger, call_id)

    async def receipt(arguments: Any, call_id: str) -> str:
        write_file(os.path.join(outbox, call_id), f"receipt for the Taberna deposit to {arguments.get('to')}\n")
        return f"receipt emailed to {arguments.get('to')}"

    async def check(arguments: Any, call_id: str) -> str:
        charges = _read_charges(ledger)
        return f"{len(charges)} charge(s) found: " + "; ".join(charges) if charges else "no charge found"

    return [
        DemoTool("get_weather", weather, "Tonight's weather in a city.", _schema(city="string"), parallel=True),
        DemoTool(
            "pay_deposit",
            pay,
            "Charge a restaurant deposit to the user's card (a real payment: never charge twice).",
            _schema(restaurant="string", amount_eur="number"),
            reconcile=find_payment,
        ),
        DemoTool("send_receipt", receipt, "Email the deposit's receipt.", _schema(to="string")),
        DemoTool(
            "check_payments",
            check,
            "List the charges already made, to find out whether a payment went through.",
            _schema(restaurant="string"),
            parallel=True,
        ),
    ]


def _schema(**properties: str) -> dict[str, Any]:
    """An object schema whose every property (name -> JSON type) is required."""
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
        "required": list(properties),
    }


def crash_script() -> list[Say | Call]:
    """Turns 1 and 2 (the child dies inside turn 2's ``pay_deposit``)."""
    return [
        Call((("call-weather", "get_weather", {"city": "Lisbon"}),)),
        Say("It will be 18°C with a clear sky in Lisbon tonight."),
        Call(
            (
                ("call-deposit", "pay_deposit", {"restaurant": "Taberna", "amount_eur": 20}),
                ("call-receipt", "send_receipt", {"to": "you@example.com"}),
            ),
            text="Booking it: first the deposit, then the receipt.",
        ),
    ]


def resume_script() -> list[Say | Call]:
    """The continuation of turn 2: the deposit is known to be paid (reconciled), so send what certainly never ran."""
    return [
        Call(
            (("call-receipt-retry", "send_receipt", {"to": "you@example.com"}),),
            text="The deposit went through (charged once). The receipt was never sent, so sending it now is safe.",
        ),
        Say("Done: your table at Taberna for 19:30 is paid (20 EUR, charged once) and the receipt is on its way."),
    ]
