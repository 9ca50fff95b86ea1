"""Random access to a transcript's bytes: the same declared-batch walk runs over an in-memory read (load) or a
descriptor it seeks in with ``pread`` (read_from, list), so only the declarations and the wanted batches are read."""

from __future__ import annotations

import os

__all__ = ["BufferSource", "FdSource", "Source"]


class Source:
    """Random access to a transcript of ``size`` bytes."""

    size: int

    def read(self, start: int, stop: int) -> bytes | memoryview:  # pragma: no cover - interface
        raise NotImplementedError


class BufferSource(Source):
    """A transcript already read into memory."""

    def __init__(self, buf: bytes) -> None:
        self.data = buf
        self.view = memoryview(buf)
        self.size = len(buf)

    def read(self, start: int, stop: int) -> memoryview:
        return self.view[start:stop]


class FdSource(Source):
    """A transcript read on demand with ``pread`` (only the declarations and the wanted batches are read)."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self.size = size

    def read(self, start: int, stop: int) -> bytes:
        parts: list[bytes] = []
        pos = start
        while pos < stop:
            chunk = os.pread(self._fd, min(stop - pos, 1 << 24), pos)
            if not chunk:
                break
            parts.append(chunk)
            pos += len(chunk)
        return b"".join(parts)
