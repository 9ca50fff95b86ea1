"""Streaming reads of a declared (v1) transcript: the batches from a seq on, a bounded run at a time.

The transcript is opened once and walked by its declarations with ``pread`` (batches that end before the wanted
seq are skipped without reading their data); each call of :meth:`DeclaredStream.next_run` decodes batches until
a run holds about :data:`RUN_EVENTS` events, so memory follows one run, never the log. The walk reads the file's
length at open: appends made meanwhile are not seen, and a torn tail ends the stream.

Blocking code for a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

from dsh.session_persistence.backend import SessionEvent, SessionHeader

from .._format.frames import Compression
from .._format.v0 import DecodedLog
from .._format.v1 import FdSource, is_declared, open_declared
from ..encryption import KeyProvider
from .fs import open_read

__all__ = ["RUN_EVENTS", "DeclaredStream", "open_stream"]

#: Events gathered per run handed back to the event loop (one thread hop per run, not per batch).
RUN_EVENTS = 4096


class DeclaredStream:
    """An open walk over one transcript; :meth:`close` releases its descriptor."""

    def __init__(self, fd: int, log: DecodedLog, batches: Iterator[Sequence[SessionEvent]], from_seq: int) -> None:
        self._fd: int | None = fd
        self._log = log
        self._batches = batches
        self._from_seq = from_seq

    @property
    def header(self) -> SessionHeader:
        """The transcript's header."""
        return self._log.header

    @property
    def inherited_event_count(self) -> int:
        """The inherited cut the header declares."""
        return self._log.inherited_event_count

    def next_run(self) -> list[SessionEvent] | None:
        """The next events with ``seq >= from_seq`` (about :data:`RUN_EVENTS`), ``None`` once the walk is done."""
        run: list[SessionEvent] = []
        for batch in self._batches:
            if batch[0].seq < self._from_seq:
                batch = batch[self._from_seq - batch[0].seq :]
            run.extend(batch)
            if len(run) >= RUN_EVENTS:
                return run
        return run or None

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def open_stream(
    path: str,
    compression: Compression,
    cap: int,
    from_seq: int,
    checkpoint: Callable[[], None],
    keys: KeyProvider | None = None,
) -> DeclaredStream | None:
    """Open ``path`` for a streaming walk from ``from_seq``; ``None`` if the transcript is a v0 log (the caller
    reads it whole). ``FileNotFoundError`` if it vanished."""
    fd = open_read(path)
    try:
        size = os.fstat(fd).st_size
        if not is_declared(os.pread(fd, 64, 0), compression):
            os.close(fd)
            return None
        log, batches = open_declared(
            FdSource(fd, size), compression, path, cap, from_seq=from_seq, checkpoint=checkpoint, keys=keys
        )
    except BaseException:
        os.close(fd)
        raise
    return DeclaredStream(fd, log, batches, from_seq)
