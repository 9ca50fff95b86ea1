"""The per-frame batch decode (``decode_frame_lines`` / ``LineScanner.feed_frame``) agrees with the per-line path."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dsh.session_persistence._events import encode_event
from dsh.session_persistence_jsonl._records import LineDefect, decode_frame_lines, decode_line, encode_batch
from dsh.session_persistence_jsonl._scan import CommittedDamage, LineScanner

from ._sessions import session_events, turn_batches
from .test_scan import _row_variants, ev


def _per_line(frame: bytes) -> list[Any] | None:
    try:
        return [e for line in frame.split(b"\n")[:-1] for e in decode_line(line)]
    except LineDefect:
        return None


def _wire(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _surface(seq: int, **override: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "assistant/message",
        "seq": seq,
        "time": 5,
        "surfaceOp": "append",
        "sourceEventSeqs": [0, 1],
        "data": {
            "turn": 1,
            "step": 0,
            "message": {
                "role": "assistant",
                "content": [{"type": "text", "text": "hi"}],
                "source": {"kind": "model", "provider": "p", "model": "m"},
            },
        },
    }
    event.update(override)
    return event


def _odd_lines() -> list[bytes]:
    user = {"role": "user", "content": [{"type": "text", "text": "x"}], "source": {"kind": "user"}}
    lines = [_wire(row) for row in _row_variants()]
    lines += [
        ev(3),
        ev(3, "turn/end"),
        _wire(_surface(9)),
        _wire(_surface(9, sourceEventSeqs=[])),
        _wire(_surface(9, sourceEventSeqs=[1, 1])),
        _wire(_surface(9, sourceEventSeqs=[9])),
        _wire(_surface(9, sourceEventSeqs=(3, 2**53))),
        _wire(_surface(9, surfaceOp="replace")),
        _wire({k: v for k, v in _surface(9).items() if k != "sourceEventSeqs"}),
        _wire(_surface(9, data={"turn": 1, "step": 0, "message": user})),
        _wire({"type": "user/message", "seq": 2, "time": 1, "surfaceOp": "append", "data": user}),
        _wire({"type": "x/unknown", "seq": 2, "time": 1, "data": {}, "ignorable": True}),
        b'{"type":"text-chunks","type":"turn/start","seq":1,"time":1,"data":{"turn":0}}',
        b'{"seq0":1,"type":"text-chunks","time0":2,"data":{"turn":0,"step":0,"index":0,"dt":[1],"texts":["a","b"]}}',
        b" " + ev(3) + b" ",
        ev(3) + b" " + ev(4),
        b"",
        b"   ",
        b"{",
        b"[1]",
    ]
    return lines


@pytest.mark.parametrize("line", _odd_lines())
def test_batch_decode_of_one_line_is_the_per_line_result_or_declines(line: bytes) -> None:
    got = decode_frame_lines(line + b"\n")
    if got is not None:
        assert [encode_event(e) for e in got] == [encode_event(e) for e in decode_line(line)]


def test_batch_decode_declines_frames_that_split_lines_differently() -> None:
    # A value spanning two lines, or two values on one line next to a blank one: never accepted as a batch.
    assert decode_frame_lines(b'{"type":"turn/start","seq":0,\n"time":1,"data":{"turn":0}}\n') is None
    assert decode_frame_lines(ev(0) + b" " + ev(1) + b"\n\n") is None
    assert decode_frame_lines(ev(0)) is None  # no final LF
    frame = ev(0) + b"\n" + ev(1) + b"\n"
    assert decode_frame_lines(frame) == _per_line(frame)


def test_batch_decode_of_a_realistic_log_equals_the_per_line_path() -> None:
    for pack in (True, False):
        frame = encode_batch(session_events(turns=4, steps=3, tokens=30), pack)
        got = decode_frame_lines(frame)
        assert got is not None
        assert got == _per_line(frame)


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
    good = [encode_batch(batch, True) for batch in turn_batches(3)]
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
