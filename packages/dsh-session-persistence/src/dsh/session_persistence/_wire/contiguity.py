"""Seq contiguity: a stored log and every appended batch carry the seqs ``start, start + 1, ...`` with no gap."""

from __future__ import annotations

import operator
from collections.abc import Sequence

from .._model.errors import SeqMismatchError
from .._model.events import SessionEvent

__all__ = ["check_contiguous", "first_seq_gap"]

_seq_of = operator.attrgetter("seq")


def first_seq_gap(events: Sequence[SessionEvent], start: int = 0) -> int | None:
    """The index of the first event whose seq is not ``start + index``, or ``None`` when ``events`` are contiguous.

    For readers that report a gap in their own words (a line number, a storage row).
    """
    # One C-level comparison for the common (valid) case; the loop only runs to find the first bad index.
    if list(map(_seq_of, events)) == list(range(start, start + len(events))):
        return None
    for index, event in enumerate(events):
        if event.seq != start + index:
            return index
    return None  # pragma: no cover - the comparison above found a difference


def check_contiguous(session_id: str, start: int, events: Sequence[SessionEvent]) -> None:
    """Raise :class:`SeqMismatchError` unless ``events`` carry ``start, start + 1, ...``.

    What an append checks before it writes: ``start`` is the number of events already stored.
    """
    index = first_seq_gap(events, start)
    if index is not None:
        raise SeqMismatchError(
            f'append seq mismatch for "{session_id}": expected {start + index} at index {index}, '
            f"got {events[index].seq}"
        )
