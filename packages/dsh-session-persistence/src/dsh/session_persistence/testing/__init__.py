"""Test support for dsh sessions: the backend conformance kit, scripted model adapters and tools, fault injection.

Backend packages subclass :class:`BackendConformance` and override its ``backend_factory`` fixture (see that
class for the optional hooks). Only :class:`BackendConformance` needs pytest (install the ``testing`` extra); it
is imported on first use, so the scripted adapter, tools and log builders work in a plain install (the demo and
the README example use them). Hypothesis is imported lazily, only by the property test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._controlled import ControlledMemoryBackend
from ._faults import FaultInjectingBackend, InjectedFault
from ._hypothesis import use_noisy_machine_profile
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

if TYPE_CHECKING:
    from ._conformance import BackendConformance


def __getattr__(name: str) -> object:
    if name == "BackendConformance":
        import pytest

        # Plain asserts in the kit get pytest's detailed failure messages; must run before the module is imported.
        pytest.register_assert_rewrite(
            "dsh.session_persistence.testing._conformance", "dsh.session_persistence.testing._lifecycle_conformance"
        )
        from ._conformance import BackendConformance

        return BackendConformance
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "use_noisy_machine_profile",
    "user_message",
]
