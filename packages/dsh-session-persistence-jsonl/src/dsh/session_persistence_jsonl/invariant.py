"""Invariant companion of ``dsh-session-persistence-jsonl`` (entry-point group ``dsh.session.invariants``).

No runtime invariant: the backend holds no live in-process relation between calls. Its guarantees (append-only
frames, contiguous seqs on disk, torn-tail versus corruption, identity of a transcript with its path) are properties
of the stored files, checked on every read and proven by the backend's round-trip, crash-sweep and conformance tests.
Registering the companion records that ownership, so an inventory of companions
(``dsh.session_persistence.invariant.load_invariant_companions``) accounts for this package.
"""

from __future__ import annotations

from dsh.session_persistence import Host
from dsh.session_persistence.invariant import NoRuntimeInvariant, register_no_runtime_invariant

__all__ = ["NAME", "PACKAGE", "REASON", "register"]

#: Plugin name of this companion on a host.
NAME = "session-persistence-jsonl-invariant"
#: The distribution that owns this companion.
PACKAGE = "dsh-session-persistence-jsonl"
#: Why nothing is checked at runtime.
REASON = (
    "no runtime invariant: the backend keeps no live in-process relation; its guarantees are properties of the "
    "stored files, checked on every read and proven by round-trip and crash-tail tests"
)


def register(host: Host) -> NoRuntimeInvariant:
    """Register this package's companion on ``host`` (or return the one already there)."""
    return register_no_runtime_invariant(host, NAME, PACKAGE, REASON)
