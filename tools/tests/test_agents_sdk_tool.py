"""tools/agents-sdk-session-tests decides its exit status from pytest's report: 0 only when every failure is in
its reviewed list of SQLite-internal tests, 1 when one more test fails, pytest's own status when pytest could not
run; a reviewed test that passes is reported so the list only shrinks. (The SDK run itself needs PyPI.)"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

TOOL = Path(__file__).resolve().parents[1] / "agents-sdk-session-tests"


def tool() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("agents_sdk_session_tests", str(TOOL))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def report(*names: str) -> str:
    lines = [f"FAILED tests/memory/test_session.py::{name} - AttributeError: _connections" for name in names]
    return "\n".join([*lines, f"{len(names)} failed, 53 passed in 30.41s"])


def test_every_reviewed_failure_is_ok_and_one_more_fails_the_run() -> None:
    t = tool()
    reviewed = dict(t.REVIEWED)
    assert reviewed and all(reason for reason in reviewed.values())  # every entry says why
    everything = report(*reviewed, "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome[pop]")
    status, lines = t.verdict(1, everything, reviewed)
    assert status == 0 and lines[-1].startswith("ok:")
    status, lines = t.verdict(
        1, report(*reviewed, "test_session_memory_basic_functionality_parametrized[run]"), reviewed
    )
    assert status == 1 and "test_session_memory_basic_functionality_parametrized" in lines[-1]


def test_a_reviewed_test_that_passes_is_reported_and_pytest_errors_propagate() -> None:
    t = tool()
    reviewed = {"test_a": "why", "test_b": "why"}
    status, lines = t.verdict(1, report("test_a"), reviewed)
    assert status == 0 and any("passing now" in line and "test_b" in line for line in lines)
    assert t.verdict(2, "ERROR collecting", reviewed)[0] == 2  # pytest could not run the tests
    assert t.verdict(1, "1 failed in 1s", reviewed)[0] == 1  # a failure the report does not name


def test_a_failure_inside_a_test_class_counts() -> None:
    # The SDK's compaction tests live in classes: "path::TestClass::test_name" must be read as test_name.
    t = tool()
    failed = "FAILED tests/memory/test_openai_responses_compaction_session.py::TestCompaction::test_new_one[x] - boom"
    status, lines = t.verdict(1, f"{failed}\n1 failed, 9 passed in 3s", {"test_reviewed": "why"})
    assert status == 1 and "test_new_one" in lines[-1]
    status, _ = t.verdict(1, f"{failed}\n1 failed in 3s", {"test_new_one": "why"})
    assert status == 0
