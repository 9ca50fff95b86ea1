"""Shared fixtures for the integration suite: every async test runs on asyncio (debug mode) and trio.

The suite composes the three distributions as a user would (plugins discovered through ``Host.load_entrypoints()``).
Helper modules (``loop_rig``, ``crash_check``, ``crash_child``) live beside the tests; there is no ``__init__.py``
(test module names would collide across packages), so this directory is put on ``sys.path`` for them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dsh.session_persistence.invariant import HostWatch, watch_new_hosts
from dsh.session_persistence.testing import use_noisy_machine_profile

use_noisy_machine_profile()

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


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
