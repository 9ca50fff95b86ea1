"""Invariant companion of ``dsh-session-persistence-postgres`` (entry-point group ``dsh.session.invariants``).

No runtime invariant: the backend holds no live in-process relation between calls. Seq contiguity and
one-writer-per-seq are enforced by the database itself (a compare-and-set on ``next_seq`` and the
``(session_id, seq)`` primary key), inside one transaction per primitive. Registering the companion records that
ownership, so an inventory of companions (``dsh.session_persistence.invariant.load_invariant_companions``) accounts
for this package.
"""

from __future__ import annotations

from dsh.session_persistence import Host
from dsh.session_persistence.invariant import NoRuntimeInvariant, register_no_runtime_invariant

__all__ = ["NAME", "PACKAGE", "REASON", "register"]

#: Plugin name of this companion on a host.
NAME = "session-persistence-postgres-invariant"
#: The distribution that owns this companion.
PACKAGE = "dsh-session-persistence-postgres"
#: Why nothing is checked at runtime.
REASON = (
    "no runtime invariant: the backend keeps no live in-process relation; seq contiguity is enforced by the "
    "database (compare-and-set on next_seq, primary key on (session_id, seq)) in one transaction per primitive"
)


def register(host: Host) -> NoRuntimeInvariant:
    """Register this package's companion on ``host`` (or return the one already there)."""
    return register_no_runtime_invariant(host, NAME, PACKAGE, REASON)
