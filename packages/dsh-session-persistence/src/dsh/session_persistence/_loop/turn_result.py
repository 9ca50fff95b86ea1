"""What :meth:`AgentLoop.run_turn` returns: how the turn ended and what the model said, without digging in events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._model.events import (
    AbortCause,
    AbortedReason,
    AssistantMessage,
    ErrorReason,
    LlmFailure,
    SessionEvent,
    TextBlock,
    TokenUsage,
    TurnEnd,
    TurnEndData,
)

__all__ = ["TurnReason", "TurnResult", "turn_result"]


@dataclass(frozen=True, slots=True)
class TurnReason:
    """How a turn ended.

    :param kind: ``completed``, ``max-tokens``, ``blocked``, ``aborted``, ``error`` (or ``interrupted``, written
        only by crash repair).
    :param error: The model failure of an ``error`` turn (``message``, ``code``...), else ``None``.
    :param cause: What aborted an ``aborted`` turn (its ``kind`` is ``user``, ``parent``, ``hook``...), else ``None``.
    """

    kind: str
    error: LlmFailure | None = None
    cause: AbortCause | None = None


@dataclass(frozen=True, slots=True)
class TurnResult:
    """The outcome of one turn.

    :param event: The stored ``turn/end`` event.
    :param reason: How the turn ended (:class:`TurnReason`; ``reason.kind == "completed"`` on success).
    :param text: The text of the turn's last assistant message (``""`` if the model said nothing).
    :param usage: The token usage of each model response of the turn, in order.
    """

    event: TurnEnd
    reason: TurnReason
    text: str
    usage: tuple[TokenUsage, ...] = ()

    @property
    def turn(self) -> int:
        """The turn number (1 for the first turn of a session)."""
        return self.event.data.turn

    @property
    def data(self) -> TurnEndData:
        """The ``turn/end`` payload (``self.event.data``)."""
        return self.event.data

    @property
    def seq(self) -> int:
        """The ``turn/end`` event's seq."""
        return self.event.seq


def _reason(event: TurnEnd) -> TurnReason:
    reason: Any = event.data.reason
    kind: str = type(reason).__struct_config__.tag
    if isinstance(reason, ErrorReason):
        return TurnReason(kind, error=reason.error)
    if isinstance(reason, AbortedReason):
        return TurnReason(kind, cause=reason.reason)
    return TurnReason(kind)


def turn_result(events: Sequence[SessionEvent], end: TurnEnd) -> TurnResult:
    """The :class:`TurnResult` of the turn ``end`` closes, read from ``events`` (the turn's, or more)."""
    text = ""
    found = False
    usage: list[TokenUsage] = []
    for event in events:
        if type(event) is AssistantMessage and event.data.turn == end.data.turn:
            blocks = event.data.message.content
            text = "".join(block.text for block in blocks if isinstance(block, TextBlock))
            found = True
            if isinstance(event.data.usage, TokenUsage):
                usage.append(event.data.usage)
    return TurnResult(event=end, reason=_reason(end), text=text if found else "", usage=tuple(usage))
