"""Shared fixtures: every async test runs on asyncio (debug mode) and trio."""

from __future__ import annotations

import pytest
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
