"""dsh sessions, the safe set: ``pip install dsh-sessions`` installs the core, the JSONL backend and the checkpoint
policy together, so an agent started with :func:`open_sessions` is crash-safe without further assembly.

This distribution adds no behaviour of its own: :func:`open_sessions` is ``dsh.session_persistence.open_sessions``,
and :data:`SAFE_SET` names what the install brings (the ``dsh-sessions`` command comes with the core).
"""

from __future__ import annotations

from dsh.session_persistence import open_sessions

__all__ = ["SAFE_SET", "open_sessions"]

#: The distributions ``pip install dsh-sessions`` installs: the core, the default backend, the checkpoint policy.
SAFE_SET: tuple[str, ...] = (
    "dsh-session-persistence",
    "dsh-session-persistence-jsonl",
    "dsh-session-checkpoint-policy",
)
