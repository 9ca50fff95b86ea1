"""Shared fixtures: every async test runs on asyncio (debug mode) and trio."""

from __future__ import annotations

from dsh.session_persistence.testing import use_noisy_machine_profile
from dsh.session_persistence.testing.fixtures import anyio_backend  # noqa: F401 - fixtures

use_noisy_machine_profile()
