"""Reconciliation checks as the loop runs them: FunctionTool's check (call id forwarded, sync in a worker thread),
the bound on a check, and what a nonsense answer counts as. The crash stories are in tests-integration."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import anyio
import pytest
from dsh.session_persistence._host.boundaries import ToolExecutionResult
from dsh.session_persistence._host.reconcile import reconcile_data, reconciler_of, run_check
from dsh.session_persistence.backend import decode_event
from dsh.session_persistence.loop import FunctionTool, Reconciliation, ToolOutput
from dsh.session_persistence.repair import UnknownCall, interrupted_turn_closers, unknown_calls

pytestmark = pytest.mark.anyio
CALL = UnknownCall("call-7", "pay", '{"amount": 20}', 11)


def pay(amount: int, call_id: str) -> str:
    return f"paid {amount}"


async def test_function_tool_forwards_the_arguments_and_the_call_id_to_a_sync_check_off_the_event_loop() -> None:
    seen: list[Any] = []
    loop_thread = threading.get_ident()

    def check(amount: int, call_id: str) -> Reconciliation:
        seen.append((amount, call_id, threading.get_ident() != loop_thread))
        return Reconciliation.happened(f"paid {amount}", "in the ledger")

    tool = FunctionTool("pay", pay, with_call_id=True, check=check)
    check_fn = reconciler_of(tool)
    assert check_fn is not None
    finding = await run_check(check_fn, CALL, 5)
    assert finding == Reconciliation("happened", "paid 20", "in the ledger")
    assert seen == [(20, "call-7", True)]  # a worker thread, never the event loop's


async def test_an_async_check_is_awaited_and_a_tool_without_one_offers_none() -> None:
    async def check(amount: int, call_id: str) -> Reconciliation:
        await anyio.lowlevel.checkpoint()
        return Reconciliation.did_not_happen(f"no entry for {call_id}")

    check_fn = reconciler_of(FunctionTool("pay", pay, with_call_id=True, check=check))
    assert check_fn is not None
    assert await run_check(check_fn, CALL, 5) == Reconciliation("not-happened", None, "no entry for call-7")
    assert reconciler_of(FunctionTool("pay", pay)) is None
    with pytest.raises(TypeError, match="check must be callable"):
        FunctionTool("pay", pay, with_call_id=True, check="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ("happened", "not a Reconciliation"),
        (None, "not a Reconciliation"),
        (Reconciliation("happened"), "happened without a result"),
    ],
)
async def test_a_nonsense_answer_cannot_tell(answer: object, says: str) -> None:
    async def check(arguments: Any, call_id: str) -> Any:
        return answer

    finding = await run_check(check, CALL, 5)
    assert finding.outcome == "unknown" and says in finding.detail


async def test_a_sync_check_that_blocks_is_abandoned_at_its_bound() -> None:
    release = threading.Event()

    def check(amount: int, call_id: str) -> Reconciliation:
        release.wait(30)  # a lookup that hangs; the loop must not
        return Reconciliation.happened("late")

    check_fn = reconciler_of(FunctionTool("pay", pay, with_call_id=True, check=check))
    assert check_fn is not None
    try:
        finding = await run_check(check_fn, CALL, 0.05)
    finally:
        release.set()
    assert finding.outcome == "unknown" and "did not answer within 0.05s" in finding.detail


async def test_recorded_arguments_that_are_not_json_cannot_tell() -> None:
    async def check(arguments: Any, call_id: str) -> Reconciliation:
        raise AssertionError("never asked")

    finding = await run_check(check, UnknownCall("c", "pay", "{not json", 3), 5)
    assert finding.outcome == "unknown" and "not JSON" in finding.detail


def test_a_happened_finding_keeps_the_reported_result_and_its_error_flag() -> None:
    result: ToolOutput = ToolExecutionResult(content=({"type": "text", "text": "declined"},), is_error=True)
    data = reconcile_data(CALL, Reconciliation.happened(result), 40)
    [block] = data["message"]["content"]
    assert block["isError"] is True and block["content"][-1] == {"type": "text", "text": "declined"}
    assert data["message"]["id"] == "reconciled-tool-result-call-7-40" and data["resultSeq"] == 11
    assert "message" not in reconcile_data(CALL, Reconciliation.cannot_tell("down"), 40)


# A sync check that never answers, bounded by the caller; then the program ends. The process must end with it.
HANGING_CHECK = """
import sys, threading
import anyio
from dsh.session_persistence.loop import FunctionTool, Reconciliation

