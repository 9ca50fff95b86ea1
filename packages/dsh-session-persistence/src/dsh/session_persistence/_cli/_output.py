"""Output helpers: JSON documents, sizes and times, tables, and the progress indicator (stderr TTY only)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = ["Progress", "human_size", "iso_time", "local_time", "table", "write_json"]


def write_json(out: TextIO, document: object) -> None:
    """One JSON document, indented, UTF-8 text as is."""
    out.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def human_size(size: int | None) -> str:
    """``1.2 kB`` style (decimal units), ``-`` for unknown."""
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")  # pragma: no cover


def iso_time(ms: int | None) -> str | None:
    """Epoch milliseconds as an ISO 8601 UTC string (JSON output)."""
    if ms is None:
        return None
    stamp = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def local_time(ms: int | None) -> str:
    """Epoch milliseconds in local time, to the second (human output)."""
    if ms is None:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def table(out: TextIO, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A left-aligned text table; the last column is not padded."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        parts = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        out.write("  ".join(parts).rstrip() + "\n")


class Progress:
    """``label n/total`` rewritten in place on ``stream``, only when it is a TTY; erased by :meth:`done`."""

    def __init__(self, stream: TextIO, label: str, total: int) -> None:
        self._stream = stream
        self._label = label
        self._total = total
        self._width = 0
        try:
            self.enabled = stream.isatty() and total > 1
        except (AttributeError, ValueError):
            self.enabled = False

    def update(self, done: int) -> None:
        """Show that ``done`` items are finished."""
        if not self.enabled:
            return
        text = f"{self._label} {done}/{self._total}"
        self._width = max(self._width, len(text))
        self._stream.write("\r" + text.ljust(self._width))
        self._stream.flush()

    def done(self) -> None:
        """Erase the indicator."""
        if self.enabled and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
