"""The order in which ``hatch run tests`` hands the test files to its xdist workers: the longest files first.

``--dist loadfile`` gives each worker one whole file at a time, the next one when it is nearly out of work. xdist's
own order (most tests first) hands out the few-test, long files (kit runs in a subprocess, crash sweeps, killed
processes) last, so one worker was still inside one of them long after the other two had run out of files. Handing
out the longest files first and the many short ones after them (longest processing time first) lets the short
files fill the gaps. Only the order of the files changes: every test still runs, and each file still runs in one
worker with its tests in their own order. The hatch script passes ``--no-loadscope-reorder`` so that xdist keeps
this order.

``LONGEST`` is a measurement, not a rule (per-file time summed from ``--junitxml``, the gate's three workers on the
2-core machine, 2026-12-02): a stale entry only costs balance. Files not listed follow in xdist's usual order.
"""

from __future__ import annotations

import pytest

#: The longest test files, longest first (seconds of test time each, measured with ``--junitxml``).
LONGEST = (
    "packages/dsh-session-persistence-jsonl/tests/test_encryption.py",  # 260 s
    "tests-integration/test_sqlite_variants.py",  # 246 s: one kit run in a subprocess takes 140 s
    "packages/dsh-session-persistence/tests/test_cli_lifecycle.py",  # 472 s before its usage checks ran in-process
    "packages/dsh-session-persistence-postgres/tests/test_conformance.py",  # 209 s
    "packages/dsh-session-persistence-jsonl/tests/test_crash_sweeps.py",  # 193 s
    "tests-integration/test_sqlite_backend.py",  # 144 s
    "packages/dsh-session-persistence-jsonl/tests/test_golden_logs.py",  # 141 s
    "tests-integration/test_continue_crash.py",  # 131 s
    "tests-integration/test_faults_below_python.py",  # 117 s
    "tests-integration/test_demo_real_model.py",  # 111 s
    "packages/dsh-session-persistence-jsonl/tests/test_conformance.py",  # 109 s
    "packages/dsh-session-persistence/tests/test_conformance_kit.py",  # 98 s
    "tests-integration/test_failure_never_sticks.py",  # 91 s
    "packages/dsh-session-persistence-jsonl/tests/test_zero_tails.py",  # 82 s
    "tests-integration/test_crash.py",  # 72 s
    "packages/dsh-session-persistence-jsonl/tests/test_bounded_reads.py",  # 68 s
    "tests-integration/test_release_reads_new_logs.py",  # 67 s
    "tests-integration/test_openai_agents_crash.py",  # 55 s
    "tests-integration/test_pydantic_ai_crash.py",  # 51 s (one process, 2026-12-07)
    "packages/dsh-session-pydantic-ai/tests/test_history_property.py",  # 50 s (one process, 2026-12-07)
    "packages/dsh-session-persistence-jsonl/tests/test_crash_states.py",  # 48 s
    "packages/dsh-session-persistence-jsonl/tests/test_race.py",  # 47 s
    "packages/dsh-session-persistence-postgres/tests/test_crash.py",  # 40 s
    "packages/dsh-session-persistence-postgres/tests/test_restarts.py",  # 38 s
)

_RANK = {path: rank for rank, path in enumerate(LONGEST)}


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    counts: dict[str, int] = {}
    for item in items:
        counts[_file(item)] = counts.get(_file(item), 0) + 1
    # Listed files by rank, then the others by test count (xdist's own heuristic); sort is stable, so each file's
    # tests keep their order and files of equal key keep the collection's.
    items.sort(key=lambda item: (_RANK.get(_file(item), len(LONGEST)), -counts[_file(item)]))