def pay(amount, call_id):
    return "paid"

def check(amount, call_id):
    threading.Event().wait()  # a lookup that never answers
    return Reconciliation.cannot_tell()

async def main():
    tool = FunctionTool("pay", pay, with_call_id=True, check=check)
    with anyio.move_on_after(0.1) as scope:
        await tool.reconcile({"amount": 20}, "call-7")
    print("abandoned" if scope.cancelled_caught else "answered", flush=True)

anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_hanging_sync_check_cannot_keep_the_process_from_exiting(backend: str) -> None:
    # The old worker thread (anyio's, joined at interpreter exit) held the process forever: the timeout is the
    # failure, never reached when the check runs on a thread the interpreter does not wait for.
    done = subprocess.run(
        [sys.executable, "-c", HANGING_CHECK, backend], capture_output=True, text=True, timeout=90, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "abandoned"), done.stderr


def _event(seq: int, etype: str, data: dict[str, Any]) -> Any:
    envelope: dict[str, Any] = {"type": etype, "seq": seq, "time": 0, "data": data}
    if etype in ("user/message", "assistant/message", "tool/result"):
        envelope["surfaceOp"] = "append"
    if etype == "tool/reconcile":
        envelope["ignorable"] = True
    return decode_event(envelope)


def test_the_repair_face_lists_the_unknown_outcome_calls_a_finding_has_not_settled() -> None:
    """``repair.unknown_calls`` (public, for integrations running their own loop): a recorded call repaired as
    ``TOOL_OUTCOME_UNKNOWN`` is listed until a conclusive finding names its result; a never-recorded call
    (``TOOL_NOT_STARTED``) never is."""
    blocks = [{"type": "tool-call", "id": i, "name": "pay", "arguments": '{"amount": 20}'} for i in ("c1", "c2")]
    message = {
        "id": "a1",
        "role": "assistant",
        "content": blocks,
        "source": {"kind": "model", "provider": "p", "model": "m"},
    }
    user = {"id": "u1", "role": "user", "content": [], "source": {"kind": "user"}}
    events = [
        _event(0, "turn/start", {"turn": 1}),
        _event(1, "step/start", {"turn": 1, "step": 1}),
        _event(2, "user/message", user),
        _event(3, "assistant/message", {"turn": 1, "step": 1, "message": message}),
        _event(4, "tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "pay", "arguments": '{"amount": 20}'}),
    ]  # the crash: c1 recorded, c2 not
    events += interrupted_turn_closers(events)
    [unknown] = unknown_calls(events)
    assert unknown == UnknownCall("c1", "pay", '{"amount": 20}', 5)
    assert unknown_calls(events[:5]) == []  # no repair yet: nothing is unknown
    cannot_tell = reconcile_data(unknown, Reconciliation.cannot_tell("down"), len(events))
    events.append(_event(len(events), "tool/reconcile", cannot_tell))
    assert unknown_calls(events) == [unknown]  # an unknown finding settles nothing
    wrong = reconcile_data(UnknownCall("c1", "pay", "{}", 4), Reconciliation.happened("paid"), len(events))
    events.append(_event(len(events), "tool/reconcile", wrong))
    assert unknown_calls(events) == [unknown]  # a finding about another result settles nothing either
    happened = reconcile_data(unknown, Reconciliation.happened("paid 20"), len(events))
    events.append(_event(len(events), "tool/reconcile", happened))
    assert unknown_calls(events) == []
