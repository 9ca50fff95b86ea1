"""Ready-made pytest fixtures for suites built on dsh sessions (needs pytest).

Import the ones you want into a ``conftest.py``; pytest picks up fixtures found in a conftest's namespace::

    from dsh.session_persistence.testing.fixtures import anyio_backend, turn_invariants
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..invariant import HostWatch, watch_new_hosts

__all__ = ["ANYIO_BACKENDS", "anyio_backend", "turn_invariants"]

#: asyncio in debug mode and trio: every async test runs on both.
ANYIO_BACKENDS = [
    pytest.param(("asyncio", {"debug": True}), id="asyncio"),
    pytest.param(("trio", {}), id="trio"),
]


@pytest.fixture(scope="module", params=ANYIO_BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    """The anyio backend of the current test: each async test runs once per entry of :data:`ANYIO_BACKENDS`."""
    return request.param


@pytest.fixture(autouse=True)
def turn_invariants() -> Iterator[HostWatch]:
    """Every Host a test builds carries the turn/step invariant companion; a recorded violation fails the test."""
    with watch_new_hosts() as watch:
        yield watch
    watch.assert_clean()
