"""dsh sessions: durable, crash-safe, event-sourced session logs for Python LLM agents.

This distribution is the seam every other package builds on: the event log model and the live
:class:`SessionStore`, every pluggy hookspec and the validating :class:`Host`, the
:class:`PersistenceCoordinator` (write-behind batching, flush barrier, per-session serialization, crash repair),
the backend protocol with an in-memory backend, and the reference :class:`~dsh.session_persistence.loop.AgentLoop`.
The backend conformance kit lives in :mod:`dsh.session_persistence.testing`.

Plugin authors import :data:`hookimpl` from here::

    from dsh.session_persistence import hookimpl

    @hookimpl
    def dsh_session_backends():
        return [MyBackend]
"""

from __future__ import annotations

from ._backend import (
    RawArtifact,
    SessionBackend,
    SessionLocation,
    SessionSnapshot,
    StorageMetadata,
    StoredPrefix,
    StoredSuffix,
)
from ._boundaries import (
    CancelSignal,
    Deferred,
    ModelRequest,
    PreStepDecision,
    PreStepInput,
    ToolExecution,
    ToolExecutionResult,
    TurnAborted,
    aborted_before_dispatch_result,
    aborted_result,
    error_result,
)
from ._chunk_rows import ChunkRowError, expand_chunk_rows, pack_chunk_rows
from ._coordinator import PersistenceCoordinator
from ._errors import (
    EventValidationError,
    IncompleteInheritedPrefixError,
    LiveTurnOpenError,
    ReentrantAppendError,
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionFormatUnsupportedError,
    SessionIdCollisionError,
    SessionLifecycleError,
    SessionLiveError,
    SessionLockedError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionReservedError,
    SessionStorageError,
    SessionWriteInDoubtError,
    TurnInvariantError,
    UnknownEventTypeError,
    UnsupportedOperationError,
)
from ._events import (
    EVENT_TYPES,
    SURFACE_EVENT_TYPES,
    AssistantChunk,
    AssistantMessage,
    EndSeed,
    Message,
    OpaqueEvent,
    RequestContext,
    RequestHeader,
    SessionEvent,
    StepEnd,
    StepStart,
    StreamChunk,
    TodoWrite,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
    decode_event,
    decode_event_line,
    encode_event,
    event_to_builtins,
    first_refused_unknown,
)
from ._fork import SessionForkError
from ._front_door import BackendNotFoundError, Sessions, open_sessions
from ._header import SESSION_FORMAT_VERSION, SessionHeader, header_from_builtins, header_to_builtins
from ._host import Host, hookimpl
from ._json import MAX_JSON_DEPTH, JsonValue, NotLosslessJsonError, is_json_value, snapshot_json
from ._memory import MemoryBackend, MemoryStore
from ._repair import (
    TOOL_ABORTED,
    TOOL_ABORTED_BEFORE_DISPATCH,
    TOOL_ABORTED_BEFORE_DISPATCH_TEXT,
    TOOL_ABORTED_TEXT,
    TOOL_NOT_STARTED,
    TOOL_NOT_STARTED_TEXT,
    TOOL_OUTCOME_UNKNOWN,
    TOOL_OUTCOME_UNKNOWN_TEXT,
    has_open_turn,
    interrupted_turn_closers,
)
from ._scheduling import ManualScheduler, Scheduler, TaskGroupScheduler
from ._session import Session, SessionStore, wall_clock_ms
from ._validator import TurnValidator, validate_turns
from ._views import SessionEventSuffix, SessionInspection
from ._write_behind import WriteBehindController
from .loop import AgentLoop, LlmError, ModelAdapter, Tool, ToolOutput

__all__ = [
    "BackendNotFoundError",
    "Sessions",
    "open_sessions",
    "EVENT_TYPES",
    "MAX_JSON_DEPTH",
    "SESSION_FORMAT_VERSION",
    "SURFACE_EVENT_TYPES",
    "TOOL_ABORTED",
    "TOOL_ABORTED_BEFORE_DISPATCH",
    "TOOL_ABORTED_BEFORE_DISPATCH_TEXT",
    "TOOL_ABORTED_TEXT",
    "TOOL_NOT_STARTED",
    "TOOL_NOT_STARTED_TEXT",
    "TOOL_OUTCOME_UNKNOWN",
    "TOOL_OUTCOME_UNKNOWN_TEXT",
    "AgentLoop",
    "AssistantChunk",
    "AssistantMessage",
    "CancelSignal",
    "ChunkRowError",
    "Deferred",
    "EndSeed",
    "EventValidationError",
    "Host",
    "IncompleteInheritedPrefixError",
    "JsonValue",
    "LlmError",
    "LiveTurnOpenError",
    "ManualScheduler",
    "MemoryBackend",
    "MemoryStore",
    "Message",
    "ModelAdapter",
    "ModelRequest",
    "NotLosslessJsonError",
    "OpaqueEvent",
    "PersistenceCoordinator",
    "PreStepDecision",
    "PreStepInput",
    "RawArtifact",
    "ReentrantAppendError",
    "RequestContext",
    "RequestHeader",
    "Scheduler",
    "SeqMismatchError",
    "Session",
    "SessionAlreadyExistsError",
    "SessionBackend",
    "SessionEvent",
    "SessionEventSuffix",
    "SessionForkError",
    "SessionFormatUnsupportedError",
    "SessionHeader",
    "SessionIdCollisionError",
    "SessionInspection",
    "SessionLifecycleError",
    "SessionLiveError",
    "SessionLockedError",
    "SessionLocation",
    "SessionNotFoundError",
    "SessionPersistenceCorruptionError",
    "SessionPersistenceError",
    "SessionReservedError",
    "SessionStorageError",
    "SessionWriteInDoubtError",
    "SessionSnapshot",
    "SessionStore",
    "StepEnd",
    "StepStart",
    "StorageMetadata",
    "StoredPrefix",
    "StoredSuffix",
    "StreamChunk",
    "TaskGroupScheduler",
    "TodoWrite",
    "Tool",
    "ToolCall",
    "ToolExecution",
    "ToolExecutionResult",
    "ToolOutput",
    "ToolResult",
    "TurnAborted",
    "TurnEnd",
    "TurnInvariantError",
    "TurnStart",
    "TurnValidator",
    "UnknownEventTypeError",
    "UnsupportedOperationError",
    "UserMessage",
    "WriteBehindController",
    "aborted_before_dispatch_result",
    "aborted_result",
    "decode_event",
    "decode_event_line",
    "encode_event",
    "error_result",
    "event_to_builtins",
    "expand_chunk_rows",
    "first_refused_unknown",
    "has_open_turn",
    "header_from_builtins",
    "header_to_builtins",
    "hookimpl",
    "interrupted_turn_closers",
    "is_json_value",
    "pack_chunk_rows",
    "snapshot_json",
    "validate_turns",
    "wall_clock_ms",
]
