"""Shared fixtures: async tests run on asyncio (debug mode) and trio (pydantic-ai's own runs: asyncio only); the
stores the history property runs on: the memory backend, JSONL and PostgreSQL, each plaintext and sealed."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# The default backend of open_sessions and the ones the history property runs on: named here so that an install of
# this package's tests (tools/package-tests, tools/compat-matrix) puts them beside the package.
import dsh.session_persistence_jsonl
import dsh.session_persistence_postgres  # noqa: F401
import pytest
from dsh.session_persistence import MemoryBackend, MemoryStore
from dsh.session_persistence.backend import SessionBackend
from dsh.session_persistence.encryption import StaticKeyProvider
from dsh.session_persistence.testing import use_noisy_machine_profile
from dsh.session_persistence.testing.fixtures import anyio_backend  # noqa: F401 - fixtures
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_postgres import PostgresBackend

use_noisy_machine_profile()

KEYS = StaticKeyProvider("k1", {"k1": bytes(range(32))})

# The throwaway PostgreSQL cluster of the PostgreSQL backend's own tests (initdb + pg_ctl; tools/postgres-setup
# installs the binaries): a test helper file of that distribution's source tree, loaded by path, not a dsh module.
_PGSERVER = Path(__file__).resolve().parents[2] / "dsh-session-persistence-postgres" / "tests" / "_pgserver.py"


def _pgserver() -> Any:
    spec = importlib.util.spec_from_file_location("dsh_pydantic_ai_pgserver", _PGSERVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A throwaway PostgreSQL server for the run (skips without the binaries, fails under DSH_REQUIRE_POSTGRES=1)."""
    with _pgserver().running_cluster() as cluster:
        yield cluster.dsn


StoreFactory = Callable[[], SessionBackend]


@pytest.fixture(params=["memory", "jsonl", "jsonl-sealed", "postgres", "postgres-sealed"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """A factory of backend instances over one store: each call is a fresh backend, as a new process would open."""
    kind: str = request.param
    if kind == "memory":
        shared = MemoryStore()
        return lambda: MemoryBackend(shared)
    if kind.startswith("jsonl"):
        sealed = {"encryption": KEYS} if kind.endswith("sealed") else {}
        return lambda: JsonlBackend(tmp_path / "sessions", **sealed)
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    sealed = {"encryption": KEYS} if kind.endswith("sealed") else {}
    return lambda: PostgresBackend(dsn, schema=schema, **sealed)
