"""Boundary value types and the canonical tool results (spec/policy.md §1.5, compared exactly)."""

from __future__ import annotations

import dataclasses

import pytest
from dsh.session_persistence._host.boundaries import (
    CancelSignal,
    ModelRequest,
    PreStepDecision,
    PreStepInput,
    ToolExecution,
    ToolExecutionResult,
    aborted_before_dispatch_result,
    aborted_result,
    error_result,
)


def test_aborted_before_dispatch_result_is_canonical() -> None:
    assert aborted_before_dispatch_result().to_builtins() == {
        "content": [{"type": "text", "text": "Error: tool call aborted before dispatch"}],
        "is_error": True,
        "error": {
            "message": "tool call aborted before dispatch",
            "info": {"name": "AbortError", "code": "ABORTED_BEFORE_DISPATCH"},
        },
    }


def test_aborted_result_is_canonical() -> None:
    assert aborted_result().to_builtins() == {
        "content": [{"type": "text", "text": "Error: tool call aborted"}],
        "is_error": True,
        "error": {"message": "tool call aborted", "info": {"name": "AbortError", "code": "ABORTED"}},
    }


def test_error_result() -> None:
    result = error_result("disk unavailable")
    assert result.content == ({"type": "text", "text": "Error: disk unavailable"},)
    assert result.is_error
    assert result.to_builtins() == {
        "content": [{"type": "text", "text": "Error: disk unavailable"}],
        "is_error": True,
    }


def test_to_builtins_returns_fresh_copies() -> None:
    result = aborted_result()
    out = result.to_builtins()
    out["content"][0]["text"] = "mutated"
    out["error"]["info"]["code"] = "mutated"
    assert result.to_builtins() == aborted_result().to_builtins()
    assert aborted_result() == aborted_result()


def test_success_result_defaults() -> None:
    result = ToolExecutionResult(content=({"type": "text", "text": "ok"},))
    assert result.to_builtins() == {"content": [{"type": "text", "text": "ok"}], "is_error": False}


def test_values_are_frozen_and_replaceable() -> None:
    signal, fused = CancelSignal(), CancelSignal()
    execution = ToolExecution(call_id="c1", name="echo", arguments=[1, 2], signal=signal)
    with pytest.raises(dataclasses.FrozenInstanceError):
        execution.name = "other"  # type: ignore[misc]
    replaced = dataclasses.replace(execution, signal=fused)
    assert replaced.signal is fused
    assert execution.signal is signal
    assert (replaced.agent, replaced.parent, replaced.turn, replaced.step) == (None, None, None, None)
    request = ModelRequest(session_id=None, messages=(), config={"model": "m"}, signal=signal)
    assert (request.system, request.tools) == (None, ())


def test_pre_step_decisions() -> None:
    assert PreStepDecision.enter() == PreStepDecision(kind="enter", messages=())
    assert PreStepDecision.reject().kind == "reject"
    with pytest.raises(ValueError, match="reject pre-step decision carries no messages"):
        PreStepDecision(kind="reject", messages=("m",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='must be "enter" or "reject"'):
        PreStepDecision(kind="skip")  # type: ignore[arg-type]
    default = PreStepDecision.enter()
    pre_step = PreStepInput(messages=(), turn=1, step=2, signal=CancelSignal(), default=default)
    assert pre_step.default is default
