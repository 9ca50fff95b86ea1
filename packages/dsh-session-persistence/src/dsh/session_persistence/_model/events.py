"""The event log model: one frozen msgspec Struct per event type, tagged on ``type``.

Wire names are camelCase (``callId``, ``sourceEventSeqs``); Python attributes are snake_case. Optional fields
are ``UNSET`` and left out of the wire form. The codec (decode, encode, the envelope and surface rules) is in
``_wire.codec``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

import msgspec
from msgspec import UNSET, Meta, UnsetType

from .jsonvalue import MAX_SAFE_INTEGER

# What is exported is listed once, by the public face dsh.session_persistence.events (and its __all__).

SafeInt = Annotated[int, Meta(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]
Count = Annotated[int, Meta(ge=0, le=MAX_SAFE_INTEGER)]
Number = Union[SafeInt, float]


# gc=False (here and on _Event): a loaded or live log holds several structs per event, and tracking them made
# every collection walk the whole log (about 30% of a 10 MB load's decode time, and more in a process holding
# many logs). Untracked is safe because these frozen structs cannot take part in a reference cycle: their fields
# are scalars, other such structs, and (in Any fields) JSON trees that went through snapshot_json or a JSON
# decoder. Only a caller building a struct by hand around a self-referencing object could make a cycle that
# the collector would then never free (msgspec docs, "Disabling Garbage Collection").
class _Value(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel", gc=False):
    """Base of every payload value: immutable, strict, camelCase on the wire."""


# --------------------------------------------------------------------------------------------------------------
# Messages and content blocks


class TextBlock(_Value, tag_field="type", tag="text", frozen=True):
    text: str


class ReasoningBlock(_Value, tag_field="type", tag="reasoning", frozen=True):
    text: str


class ImageBlock(_Value, tag_field="type", tag="image", frozen=True):
    attachment: Any


class ToolCallBlock(_Value, tag_field="type", tag="tool-call", frozen=True):
    id: str
    name: str
    arguments: str  # raw model JSON text, kept unparsed


class ToolResultBlock(_Value, tag_field="type", tag="tool-result", frozen=True):
    tool_call_id: str
    content: tuple[ContentBlock, ...]
    is_error: bool | UnsetType = UNSET


ContentBlock = Union[TextBlock, ReasoningBlock, ImageBlock, ToolCallBlock, ToolResultBlock]


class UserSource(_Value, tag_field="kind", tag="user", frozen=True):
    pass


class PluginSource(_Value, tag_field="kind", tag="plugin", frozen=True):
    plugin: str


class ModelSource(_Value, tag_field="kind", tag="model", frozen=True):
    provider: Annotated[str, Meta(min_length=1)]
    model: Annotated[str, Meta(min_length=1)]
    replay_state: Any | UnsetType = UNSET


class ToolSource(_Value, tag_field="kind", tag="tool", frozen=True):
    call_id: str


MessageSource = Union[UserSource, PluginSource, ModelSource, ToolSource]


class Message(_Value, frozen=True):
    """A model-visible message (user, assistant or tool result)."""

    id: Annotated[str, Meta(min_length=1)]
    role: Literal["user", "assistant", "system"]
    content: tuple[ContentBlock, ...]
    source: MessageSource


class TokenUsage(_Value, frozen=True):
    input_tokens: Count
    output_tokens: Count
    cache_read_tokens: Count | UnsetType = UNSET
    cache_write_tokens: Count | UnsetType = UNSET
    reasoning_tokens: Count | UnsetType = UNSET


class LlmFailure(_Value, frozen=True):
    message: str
    code: str
    status: SafeInt | UnsetType = UNSET
    provider_retry_after_ms: SafeInt | UnsetType = UNSET
    request_id: str | UnsetType = UNSET


# --------------------------------------------------------------------------------------------------------------
# Stream chunks


#: How a model stream may finish: ``FinishReason.kind``.
FINISH_KINDS = ("stop", "tool-calls", "max-tokens", "error", "aborted")


class FinishReason(_Value, frozen=True):
    """How a model stream finished: ``kind`` is one of :data:`FINISH_KINDS`; ``error`` for ``error``/``aborted``."""

    kind: str
    error: LlmFailure | UnsetType = UNSET

    def __post_init__(self) -> None:
        # Runs on construction and on decode (msgspec reports the ValueError as a validation error).
        if self.kind not in FINISH_KINDS:
            raise ValueError(f"finish kind must be one of {', '.join(FINISH_KINDS)}; got {self.kind!r}")


class BlockStartChunk(_Value, tag_field="type", tag="block-start", frozen=True):
    index: Count
    block_type: str


class TextDeltaChunk(_Value, tag_field="type", tag="text-delta", frozen=True):
    index: Count
    text: str


class ReasoningDeltaChunk(_Value, tag_field="type", tag="reasoning-delta", frozen=True):
    index: Count
    text: str


class ToolCallDeltaChunk(_Value, tag_field="type", tag="tool-call-delta", frozen=True):
    index: Count
    id: str
    arguments_delta: str
    name: str | UnsetType = UNSET


class BlockEndChunk(_Value, tag_field="type", tag="block-end", frozen=True):
    index: Count
    block: ContentBlock


class UsageChunk(_Value, tag_field="type", tag="usage", frozen=True):
    usage: TokenUsage


class FinishChunk(_Value, tag_field="type", tag="finish", frozen=True):
    reason: FinishReason
    replay_state: Any | UnsetType = UNSET


StreamChunk = Union[
    BlockStartChunk,
    TextDeltaChunk,
    ReasoningDeltaChunk,
    ToolCallDeltaChunk,
    BlockEndChunk,
    UsageChunk,
    FinishChunk,
]

# --------------------------------------------------------------------------------------------------------------
# Turn end reasons


class UserAbort(_Value, tag_field="kind", tag="user", frozen=True):
    pass


class ParentAbort(_Value, tag_field="kind", tag="parent", frozen=True):
    pass


class HookAbort(_Value, tag_field="kind", tag="hook", frozen=True):
    reason: str


class DisposedAbort(_Value, tag_field="kind", tag="disposed", frozen=True):
    pass


class LegacyAbort(_Value, tag_field="kind", tag="legacy", frozen=True):
    pass


AbortCause = Union[UserAbort, ParentAbort, HookAbort, DisposedAbort, LegacyAbort]


class CompletedReason(_Value, tag_field="kind", tag="completed", frozen=True):
    pass


class AbortedReason(_Value, tag_field="kind", tag="aborted", frozen=True):
    reason: AbortCause


class BlockedReason(_Value, tag_field="kind", tag="blocked", frozen=True):
    pass


class ErrorReason(_Value, tag_field="kind", tag="error", frozen=True):
    error: LlmFailure


class MaxTokensReason(_Value, tag_field="kind", tag="max-tokens", frozen=True):
    pass


class InterruptedReason(_Value, tag_field="kind", tag="interrupted", frozen=True):
    """Written only by crash repair, never by a live loop."""


TurnEndReason = Union[CompletedReason, AbortedReason, BlockedReason, ErrorReason, MaxTokensReason, InterruptedReason]

# --------------------------------------------------------------------------------------------------------------
# Request records


class RequestConfig(_Value, frozen=True):
    provider: Annotated[str, Meta(min_length=1)]
    model: Annotated[str, Meta(min_length=1)]
    reasoning_effort: Annotated[str, Meta(min_length=1)] | UnsetType = UNSET
    temperature: Number | UnsetType = UNSET
    max_tokens: Count | UnsetType = UNSET
    stop: tuple[str, ...] | UnsetType = UNSET


class AdapterDefaults(_Value, frozen=True):
    reasoning_effort: Literal[True] | UnsetType = UNSET
    max_tokens: Literal[True] | UnsetType = UNSET


class EpochHeader(_Value, frozen=True):
    """The request envelope in force: config, system prompt and tool schemas."""

    config: RequestConfig
    adapter_defaults: AdapterDefaults | UnsetType = UNSET
    system: str | UnsetType = UNSET
    tools: tuple[Any, ...] | UnsetType = UNSET


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
