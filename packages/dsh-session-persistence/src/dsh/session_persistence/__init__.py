"""dsh sessions: durable, crash-safe, event-sourced session logs for Python LLM agents.

This is the face for a person composing an agent: the validating plugin :class:`Host`, the live
:class:`SessionStore` and its :class:`Session` logs, the :class:`PersistenceCoordinator` that makes them durable
(write-behind batching, a flush barrier, per-session serialization, crash repair) over a backend such as the
in-memory :class:`MemoryBackend`, the reference :class:`AgentLoop` with the types its hooks exchange, and the
errors. The front door :func:`open_sessions` composes all of it in one line (``async with open_sessions(root) as
sessions:``) and :class:`Sessions` creates, resumes and forks agents on it. Plugin authors import
:data:`hookimpl` from here::

    from dsh.session_persistence import hookimpl

    @hookimpl
    def dsh_session_backends():
        return [MyBackend]

The other public modules are faces for other readers: :mod:`dsh.session_persistence.events` (every event,
message, content block and stream-chunk struct: what a model adapter speaks), :mod:`dsh.session_persistence.backend`
(the storage protocol, its value types, the wire codec and the storage errors: what a backend author needs),
:mod:`dsh.session_persistence.hookspecs` (every hook), :mod:`dsh.session_persistence.loop`,
:mod:`dsh.session_persistence.repair` (how an interrupted turn is closed), :mod:`dsh.session_persistence.invariant`
(the turn rules) and :mod:`dsh.session_persistence.testing` (the backend conformance kit, scripted adapters, fault
injection). Modules whose names start with ``_`` are private.
"""

from __future__ import annotations

from ._backends.listing import SessionListing, SessionPage
from ._backends.memory import MemoryBackend, MemoryStore
from ._coordinator.lifecycle import CompactResult, PruneReport
from ._coordinator.service import PersistenceCoordinator
from ._host.boundaries import (
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
from ._host.fork import SessionForkError
from ._host.host import Host, hookimpl
from ._host.session import Session, SessionStore
from ._host.specs import Agent
from ._loop.front_door import BackendNotFoundError, Sessions, open_sessions
from ._model.errors import (
    CheckpointPolicyMissingError,
    EncryptionUnavailableError,
    EventValidationError,
    IncompleteInheritedPrefixError,
    LifecycleArgumentError,
    LiveTurnOpenError,
    NoInterruptedTurnError,
    ReentrantAppendError,
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionChangedError,
    SessionCursorError,
    SessionDecryptError,
    SessionDisposeError,
    SessionFormatUnsupportedError,
    SessionIdCollisionError,
    SessionIdError,
    SessionKeyError,
    SessionLifecycleError,
    SessionLiveError,
    SessionLockedError,
    SessionNeedsRepairError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionReservedError,
    SessionStorageError,
    SessionWriteInDoubtError,
    ToolDefinitionError,
    TurnInvariantError,
    UnknownEventTypeError,
    UnsupportedOperationError,
)
from ._model.jsonvalue import NotLosslessJsonError
from ._model.views import SessionEventSuffix, SessionInspection
from .loop import AgentLoop, LlmError, ModelAdapter, Tool, ToolOutput

__all__ = [
    "Agent",
    "AgentLoop",
    "BackendNotFoundError",
    "CancelSignal",
    "CheckpointPolicyMissingError",
    "CompactResult",
    "Deferred",
    "EventValidationError",
    "Host",
    "IncompleteInheritedPrefixError",
    "LifecycleArgumentError",
    "LiveTurnOpenError",
    "NoInterruptedTurnError",
    "LlmError",
    "MemoryBackend",
    "MemoryStore",
    "ModelAdapter",
    "ModelRequest",
    "NotLosslessJsonError",
    "PersistenceCoordinator",
    "PreStepDecision",
    "PreStepInput",
    "PruneReport",
    "ReentrantAppendError",
    "SeqMismatchError",
    "Session",
    "SessionAlreadyExistsError",
    "SessionChangedError",
    "SessionCursorError",
    "EncryptionUnavailableError",
    "SessionDecryptError",
    "SessionDisposeError",
    "SessionEventSuffix",
    "SessionForkError",
    "SessionFormatUnsupportedError",
    "SessionIdCollisionError",
    "SessionIdError",
    "SessionInspection",
    "SessionLifecycleError",
    "SessionListing",
    "SessionKeyError",
    "SessionLiveError",
    "SessionLockedError",
    "SessionNeedsRepairError",
    "SessionNotFoundError",
    "SessionPage",
    "SessionPersistenceCorruptionError",
    "SessionPersistenceError",
    "SessionReservedError",
    "SessionStorageError",
    "SessionStore",
    "SessionWriteInDoubtError",
    "Sessions",
    "Tool",
    "ToolDefinitionError",
    "ToolExecution",
    "ToolExecutionResult",
    "ToolOutput",
    "TurnAborted",
    "TurnInvariantError",
    "UnknownEventTypeError",
    "UnsupportedOperationError",
    "aborted_before_dispatch_result",
    "aborted_result",
    "error_result",
    "hookimpl",
    "open_sessions",
]
