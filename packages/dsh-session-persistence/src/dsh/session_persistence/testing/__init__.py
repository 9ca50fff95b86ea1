"""Test support for dsh sessions backends: the conformance kit and its helpers.

Backend packages subclass :class:`BackendConformance` and override its ``backend_factory`` fixture (see that
class for the optional hooks). Importing this package needs pytest; hypothesis is imported lazily, only by the
property test, which is skipped when it is not installed.
"""

# ruff: noqa: E402 - the assert-rewrite registration must run before the kit modules are imported
from __future__ import annotations

import pytest

# Plain asserts in the kit get pytest's detailed failure messages; this must run before the modules are imported.
pytest.register_assert_rewrite("dsh.session_persistence.testing._conformance")

from ._conformance import BackendConformance
from ._controlled import ControlledMemoryBackend
from ._faults import FaultInjectingBackend, InjectedFault
from ._logs import (
    OTHER,
    WORK,
    assistant_message,
    event,
    meta,
    one_turn_log,
    opaque,
    simple_turn,
    step_end,
    step_start,
    tool_call,
    turn_end,
    turn_start,
    user_message,
)
from ._rig import BackendFactory, ConformanceRig, Opened
from ._scripted import (
    ErrorResponse,
    HangResponse,
    ScriptedAdapter,
    ScriptedResponse,
    ScriptedTool,
    TextResponse,
    ToolCallResponse,
)

__all__ = [
    "OTHER",
    "WORK",
    "BackendConformance",
    "BackendFactory",
    "ConformanceRig",
    "ControlledMemoryBackend",
    "ErrorResponse",
    "FaultInjectingBackend",
    "HangResponse",
    "InjectedFault",
    "Opened",
    "ScriptedAdapter",
    "ScriptedResponse",
    "ScriptedTool",
    "TextResponse",
    "ToolCallResponse",
    "assistant_message",
    "event",
    "meta",
    "one_turn_log",
    "opaque",
    "simple_turn",
    "step_end",
    "step_start",
    "tool_call",
    "turn_end",
    "turn_start",
    "user_message",
]
