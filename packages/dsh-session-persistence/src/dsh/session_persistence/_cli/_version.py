"""``dsh-sessions --version``: the core's version and every installed ``dsh-*`` distribution's, from their metadata.

A bug report needs all of them: the command is the core's, but what it reads and writes depends on the backend
and the plugins installed beside it, which are released separately.
"""

from __future__ import annotations

import re
from importlib import metadata

from ._io import Io
from ._output import write_json

__all__ = ["CORE_DISTRIBUTION", "installed_dsh_distributions", "write_version"]

CORE_DISTRIBUTION = "dsh-session-persistence"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_dsh_distributions() -> dict[str, str]:
    """``{name: version}`` of every installed distribution named ``dsh-*``, sorted by name (the first one found on
    the path wins, as for imports)."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = _canonical(dist.metadata["Name"] or "")
        if name.startswith("dsh-") and name not in found:
            found[name] = dist.version
    return dict(sorted(found.items()))


def write_version(io: Io, *, as_json: bool) -> None:
    """``dsh-sessions X.Y.Z`` (the core's version), then one line per installed ``dsh-*`` distribution."""
    dists = installed_dsh_distributions()
    core = dists.get(CORE_DISTRIBUTION, "unknown")
    if as_json:
        write_json(io.out, {"version": core, "distributions": dists})
        return
    io.out.write(f"dsh-sessions {core} ({CORE_DISTRIBUTION})\n")
    width = max(map(len, dists), default=0)
    for name, version in dists.items():
        io.out.write(f"  {name.ljust(width)}  {version}\n")
