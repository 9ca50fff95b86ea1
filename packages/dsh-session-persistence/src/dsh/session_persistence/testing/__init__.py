"""Test support for dsh sessions: the backend conformance kit, scripted model adapters and tools, fault injection,
log builders and a manually driven scheduler for the write-behind timers.

Backend packages subclass :class:`BackendConformance` and override its ``backend_factory`` fixture (see that
class for the optional hooks). Only the conformance kits and their rig (:class:`ConformanceRig`, :class:`Opened`,
``BackendFactory``) need pytest (install the ``testing`` extra); they are imported on first use, so the scripted
adapter, tools and log builders work in a plain install (the demo and the README example use them). Hypothesis
is imported lazily, only by the property test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._coordinator.scheduling import ManualScheduler, Scheduler
from ._controlled import ControlledMemoryBackend
from ._crash_states import CrashStateReport, Recording, check_crash_states, record_session
from ._crash_trace import CrashState, TraceRecord, crash_states, read_trace
from ._faults import FaultInjectingBackend, InjectedFault
from ._hypothesis import use_noisy_machine_profile
from ._ledger import CostLedger, tracked_reachable
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
from ._scripted import (
    ErrorResponse,
    HangResponse,
    ScriptedAdapter,
    ScriptedResponse,
    ScriptedTool,
    TextResponse,
    ToolCallResponse,
)
from ._shim import FaultRule, ShimUnavailableError, build_shim, fault_spec, find_c_compiler, shim_environment

if TYPE_CHECKING:
    from ._conformance import BackendConformance
    from ._crash_kit import CrashBackend, CrashStateConformance, shim_or_skip
    from ._primitive_kit import PrimitiveFaultConformance
    from ._rig import BackendFactory, ConformanceRig, Opened
    from ._storage_kit import StorageContractConformance


_KIT_MODULES = {
    "BackendConformance": "_conformance",
    "BackendFactory": "_rig",
    "ConformanceRig": "_rig",
    "CrashBackend": "_crash_kit",
    "CrashStateConformance": "_crash_kit",
    "LifecycleConformance": "_conformance",
    "Opened": "_rig",
    "PrimitiveFaultConformance": "_primitive_kit",
    "StorageContractConformance": "_storage_kit",
    "shim_or_skip": "_crash_kit",
}


def __getattr__(name: str) -> object:
    module = _KIT_MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    import pytest

    # Plain asserts in the kit get pytest's detailed failure messages; must run before any kit module is imported.
    # BackendConformance is assembled from these groups of cases.
    groups = ("_conformance_storage", "_conformance_live", "_conformance_faults", "_lifecycle_retention")
    modules = {*_KIT_MODULES.values(), *groups, "_conformance_writers"}
    pytest.register_assert_rewrite(*sorted(f"{__name__}.{m}" for m in modules))
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = [
    "OTHER",
    "WORK",
    "BackendConformance",
    "BackendFactory",
    "ConformanceRig",
    "ControlledMemoryBackend",
    "CostLedger",
    "CrashBackend",
    "CrashState",
    "CrashStateConformance",
    "CrashStateReport",
    "ErrorResponse",
    "FaultInjectingBackend",
    "FaultRule",
    "HangResponse",
    "InjectedFault",
    "LifecycleConformance",
    "ManualScheduler",
    "Opened",
    "PrimitiveFaultConformance",
    "Recording",
    "ScriptedAdapter",
    "ScriptedResponse",
    "Scheduler",
    "ScriptedTool",
    "ShimUnavailableError",
    "StorageContractConformance",
    "TextResponse",
    "ToolCallResponse",
    "TraceRecord",
    "assistant_message",
    "build_shim",
    "check_crash_states",
    "crash_states",
    "event",
    "fault_spec",
    "find_c_compiler",
    "meta",
    "one_turn_log",
    "opaque",
    "read_trace",
    "record_session",
    "shim_environment",
    "shim_or_skip",
    "simple_turn",
    "step_end",
    "step_start",
    "tool_call",
    "turn_end",
    "tracked_reachable",
    "turn_start",
    "use_noisy_machine_profile",
    "user_message",
]
