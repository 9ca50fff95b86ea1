"""dsh sessions checkpoint policy: flush the live session before model requests, tool bodies and each step.

Register :class:`CheckpointPolicy` beside a persistence backend (``PersistenceCoordinator``), or install this
distribution and call ``Host.load_entrypoints()``. See the package README for guarantees and limits.
"""

from __future__ import annotations

from ._policy import NAME, REQUIRES, CheckpointPolicy

__all__ = ["NAME", "REQUIRES", "CheckpointPolicy"]
