"""Shared fixtures for the integration suite: every async test runs on asyncio (debug mode) and trio.

The suite composes the distributions as a user would (plugins discovered through ``Host.load_entrypoints()``).
Helper modules (``loop_rig``, ``crash_check``, ``crash_child``) live beside the tests; there is no ``__init__.py``
(test module names would collide across packages), so this directory is put on ``sys.path`` for them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dsh.session_persistence.testing import use_noisy_machine_profile
from dsh.session_persistence.testing.fixtures import anyio_backend, turn_invariants  # noqa: F401 - fixtures

use_noisy_machine_profile()

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
