"""The kit catches each deliberately buggy SQLite backend that today's ``BackendConformance`` lets through.

Each case writes a kit subclass for one variant of ``sqlite_backend.py`` into a pytester directory, runs it in
a subprocess, and checks that exactly the kit case aimed at that bug fails (and names the bug):

| variant | bug | the kit case that fails |
| --- | --- | --- |
| ``NoSeqCheckSqliteBackend`` | trusts the coordinator's cursor | ``StorageContractConformance`` stale writer, two coordinators |
| ``TwoTransactionSqliteBackend`` | header and first batch in two transactions | fault inside the first append |
| ``AckBeforeDurableSqliteBackend`` | ``synchronous=OFF`` | crash states |
| ``UnshieldedSqliteBackend`` | ``abandon_on_cancel``: returns while the write runs | cancelled write |
| ``RerenderedRawSqliteBackend`` | ``read_raw`` re-encodes the stored JSON | raw artifact is the stored text |
| ``PerSessionRevisionSqliteBackend`` | revision counts the session's writes | revision after delete + re-create |

The correct ``SqliteBackend`` passes all of them (``test_sqlite_backend.py``); ``RawTextSqliteBackend`` and
``DeletingSqliteBackend`` (the same backend with a correct ``read_raw`` or ``delete``) pass the cases that catch
the last two.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ("pytester",)
pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent

TEMPLATE = """
import sys
sys.path.insert(0, {here!r})
import pytest
from dsh.session_persistence.testing import CrashBackend, {kit}
from sqlite_backend import {variant}


class TestVariant({kit}):
    @pytest.fixture
    def backend_factory(self, tmp_path):
        return lambda: {variant}(tmp_path / "store")

    @pytest.fixture
    def crash_backend(self):
        return CrashBackend("sqlite_backend:{variant}", sys_path=[{here!r}])
"""


def run_kit(pytester: pytest.Pytester, variant: str, kit: str, select: str) -> pytest.RunResult:
    pytester.makepyfile(test_variant=TEMPLATE.format(here=str(HERE), kit=kit, variant=variant))
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-k", select)


def test_no_seq_check_is_caught_by_the_storage_contract(pytester: pytest.Pytester) -> None:
    # Two coordinators in one process no longer reach the backend (the coordinator's writer lease stops the second
    # one first), so the stale-writer case is the one that needs the backend's own seq check.
    result = run_kit(pytester, "NoSeqCheckSqliteBackend", "StorageContractConformance", "stale_writer")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 2, result.stdout.str()  # asyncio and trio
    result.stdout.fnmatch_lines(["*IntegrityError*"])


def test_two_transactions_are_caught_by_a_fault_inside_the_first_append(pytester: pytest.Pytester) -> None:
    result = run_kit(pytester, "TwoTransactionSqliteBackend", "PrimitiveFaultConformance", "all_or_nothing")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*listed, stored [[][]] instead of nothing or the batch*"])


def test_ack_before_durable_is_caught_by_the_crash_states(pytester: pytest.Pytester) -> None:
    result = run_kit(pytester, "AckBeforeDurableSqliteBackend", "CrashStateConformance", "crash_states")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*nothing stored after 1 acknowledgement(s)*"])


def test_unshielded_writes_are_caught_by_a_cancelled_write(pytester: pytest.Pytester) -> None:
    result = run_kit(pytester, "UnshieldedSqliteBackend", "PrimitiveFaultConformance", "cancelled_write")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*append_batch returned while its write was still in progress*"])


@pytest.mark.parametrize(
    ("variant", "kit", "select"),
    [
        ("NoSeqCheckSqliteBackend", "PrimitiveFaultConformance", "cancelled_write"),
        ("TwoTransactionSqliteBackend", "StorageContractConformance", "stale_writer or coordinators"),
        ("UnshieldedSqliteBackend", "StorageContractConformance", "stale_writer or coordinators"),
    ],
)
def test_each_variant_passes_the_cases_aimed_at_other_bugs(
    pytester: pytest.Pytester, variant: str, kit: str, select: str
) -> None:
    """A control: the catching cases are specific (a variant fails only the case aimed at its own bug)."""
    result = run_kit(pytester, variant, kit, select)
    assert result.parseoutcomes().get("failed", 0) == 0, result.stdout.str()
    assert result.parseoutcomes().get("passed", 0) > 0, result.stdout.str()


def test_rerendered_raw_text_is_caught_by_the_raw_artifact_case(pytester: pytest.Pytester) -> None:
    result = run_kit(pytester, "RerenderedRawSqliteBackend", "BackendConformance", "read_raw")
    result.assert_outcomes(failed=2, passed=2)  # the new case on asyncio and trio; the old read_raw case passes
    result.stdout.fnmatch_lines(["*test_read_raw_is_the_stored_text*", "*does not hold the stored bytes of event 0*"])


def test_a_revision_reused_after_delete_is_caught(pytester: pytest.Pytester) -> None:
    result = run_kit(pytester, "PerSessionRevisionSqliteBackend", "BackendConformance", "revision_never_comes_back")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*gave a revision back after a re-create*"])


@pytest.mark.parametrize(
    ("variant", "select"),
    [
        ("RawTextSqliteBackend", "read_raw"),
        ("DeletingSqliteBackend", "delete or revision"),
        # Each new case is specific: the other variant's bug does not trip it.
        ("PerSessionRevisionSqliteBackend", "read_raw or delete_is or delete_refusals"),
    ],
)
def test_the_correct_optional_primitives_pass_the_new_cases(
    pytester: pytest.Pytester, variant: str, select: str
) -> None:
    """A control: the cases fail on the bug, not on the primitive (the correct ``read_raw``/``delete`` pass)."""
    result = run_kit(pytester, variant, "BackendConformance", select)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()
    assert outcomes.get("passed", 0) >= 2, result.stdout.str()
