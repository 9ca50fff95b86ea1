"""The event log model: one frozen msgspec Struct per event type, tagged on ``type``.

Wire names are camelCase (``callId``, ``sourceEventSeqs``); Python attributes are snake_case. Optional fields
are ``UNSET`` and left out of the wire form. The codec (decode, encode, the envelope and surface rules) is in
``_wire.codec``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Union

import msgspec
from msgspec import UNSET, UnsetType

from .values import (
    FINISH_KINDS,
    AbortCause,
    AbortedReason,
    AdapterDefaults,
    BlockedReason,
    BlockEndChunk,
    BlockStartChunk,
    CompletedReason,
    ContentBlock,
    Count,
    DisposedAbort,
    EpochHeader,
    ErrorReason,
    FinishChunk,
    FinishReason,
    HookAbort,
    ImageBlock,
    InterruptedReason,
    LegacyAbort,
    LlmFailure,
    MaxTokensReason,
    Message,
    MessageSource,
    ModelSource,
    Number,
    ParentAbort,
    PluginSource,
    ReasoningBlock,
    ReasoningDeltaChunk,
    RequestConfig,
    SafeInt,
    StreamChunk,
    TextBlock,
    TextDeltaChunk,
    TokenUsage,
    ToolCallBlock,
    ToolCallDeltaChunk,
    ToolResultBlock,
    ToolSource,
    TurnEndReason,
    UsageChunk,
    UserAbort,
    UserSource,
    _Value,
)

__all__ = [
    "AbortCause",
    "AbortedReason",
    "AdapterDefaults",
    "AssistantChunk",
    "AssistantChunkData",
    "AssistantMessage",
    "AssistantMessageData",
    "BlockEndChunk",
    "BlockStartChunk",
    "BlockedReason",
    "CompletedReason",
    "ContentBlock",
    "Count",
    "DisposedAbort",
    "EndSeed",
    "EndSeedData",
    "EpochHeader",
    "ErrorReason",
    "FINISH_KINDS",
    "FinishChunk",
    "FinishReason",
    "HookAbort",
    "IGNORABLE_EVENT_TYPES",
    "ImageBlock",
    "InterruptedReason",
    "KnownEvent",
    "LegacyAbort",
    "LlmFailure",
    "MaxTokensReason",
    "Message",
    "MessageSource",
    "ModelSource",
    "Number",
    "OpaqueEvent",
    "ParentAbort",
    "PluginSource",
    "RECONCILE_OUTCOMES",
    "ReasoningBlock",
    "ReasoningDeltaChunk",
    "RequestConfig",
    "RequestContext",
    "RequestContextData",
    "RequestHeader",
    "RequestHeaderData",
    "SURFACE_EVENT_TYPES",
    "SafeInt",
    "SessionEvent",
    "StepData",
    "StepEnd",
    "StepStart",
    "StreamChunk",
    "TextBlock",
    "TextDeltaChunk",
    "TodoItem",
    "TodoWrite",
    "TodoWriteData",
    "TokenUsage",
    "ToolCall",
    "ToolCallBlock",
    "ToolCallData",
    "ToolCallDeltaChunk",
    "ToolErrorInfo",
    "ToolReconcile",
    "ToolReconcileData",
    "ToolResult",
    "ToolResultBlock",
    "ToolResultData",
    "ToolSource",
    "TurnContinue",
    "TurnContinueData",
    "TurnEnd",
    "TurnEndData",
    "TurnEndReason",
    "TurnStart",
    "TurnStartData",
    "UsageChunk",
    "UserAbort",
    "UserMessage",
    "UserSource",
]

# --------------------------------------------------------------------------------------------------------------
# Event payloads


class TurnStartData(_Value, frozen=True):
    turn: Count


class TurnEndData(_Value, frozen=True):
    turn: Count
    reason: TurnEndReason


class StepData(_Value, frozen=True):
    turn: Count
    step: Count


class AssistantChunkData(_Value, frozen=True):
    turn: Count
    step: Count
    chunk: StreamChunk


class AssistantMessageData(_Value, frozen=True):
    turn: Count
    step: Count
    message: Message
    usage: TokenUsage | UnsetType = UNSET
    interrupted: Literal[True] | UnsetType = UNSET


class ToolCallData(_Value, frozen=True):
    turn: Count
    step: Count
    call_id: str
    name: str
    arguments: str


class ToolErrorInfo(_Value, frozen=True):
    name: str
    code: str


class ToolResultData(_Value, frozen=True):
    turn: Count
    step: Count
    message: Message
    error: ToolErrorInfo | UnsetType = UNSET
    meta: Any | UnsetType = UNSET


class RequestHeaderData(_Value, frozen=True):
    header: EpochHeader
    reason: Literal["initial", "resume", "change"]


class RequestContextData(_Value, frozen=True):
    provider: str
    model: str
    context_window: Count | UnsetType = UNSET


class EndSeedData(_Value, frozen=True):
    pass


class TurnContinueData(_Value, frozen=True):
    """``turn`` carries on ``interrupted_turn`` (the turn just before it, which crash repair closed)."""

    turn: Count
    interrupted_turn: Count


#: What a reconciliation check found about a call whose outcome was unknown: ``ToolReconcileData.outcome``.
RECONCILE_OUTCOMES = ("happened", "not-happened", "unknown")


class ToolReconcileData(_Value, frozen=True):
    """What a tool's reconciliation check found about an unknown-outcome call (``result_seq``: its repaired result).

    ``happened`` and ``not-happened`` carry the ``message`` the model sees instead of the unknown-outcome text;
    ``unknown`` (the check could not tell, failed or timed out) carries none: the model keeps seeing that text.
    ``detail`` says why, for people reading the log.
    """

    call_id: str
    name: str
    result_seq: Count
    outcome: str
    message: Message | UnsetType = UNSET
    detail: str | UnsetType = UNSET

    def __post_init__(self) -> None:
        if self.outcome not in RECONCILE_OUTCOMES:
            raise ValueError(f"reconcile outcome must be one of {', '.join(RECONCILE_OUTCOMES)}; got {self.outcome!r}")


class TodoItem(_Value, frozen=True):
    content: str
    status: Literal["pending", "in_progress", "completed"]


class TodoWriteData(_Value, frozen=True):
    todos: tuple[TodoItem, ...]


# --------------------------------------------------------------------------------------------------------------
# Events


class _Event(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel", tag_field="type", gc=False
):
    """Envelope shared by every known event: ``seq`` is always the index in the log, ``time`` epoch ms."""

    type: ClassVar[str]
    surface: ClassVar[bool] = False
    seq: Count
    time: SafeInt
    ignorable: Literal[True] | UnsetType = UNSET


class _SurfaceEvent(_Event, kw_only=True, frozen=True):
    surface: ClassVar[bool] = True
    surface_op: Literal["append"]
    source_event_seqs: tuple[Count, ...] | UnsetType = UNSET


class TurnStart(_Event, tag="turn/start", kw_only=True, frozen=True):
    type: ClassVar[str] = "turn/start"
    data: TurnStartData


class TurnEnd(_Event, tag="turn/end", kw_only=True, frozen=True):
    type: ClassVar[str] = "turn/end"
    data: TurnEndData


class StepStart(_Event, tag="step/start", kw_only=True, frozen=True):
    type: ClassVar[str] = "step/start"
    data: StepData


class StepEnd(_Event, tag="step/end", kw_only=True, frozen=True):
    type: ClassVar[str] = "step/end"
    data: StepData


class UserMessage(_SurfaceEvent, tag="user/message", kw_only=True, frozen=True):
    type: ClassVar[str] = "user/message"
    data: Message


class AssistantChunk(_Event, tag="assistant/chunk", kw_only=True, frozen=True):
    type: ClassVar[str] = "assistant/chunk"
    data: AssistantChunkData


class AssistantMessage(_SurfaceEvent, tag="assistant/message", kw_only=True, frozen=True):
    type: ClassVar[str] = "assistant/message"
    data: AssistantMessageData


class ToolCall(_Event, tag="tool/call", kw_only=True, frozen=True):
    type: ClassVar[str] = "tool/call"
    data: ToolCallData


class ToolResult(_SurfaceEvent, tag="tool/result", kw_only=True, frozen=True):
    type: ClassVar[str] = "tool/result"
    data: ToolResultData


class RequestHeader(_Event, tag="request/header", kw_only=True, frozen=True):
    type: ClassVar[str] = "request/header"
    data: RequestHeaderData


class RequestContext(_Event, tag="request/context", kw_only=True, frozen=True):
    type: ClassVar[str] = "request/context"
    data: RequestContextData


class EndSeed(_Event, tag="session/end-seed", kw_only=True, frozen=True):
    type: ClassVar[str] = "session/end-seed"
    data: EndSeedData


class TodoWrite(_Event, tag="todo/write", kw_only=True, frozen=True):
    type: ClassVar[str] = "todo/write"
    data: TodoWriteData


class TurnContinue(_Event, tag="turn/continue", kw_only=True, frozen=True):
    """Marks a turn as the continuation of an interrupted one; written ``ignorable`` (older readers skip it)."""

    type: ClassVar[str] = "turn/continue"
    data: TurnContinueData


class ToolReconcile(_Event, tag="tool/reconcile", kw_only=True, frozen=True):
    """A reconciliation finding about an unknown-outcome call; written ``ignorable`` (older readers skip it)."""

    type: ClassVar[str] = "tool/reconcile"
    data: ToolReconcileData


#: The event types written ``ignorable``: a reader that does not know them (0.2) loads the log without them.
IGNORABLE_EVENT_TYPES = frozenset({"turn/continue", "tool/reconcile"})


class OpaqueEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An event of a type this build does not know, kept and re-emitted verbatim.

    Plugins may append their own types live; a reader refuses a stored unknown type unless it is ``ignorable``.
    """

    surface: ClassVar[bool] = False
    type: str
    seq: Count
    time: SafeInt
    ignorable: Literal[True] | UnsetType = UNSET
    data: Any


KnownEvent = Union[
    TurnStart,
    TurnEnd,
    StepStart,
    StepEnd,
    UserMessage,
    AssistantChunk,
    AssistantMessage,
    ToolCall,
    ToolResult,
    RequestHeader,
    RequestContext,
    EndSeed,
    TodoWrite,
    TurnContinue,
    ToolReconcile,
]
SessionEvent = Union[KnownEvent, OpaqueEvent]

#: Every event type this build implements, by wire tag.
EVENT_TYPES: dict[str, type[_Event]] = {
    cls.type: cls
    for cls in (
        TurnStart,
        TurnEnd,
        StepStart,
        StepEnd,
        UserMessage,
        AssistantChunk,
        AssistantMessage,
        ToolCall,
        ToolResult,
        RequestHeader,
        RequestContext,
        EndSeed,
        TodoWrite,
        TurnContinue,
        ToolReconcile,
    )
}
SURFACE_EVENT_TYPES = frozenset(t for t, cls in EVENT_TYPES.items() if cls.surface)
