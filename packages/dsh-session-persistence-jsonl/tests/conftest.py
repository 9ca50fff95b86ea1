"""Shared fixtures: every async test runs on asyncio (debug mode) and trio."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dsh.session_persistence.invariant import HostWatch, watch_new_hosts
from dsh.session_persistence.testing import use_noisy_machine_profile

use_noisy_machine_profile()


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(("asyncio", {"debug": True}), id="asyncio"),
        pytest.param(("trio", {}), id="trio"),
    ],
)
def anyio_backend(request: pytest.FixtureRequest) -> object:
    return request.param


@pytest.fixture(autouse=True)
def turn_invariants() -> Iterator[HostWatch]:
    """Every Host a test builds carries the turn/step invariant companion; a recorded violation fails the test."""
    with watch_new_hosts() as watch:
        yield watch
    watch.assert_clean()
