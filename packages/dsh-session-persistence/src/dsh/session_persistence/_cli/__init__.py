"""The ``dsh-sessions`` command line: inspect, verify, repair and export stored sessions, and run the crash demo.

The console script calls :func:`main`; everything else in this subpackage is private.
"""

from __future__ import annotations

from ._main import main

__all__ = ["main"]
