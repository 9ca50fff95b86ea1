"""`LineScanner.feed_frame` (a whole frame decoded in one batch) keeps the per-line bookkeeping of `feed`."""

from __future__ import annotations

from typing import Any

import pytest
from dsh.session_persistence.backend import encode_event, encode_storage_lines
from dsh.session_persistence_jsonl._format.v0 import CommittedDamage, LineScanner

from ._sessions import turn_batches


def _state(scanner: LineScanner) -> tuple[Any, ...]:
    return (
        [encode_event(e) for e in scanner.events],
        scanner.fed,
        scanner.committed,
        scanner.defect,
        scanner._line_no,
        scanner.has_fragment,
    )


def _run(frames: list[bytes], batch: bool) -> tuple[Any, ...]:
    scanner = LineScanner(strict=True)
    try:
        for frame in frames:
            scanner.feed_frame(frame) if batch else scanner.feed(frame)
    except CommittedDamage as exc:
        return ("damage", str(exc), _state(scanner))
    return ("ok", _state(scanner))


def _frame_sets() -> list[list[bytes]]:
    good = [encode_storage_lines(batch, pack_chunks=True) for batch in turn_batches(3)]
    bad_json = good[1][:-1] + b"\n{oops\n"
    return [
        good,
        [good[0], bad_json],
        [good[0], bad_json, good[2]],
        [good[0], good[2]],  # seq gap at a frame boundary
        [good[0], good[1][: good[1].index(b"\n") + 1]],
        [good[0], good[1] + good[1]],  # the repeat's seqs do not continue
        [good[0], good[1] + b"tail"],  # a fragment
        [good[0], b"\n" + good[1]],
    ]


@pytest.mark.parametrize("frames", _frame_sets())
def test_feed_frame_keeps_the_per_line_bookkeeping(frames: list[bytes]) -> None:
    assert _run(frames, batch=True) == _run(frames, batch=False)
