"""The event log model: one frozen msgspec Struct per event type, tagged on ``type`` (session-core §1).

Wire names are camelCase (``callId``, ``sourceEventSeqs``); Python attributes are snake_case. Optional fields
are ``UNSET`` and left out of the wire form. Decoding is two-phase: the envelope is checked first so that an
unknown type can be kept verbatim as an :class:`OpaqueEvent` (whether it may be *interpreted* is decided by the
reader, see :func:`first_refused_unknown`), and so that every rejection carries a specific message.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated, Any, ClassVar, Literal, Union, cast

import msgspec
from msgspec import UNSET, Meta, UnsetType

from ._errors import EventValidationError
from ._json import MAX_SAFE_INTEGER, NotLosslessJsonError, is_safe_int

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
    "DisposedAbort",
    "EVENT_TYPES",
    "EndSeed",
    "EndSeedData",
    "EpochHeader",
    "ErrorReason",
    "FinishChunk",
    "FinishReason",
    "HookAbort",
    "ImageBlock",
    "InterruptedReason",
    "LegacyAbort",
    "LlmFailure",
    "MaxTokensReason",
    "Message",
    "MessageSource",
    "ModelSource",
    "OpaqueEvent",
    "ParentAbort",
    "PluginSource",
    "ReasoningBlock",
    "ReasoningDeltaChunk",
    "RequestConfig",
    "RequestContext",
    "RequestContextData",
    "RequestHeader",
    "RequestHeaderData",
    "SURFACE_EVENT_TYPES",
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
    "ToolResult",
    "ToolResultBlock",
    "ToolResultData",
    "ToolSource",
    "TurnEnd",
    "TurnEndData",
    "TurnEndReason",
    "TurnStart",
    "TurnStartData",
    "UsageChunk",
    "UserAbort",
    "UserMessage",
    "UserSource",
    "check_message_shape",
    "check_source_event_seqs",
    "check_typed_surface",
    "decode_event",
    "decode_event_line",
    "encode_event",
    "event_to_builtins",
    "first_refused_unknown",
]

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


class FinishReason(_Value, frozen=True):
    kind: str  # "stop" | "tool-calls" | "max-tokens" | "error" | "aborted"
    error: LlmFailure | UnsetType = UNSET


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
    )
}
SURFACE_EVENT_TYPES = frozenset(t for t, cls in EVENT_TYPES.items() if cls.surface)

_ENVELOPE_KEYS = frozenset({"type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs", "ignorable"})
_encoder = msgspec.json.Encoder()
_known_decoder = msgspec.json.Decoder(KnownEvent)
_json_decoder = msgspec.json.Decoder()


def _envelope(obj: object) -> tuple[str, int, int, dict[str, Any]]:
    if type(obj) is not dict:
        raise EventValidationError("invalid event envelope: not a JSON object")
    extra = obj.keys() - _ENVELOPE_KEYS
    if extra:
        raise EventValidationError(f"invalid event envelope: unexpected key {sorted(extra)[0]!r}")
    etype = obj.get("type")
    if type(etype) is not str or not etype:
        raise EventValidationError("invalid event envelope: type must be a non-empty string")
    seq = obj.get("seq")
    if not is_safe_int(seq) or seq < 0:  # type: ignore[operator]
        raise EventValidationError(f'invalid event envelope: "{etype}" seq must be a non-negative safe integer')
    time = obj.get("time")
    if not is_safe_int(time):
        raise EventValidationError(f'invalid event envelope: "{etype}" time must be a safe integer')
    if "data" not in obj:
        raise EventValidationError(f'invalid event envelope: "{etype}" has no data')
    if "ignorable" in obj and obj["ignorable"] is not True:
        raise EventValidationError(f'invalid event envelope: "{etype}" ignorable must be true when present')
    return etype, seq, time, obj  # type: ignore[return-value]


def _check_surface(etype: str, seq: int, obj: dict[str, Any]) -> None:
    surface = etype in SURFACE_EVENT_TYPES
    if not surface:
        for key in ("surfaceOp", "sourceEventSeqs"):
            if key in obj:
                raise EventValidationError(f'session event "{etype}" is not surface-eligible and cannot carry {key}')
        return
    if "surfaceOp" not in obj:
        raise EventValidationError(f'session event "{etype}" is surface-eligible and requires a surfaceOp marker')
    op = obj["surfaceOp"]
    if op != "append":
        if type(op) is dict and op.get("op") == "replace":
            raise EventValidationError(
                f'session event "{etype}" carries a replace surfaceOp, which this build does not support'
            )
        raise EventValidationError(f'session event "{etype}" carries an invalid surfaceOp')
    if "sourceEventSeqs" in obj:
        check_source_event_seqs(etype, seq, obj["sourceEventSeqs"])


_INT_ONLY = {int}


def check_source_event_seqs(etype: str, seq: int, seqs: object) -> None:
    """Raise :class:`EventValidationError` unless ``seqs`` is a valid ``sourceEventSeqs`` for event ``seq``.

    Valid: a list (or tuple) of distinct non-negative safe integers, each lower than ``seq``; empty only for an
    ``assistant/message``.
    """
    # Fast acceptance in C-level passes (an assistant/message names every chunk it was built from, so these lists
    # are long): exact ints, all in [0, seq), no repeats. ``seq`` is a checked safe integer, so the members are too.
    # Anything else takes the loop below, which decides and names the defect exactly as before.
    if type(seqs) in (list, tuple):
        items = cast("Sequence[Any]", seqs)
        if (
            items
            and set(map(type, items)) == _INT_ONLY
            and min(items) >= 0
            and max(items) < seq
            and len(set(items)) == len(items)
        ):
            return
    bad = f'session event "{etype}" carries invalid sourceEventSeqs'
    if type(seqs) not in (list, tuple):
        raise EventValidationError(bad)
    assert isinstance(seqs, (list, tuple))
    if not seqs and etype != "assistant/message":
        raise EventValidationError(bad)
    seen: set[int] = set()
    for s in seqs:
        if not is_safe_int(s) or s < 0 or s >= seq or s in seen:
            raise EventValidationError(bad)
        seen.add(s)


def check_message_shape(event: SessionEvent) -> None:
    """Raise :class:`EventValidationError` when a surface event's message breaks its shape rule.

    ``user/message`` carries a user message; ``assistant/message`` an assistant message with a model source;
    ``tool/result`` a user message with a tool source and exactly one tool-result block answering that call.
    Other events pass.
    """
    kind = type(event)
    if kind is UserMessage:
        message: Message = event.data  # type: ignore[assignment]
        if message.role != "user":
            raise EventValidationError(f'session event "user/message" (seq {event.seq}) must carry a user message')
    elif kind is AssistantMessage:
        message = event.data.message  # type: ignore[union-attr]
        if message.role != "assistant" or type(message.source) is not ModelSource:
            raise EventValidationError(
                f'session event "assistant/message" (seq {event.seq}) must carry an assistant message '
                "with a model source"
            )
    elif kind is ToolResult:
        message = event.data.message  # type: ignore[union-attr]
        source = message.source
        blocks = message.content
        if (
            message.role != "user"
            or type(source) is not ToolSource
            or len(blocks) != 1
            or type(blocks[0]) is not ToolResultBlock
            or blocks[0].tool_call_id != source.call_id
        ):
            raise EventValidationError(
                f'session event "tool/result" (seq {event.seq}) must carry exactly one tool-result block '
                "answering its source call"
            )


def decode_event(obj: object) -> SessionEvent:
    """Build a frozen event from its plain JSON form (two-phase: envelope, then type).

    Unknown types become :class:`OpaqueEvent` (kept verbatim); whether a reader may accept them is decided by
    :func:`first_refused_unknown`. Raises :class:`EventValidationError` with a specific message otherwise.
    """
    etype, seq, _time, env = _envelope(obj)
    cls = EVENT_TYPES.get(etype)
    if cls is None:
        if "surfaceOp" in env or "sourceEventSeqs" in env:
            raise EventValidationError(f'session event "{etype}" is not surface-eligible and cannot carry surfaceOp')
        return msgspec.convert(env, OpaqueEvent)
    _check_surface(etype, seq, env)
    try:
        event = cast("SessionEvent", msgspec.convert(env, cls))
    except msgspec.ValidationError as exc:
        raise EventValidationError(f'invalid session event "{etype}" at seq {seq}: {exc}') from exc
    if cls.surface:
        check_message_shape(event)
    return event


#: The payload type of every known event type (the ``data`` field's declared type).
_DATA_TYPES: dict[str, Any] = {
    etype: next(f.type for f in msgspec.structs.fields(cls) if f.name == "data") for etype, cls in EVENT_TYPES.items()
}


def append_envelope(
    etype: str, seq: int, time: int, data: Any, source_event_seqs: list[Any] | None, ignorable: bool
) -> dict[str, Any]:
    """The wire form a live append describes (surface types get ``surfaceOp: "append"``)."""
    envelope: dict[str, Any] = {"type": etype, "seq": seq, "time": time, "data": data}
    if source_event_seqs is not None:
        envelope["sourceEventSeqs"] = source_event_seqs
    if etype in SURFACE_EVENT_TYPES:
        envelope["surfaceOp"] = "append"
    if ignorable:
        envelope["ignorable"] = True
    return envelope


def build_event(
    etype: str, seq: int, time: int, data: Any, source_event_seqs: list[Any] | None, ignorable: bool
) -> SessionEvent:
    """``decode_event(append_envelope(...))`` without building and re-checking the envelope for a known type.

    ``data`` and ``source_event_seqs`` must already have passed :func:`snapshot_json`. The envelope checks that
    can fail for a live append are made here in the same order (time, surface metadata), the payload is converted
    straight into its type, and the event struct is built from parts whose values are already checked; anything
    that fails (or an unknown type) goes through :func:`decode_event` itself, so results and errors are the same.
    """
    cls = EVENT_TYPES.get(etype)
    if cls is None or not is_safe_int(time) or not 0 <= seq <= MAX_SAFE_INTEGER:
        return decode_event(append_envelope(etype, seq, time, data, source_event_seqs, ignorable))
    surface = cls.surface
    if source_event_seqs is not None:
        if not surface:
            return decode_event(append_envelope(etype, seq, time, data, source_event_seqs, ignorable))
        check_source_event_seqs(etype, seq, source_event_seqs)
    try:
        payload = msgspec.convert(data, _DATA_TYPES[etype])
    except msgspec.ValidationError:
        # Same conversion inside the envelope: reports the error with its envelope path, as decode_event does.
        return decode_event(append_envelope(etype, seq, time, data, source_event_seqs, ignorable))
    flag: Literal[True] | UnsetType = True if ignorable else UNSET
    if not surface:
        return cast("SessionEvent", cls(seq=seq, time=time, data=payload, ignorable=flag))  # type: ignore[call-arg]
    seqs = UNSET if source_event_seqs is None else tuple(source_event_seqs)
    event = cast(
        "SessionEvent",
        cls(seq=seq, time=time, data=payload, ignorable=flag, surface_op="append", source_event_seqs=seqs),  # type: ignore[call-arg]
    )
    check_message_shape(event)
    return event


def check_typed_surface(event: SessionEvent) -> None:
    """The checks of a surface event that a typed decode of its line cannot express (``sourceEventSeqs`` order
    and repeats, the message shape); raises :class:`EventValidationError` like :func:`decode_event` would.
    """
    seqs = event.source_event_seqs  # type: ignore[union-attr]
    # Typed decoding already made every member a non-negative safe int: only order and repeats are left.
    if seqs is not UNSET and not (seqs and max(seqs) < event.seq and len(set(seqs)) == len(seqs)):
        check_source_event_seqs(event.type, event.seq, seqs)
    check_message_shape(event)


def decode_event_line(line: bytes | str) -> SessionEvent:
    """Decode one JSON line into an event; the typed fast path falls back to :func:`decode_event` for errors."""
    try:
        event = _known_decoder.decode(line)
    except (msgspec.DecodeError, RecursionError):  # the slow path explains what is wrong
        pass
    else:
        if event.surface:
            check_typed_surface(event)
        return event
    try:
        obj = _json_decoder.decode(line)
    except msgspec.DecodeError as exc:
        raise EventValidationError(f"invalid event line: {exc}") from exc
    except RecursionError as exc:  # nesting deeper than the interpreter allows here (see _json.MAX_JSON_DEPTH)
        raise EventValidationError("invalid event line: nested too deeply to decode") from exc
    return decode_event(obj)


def event_to_builtins(event: SessionEvent) -> dict[str, Any]:
    """The event as a plain JSON object (what is stored and exported)."""
    # Through JSON rather than msgspec.to_builtins, which keeps tuples: the result must be plain JSON.
    out: dict[str, Any] = _json_decoder.decode(_encoder.encode(event))
    return out


def encode_event(event: SessionEvent) -> bytes:
    """Compact JSON of one event, without a trailing newline."""
    try:
        return _encoder.encode(event)
    except RecursionError as exc:  # nesting deeper than the interpreter allows here (see _json.MAX_JSON_DEPTH)
        raise NotLosslessJsonError(f'session event "{event.type}" (seq {event.seq})', "nested too deeply", "$") from exc


def first_refused_unknown(events: Iterable[SessionEvent]) -> OpaqueEvent | None:
    """The first stored event whose type is unknown to this build and not marked ``ignorable``."""
    # Usually there is no unknown type at all: for a list or tuple one C-level pass over the types answers that.
    if type(events) in (list, tuple) and OpaqueEvent not in set(map(type, events)):
        return None
    for event in events:
        if type(event) is OpaqueEvent and event.ignorable is not True:
            return event
    return None


def event_types(events: Sequence[SessionEvent]) -> list[str]:
    """The wire types of ``events``, in order (handy in tests and tools)."""
    return [e.type for e in events]
