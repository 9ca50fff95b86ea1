"""Shared fixtures: async tests run on asyncio (debug mode) and trio; one throwaway PostgreSQL server per run."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from dsh.session_persistence.testing import use_noisy_machine_profile
from dsh.session_persistence.testing.fixtures import anyio_backend  # noqa: F401 - fixtures

from ._pgserver import PgCluster, running_cluster
from ._proxy import PgProxy, running_proxy

use_noisy_machine_profile()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """A throwaway cluster for the whole run (skips, or fails under ``DSH_REQUIRE_POSTGRES=1``, without one)."""
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def postgres_dsn(pg_cluster: PgCluster) -> str:
    """libpq connection string of the test database."""
    return pg_cluster.dsn


@pytest.fixture
def fresh_schema() -> Callable[[], str]:
    """Names of PostgreSQL schemas no test used before: each one is an empty, independent store."""
    return lambda: f"t_{uuid.uuid4().hex[:16]}"


@pytest.fixture
def proxy(pg_cluster: PgCluster) -> Iterator[PgProxy]:
    """A fault-injecting TCP proxy in front of the test server (see ``_proxy.py``)."""
    with running_proxy(pg_cluster.port) as p:
        yield p


@pytest.fixture
def proxy_dsn(proxy: PgProxy, pg_cluster: PgCluster) -> str:
    """libpq connection string of the test database through :func:`proxy`."""
    return proxy.dsn(pg_cluster.dbname, pg_cluster.user)
