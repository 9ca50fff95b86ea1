"""A SQLite backend written from the backend guide as a third party would (``sqlite_backend.py``) runs the kit.

The correct backend passes the whole :class:`BackendConformance` kit, the storage-level contract cases, faults
and cancellation inside its primitives, and the opt-in crash-state harness. The buggy variants are in ``test_sqlite_variants.py``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from dsh.session_persistence.testing import (
    BackendConformance,
    CrashBackend,
    CrashStateConformance,
    PrimitiveFaultConformance,
    StorageContractConformance,
)
from sqlite_backend import SqliteBackend

HERE = Path(__file__).resolve().parent


class TestSqliteConformance(BackendConformance):
    @pytest.fixture
    def backend_factory(self, tmp_path: Path) -> Any:
        return lambda: SqliteBackend(tmp_path / "store")

    @pytest.fixture
    def process_backend_factory(self, tmp_path: Path) -> Any:
        return functools.partial(SqliteBackend, tmp_path / "store")


class TestSqliteStorageContract(StorageContractConformance):
    @pytest.fixture
    def backend_factory(self, tmp_path: Path) -> Any:
        return lambda: SqliteBackend(tmp_path / "store")


class TestSqliteCrashStates(CrashStateConformance, PrimitiveFaultConformance):
    @pytest.fixture
    def crash_backend(self) -> CrashBackend:
        return CrashBackend("sqlite_backend:SqliteBackend", sys_path=[str(HERE)])
