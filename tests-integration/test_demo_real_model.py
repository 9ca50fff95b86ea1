"""``dsh-sessions demo --model NAME --base-url URL`` on the OpenAI-compatible adapter, against the loopback fake server.

The installed console script runs the whole demo in real processes: its child talks to the server over HTTP
through the adapter (found by its entry point), is SIGKILLed inside ``pay_deposit`` and the parent resumes on the
same adapter. The server's record of what was sent shows the model got the truth: the deposit answered with what
``pay_deposit``'s reconciliation check found in the ledger, the receipt with the crash-repair text, and no new user
message (the cut turn is continued). POSIX only (the demo needs SIGKILL).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dsh.session_adapter_openai.testing import FakeChatServer, StatusReply, StreamReply, text_reply, tool_call_reply
from dsh.session_persistence.loop import TOOL_RECONCILED_HAPPENED_TEXT
from dsh.session_persistence.repair import TOOL_NOT_STARTED_TEXT

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the demo needs SIGKILL")

SCRIPT = Path(sys.executable).with_name("dsh-sessions")  # the installed console script
TOOLS = ["get_weather", "pay_deposit", "send_receipt", "check_payments"]
DEPOSIT = ("call_deposit", "pay_deposit", {"restaurant": "Taberna", "amount_eur": 20})
RECEIPT = ("call_receipt", "send_receipt", {"to": "you@example.com"})


def demo(tmp_path: Path, *argv: str, key: str | None = "test-key") -> subprocess.CompletedProcess[str]:
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env.update({"DSH_SESSIONS_ROOT": str(tmp_path / "sessions"), "TMPDIR": str(temp)})
    if key is not None:
        env["OPENAI_API_KEY"] = key  # the documented way: the key stays off the command line
    assert SCRIPT.exists(), f"the console script is not installed next to {sys.executable}"
    return subprocess.run(
        [str(SCRIPT), "demo", *argv], capture_output=True, text=True, timeout=400, check=False, env=env
    )


def crash_and_resume_replies() -> list[StreamReply | StatusReply]:
    return [
        # Turn 1 (child): the weather, then the answer.
        tool_call_reply([("call_weather", "get_weather", {"city": "Lisbon"})]),
        text_reply("Clear and 18 C in Lisbon tonight."),
        # Turn 2 (child): both calls in one response; the child dies inside pay_deposit.
        tool_call_reply([DEPOSIT, RECEIPT]),
        # Turn 3 (parent, continuing turn 2 after the resume and the ledger check): send the receipt that certainly
        # never went out, then answer.
        tool_call_reply([("call_receipt_2", "send_receipt", {"to": "you@example.com"})]),
        text_reply("Your deposit was charged once and the receipt is on its way."),
    ]


def test_demo_on_the_openai_adapter_kills_resumes_and_tells_the_model_the_truth(tmp_path: Path) -> None:
    with FakeChatServer(crash_and_resume_replies()) as server:
        url = server.base_url
        result = demo(tmp_path, "--model", "fake-model", "--base-url", url, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["model"] == {"model": "fake-model", "baseUrl": url}
    assert report["child"]["signal"] == "SIGKILL" and report["child"]["returncode"] == -9
    assert report["resumedTurnEnd"] == "completed"
    assert [(r.get("callId"), r["code"]) for r in report["repairs"]] == [
        ("call_deposit", "TOOL_OUTCOME_UNKNOWN"),
        ("call_receipt", "TOOL_NOT_STARTED"),
        (None, "interrupted"),
    ]
    work = Path(report["work"])
    assert sorted(os.listdir(work / "ledger")) == ["call_deposit"]  # paid once, before the kill
    assert sorted(os.listdir(work / "outbox")) == ["call_receipt_2"]
    # Five requests: three from the killed child, two from the resumed parent; both had the key and the schemas.
    assert len(server.requests) == 5
    assert {h["authorization"] for h in server.headers} == {"Bearer test-key"}
    for body in server.requests:
        assert body["model"] == "fake-model"
        assert [t["function"]["name"] for t in body["tools"]] == TOOLS
        assert all(t["function"]["description"] for t in body["tools"])
        assert body["messages"][0]["role"] == "system"
    pay = next(t["function"] for t in server.requests[0]["tools"] if t["function"]["name"] == "pay_deposit")
    assert pay["parameters"] == {
        "type": "object",
        "properties": {"restaurant": {"type": "string"}, "amount_eur": {"type": "number"}},
        "required": ["restaurant", "amount_eur"],
    }
    # The first request after the resume carries the repaired and reconciled turn 2: the model learns the deposit
    # was charged (what the ledger check found, in the call's own result) and that the receipt never went out; the
    # request ends with those results, no new user message.
    resumed = server.requests[3]["messages"]
    tool_messages = {m["tool_call_id"]: m["content"] for m in resumed if m["role"] == "tool"}
    assert tool_messages["call_deposit"].startswith(TOOL_RECONCILED_HAPPENED_TEXT)
    assert "paid: charged 20 EUR to Taberna" in tool_messages["call_deposit"]
    assert tool_messages["call_receipt"] == TOOL_NOT_STARTED_TEXT
    assert resumed[-1]["role"] == "tool" and [m["role"] for m in resumed].count("user") == 2
    # The stored session names the real provider and model, and reads back clean.
    exported = subprocess.run(
        [str(SCRIPT), "--root", report["root"], "export", report["sessionId"]],
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    )
    headers = [json.loads(line) for line in exported.stdout.splitlines() if '"request/header"' in line]
    configs = {(h["data"]["header"]["config"]["provider"], h["data"]["header"]["config"]["model"]) for h in headers}
    assert configs == {("openai-compatible", "fake-model")}
    assert [h["data"]["reason"] for h in headers] == ["initial", "resume"]
    verify = subprocess.run(
        [str(SCRIPT), "--root", report["root"], "verify", "--json"], capture_output=True, text=True, timeout=100
    )
    assert verify.returncode == 0 and json.loads(verify.stdout)["ok"] is True, verify.stdout


def test_a_careless_model_is_reported_not_judged_and_the_key_flag_reaches_both_processes(tmp_path: Path) -> None:
    again = tool_call_reply([("call_deposit_again", "pay_deposit", {"restaurant": "Taberna", "amount_eur": 20})])
    replies = [*crash_and_resume_replies()[:3], again, text_reply("Paid.")]  # told it was paid, it pays again
    with FakeChatServer(replies) as server:
        url = server.base_url
        result = demo(tmp_path, "--model", "fake-model", "--base-url", url, "--api-key", "flag-key", key=None)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"demo: model fake-model at {url} (dsh-session-adapter-openai)" in out
    assert "append tool/result TOOL_OUTCOME_UNKNOWN for call call_deposit" in out
    assert "turn 3 ended: completed" in out
    # The model was told the deposit was paid and paid again anyway: the demo says so instead of failing or hiding it.
    assert "the ledger holds 2\ncharge(s) and the outbox 0 receipt(s) (completed turn 3: Paid.)" in out
    assert {h["authorization"] for h in server.headers} == {"Bearer flag-key"}  # the child got it by environment
    assert len(server.requests) == 5
    assert "flag-key" not in out + result.stderr  # the key is never printed


def test_a_model_that_fails_after_the_resume_fails_the_demo(tmp_path: Path) -> None:
    refused = StatusReply(400, {"error": {"message": "context too long", "type": "invalid_request_error"}})
    with FakeChatServer([*crash_and_resume_replies()[:3], refused]) as server:
        result = demo(tmp_path, "--model", "fake-model", "--base-url", server.base_url)
    assert result.returncode == 6, result.stdout + result.stderr
    assert "the model failed in the resumed turn: BAD_REQUEST: " in result.stderr
    assert "context too long" in result.stderr


def test_a_model_that_fails_stops_the_demo_with_its_error(tmp_path: Path) -> None:
    refused = StatusReply(401, {"error": {"message": "bad key", "type": "invalid_request_error"}})
    with FakeChatServer([refused]) as server:
        result = demo(tmp_path, "--model", "fake-model", "--base-url", server.base_url, key="wrong")
    assert result.returncode == 6, result.stdout + result.stderr
    assert "before its kill point" in result.stderr
    assert "the model failed in turn 1: AUTHENTICATION" in result.stderr
    assert len(server.requests) == 1  # the adapter was built with the SDK's retries, and 401 is not retried


def test_a_model_that_never_calls_pay_deposit_is_reported(tmp_path: Path) -> None:
    replies = [text_reply("It is clear tonight."), text_reply("Which card should I use?")]
    with FakeChatServer(replies) as server:
        result = demo(tmp_path, "--model", "fake-model", "--base-url", server.base_url, "--json")
    assert result.returncode == 6, result.stdout + result.stderr
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "demo_failed"
    assert "turn 2 ended (completed) without the model calling pay_deposit" in error["message"]


def test_without_a_key_the_real_demo_is_a_usage_error_and_spawns_nothing(tmp_path: Path) -> None:
    with FakeChatServer() as server:
        result = demo(tmp_path, "--model", "fake-model", "--base-url", server.base_url, key=None)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "$OPENAI_API_KEY" in result.stderr
    assert server.requests == []
    assert not (tmp_path / "sessions").exists()


def test_the_environment_alone_keeps_the_demo_scripted(tmp_path: Path) -> None:
    with FakeChatServer() as server:
        temp = tmp_path / "tmp"
        temp.mkdir()
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test-key"}
        env.update({"DSH_SESSIONS_ROOT": str(tmp_path / "sessions"), "TMPDIR": str(temp)})
        result = subprocess.run(
            [str(SCRIPT), "demo", "--json"], capture_output=True, text=True, timeout=100, check=False, env=env
        )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["model"] is None and report["charges"] == 1
    assert server.requests == []  # no network without --model
