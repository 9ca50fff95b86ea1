"""The values events carry: messages and content blocks, stream chunks, turn end reasons and request records,
one frozen msgspec Struct each (wire names camelCase). The events themselves are in :mod:`.events`, which
re-exports every name here."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import UNSET, Meta, UnsetType

# jsonvalue.MAX_SAFE_INTEGER, spelled out: importing nothing of the core keeps every event one layer above its
# values (tools/import-graph); test_wings holds the two equal.
MAX_SAFE_INTEGER = 2**53 - 1

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
