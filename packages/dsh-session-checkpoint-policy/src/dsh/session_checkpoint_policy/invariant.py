"""Invariant companion of ``dsh-session-checkpoint-policy`` (entry-point group ``dsh.session.invariants``).

No runtime invariant: checkpoint ordering is enforced at the boundary hooks the policy wraps (``llm_stream``,
``tools_execute``, ``agent_pre_step``) and by the coordinator's flush barrier; this stateless policy owns no
independent mutable relation to check. Registering the companion records that ownership, so an inventory of
companions (``dsh.session_persistence.invariant.load_invariant_companions``) accounts for this package.
"""

from __future__ import annotations

from dsh.session_persistence import Host
from dsh.session_persistence.invariant import NoRuntimeInvariant, register_no_runtime_invariant

__all__ = ["NAME", "PACKAGE", "REASON", "register"]

#: Plugin name of this companion on a host.
NAME = "session-checkpoint-policy-invariant"
#: The distribution that owns this companion.
PACKAGE = "dsh-session-checkpoint-policy"
#: Why nothing is checked at runtime.
REASON = (
    "no runtime invariant: checkpoint ordering is enforced at the intercepted boundary hooks and the persistence "
    "flush barrier; this stateless policy owns no independent mutable relation"
)


def register(host: Host) -> NoRuntimeInvariant:
    """Register this package's companion on ``host`` (or return the one already there)."""
    return register_no_runtime_invariant(host, NAME, PACKAGE, REASON)
