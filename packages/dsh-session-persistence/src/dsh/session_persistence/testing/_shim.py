"""Build and describe the LD_PRELOAD fault and trace shim (``_faultshim.c``, shipped with this package).

The shim fails chosen system calls (write, pwrite, fsync, fdatasync, ftruncate, link, rename, unlink, and the
fsync of a directory) with ``EIO``/``ENOSPC``, optionally after performing them, and can record every durable
call with its data. It is compiled with the machine's C compiler into a directory the caller owns and preloaded
into a child process only: the thing under test then runs unmodified, and the faults happen below Python.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

__all__ = ["FaultRule", "ShimUnavailableError", "build_shim", "fault_spec", "find_c_compiler", "shim_environment"]

SOURCE_NAME = "_faultshim.c"
OPS = frozenset({"write", "pwrite", "fsync", "fdatasync", "ftruncate", "link", "rename", "unlink", "dirfsync"})


class ShimUnavailableError(RuntimeError):
    """The shim cannot be used here (no C compiler, not Linux, or the build failed); the message says which."""


@dataclass(frozen=True)
class FaultRule:
    """One fault: fail the ``nth`` matching call (and ``count - 1`` more; ``count=0``: every later one).

    ``ops`` names the calls that count (``"dirfsync"`` is an fsync of a directory descriptor), ``path`` a
    substring the call's path must contain, ``after=True`` performs the real call before failing it.
    ``pause`` (a path) fails nothing: the matching call announces itself by creating ``<pause>.paused``, then
    waits until ``pause`` exists and runs normally (a deterministic point inside a primitive).
    """

    ops: tuple[str, ...]
    path: str = ""
    nth: int = 1
    count: int = 1
    errno: str = "EIO"
    after: bool = False
    pause: str = ""

    def __post_init__(self) -> None:
        unknown = set(self.ops) - OPS
        if unknown or not self.ops:
            raise ValueError(f"unknown or missing shim ops {sorted(unknown)}; known: {sorted(OPS)}")
        if self.nth < 1 or self.count < 0:
            raise ValueError("nth must be >= 1 and count >= 0")
        if any(c in self.path + self.pause for c in ";|"):
            raise ValueError("a fault path may not contain ';' or '|'")

    def spec(self) -> str:
        """This rule in the shim's ``DSH_SHIM_FAULT`` syntax."""
        parts = [f"op={','.join(self.ops)}", f"nth={self.nth}", f"count={self.count}", f"errno={self.errno}"]
        if self.path:
            parts.append(f"path={self.path}")
        if self.after:
            parts.append("after=1")
        if self.pause:
            parts.append(f"pause={self.pause}")
        return ";".join(parts)


def fault_spec(rules: Iterable[FaultRule]) -> str:
    """The ``DSH_SHIM_FAULT`` value for ``rules`` (an empty string heals every fault)."""
    return "|".join(rule.spec() for rule in rules)


def find_c_compiler() -> str | None:
    """``$CC``, else ``cc``, ``gcc`` or ``clang`` on ``PATH``; ``None`` when there is none."""
    candidates = [os.environ.get("CC", ""), "cc", "gcc", "clang"]
    for candidate in candidates:
        if candidate:
            found = shutil.which(candidate)
            if found:
                return found
    return None


def build_shim(directory: str | os.PathLike[str]) -> Path:
    """Compile the shim into ``directory`` and return the shared object's path.

    Raises :class:`ShimUnavailableError` (with the reason) when the platform has no ``LD_PRELOAD`` and
    ``/proc/self/fd``, when no C compiler exists, or when compiling fails.
    """
    if not sys.platform.startswith("linux"):
        raise ShimUnavailableError(f"the LD_PRELOAD shim needs Linux (/proc/self/fd), not {sys.platform}")
    compiler = find_c_compiler()
    if compiler is None:
        raise ShimUnavailableError("no C compiler (cc, gcc or clang) on PATH to build the LD_PRELOAD shim")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    source = out / SOURCE_NAME
    source.write_bytes(resources.files(__package__).joinpath(SOURCE_NAME).read_bytes())
    library = out / "dsh_faultshim.so"
    command = [compiler, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(library), str(source), "-ldl", "-lpthread"]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ShimUnavailableError(f"building the shim failed ({' '.join(command)}):\n{proc.stderr}")
    return library


def shim_environment(
    library: str | os.PathLike[str],
    *,
    rules: Iterable[FaultRule] = (),
    record: str | os.PathLike[str] | None = None,
    record_under: Iterable[str | os.PathLike[str]] = (),
    log: str | os.PathLike[str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A child environment that preloads ``library`` with the given faults and trace recording."""
    env = dict(os.environ if base is None else base)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{os.fspath(library)} {preload}".strip()
    env["DSH_SHIM_FAULT"] = fault_spec(rules)
    if record is not None:
        env["DSH_SHIM_RECORD"] = os.fspath(record)
        env["DSH_SHIM_RECORD_UNDER"] = ":".join(os.fspath(p) for p in record_under)
    if log is not None:
        env["DSH_SHIM_LOG"] = os.fspath(log)
    return env
