"""Shared fixtures: every async test runs on asyncio (debug mode) and trio."""

from __future__ import annotations

# The compaction and CLI tests open sessions through open_sessions' default backend, the JSONL one: named here so
# that an install of this package's tests (tools/package-tests, tools/compat-matrix) puts it beside the package.
import dsh.session_persistence_jsonl  # noqa: F401
from dsh.session_persistence.testing import use_noisy_machine_profile
from dsh.session_persistence.testing.fixtures import anyio_backend  # noqa: F401 - fixtures

use_noisy_machine_profile()
