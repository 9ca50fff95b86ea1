"""The three streams a command talks to (injectable for tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

__all__ = ["Io"]


@dataclass(frozen=True)
class Io:
    """stdout (results), stderr (errors, prompts, progress) and stdin (confirmation)."""

    out: TextIO
    err: TextIO
    inp: TextIO
