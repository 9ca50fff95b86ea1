"""StoredEvents: a decoded batch whose packed chunk runs expand only where a reader asks (DESIGN §12.2).

Every operation is checked against the expanded list of the same events (what ``decode_storage_lines`` gives).
"""

from __future__ import annotations

import pickle
from collections.abc import MutableSequence, Sequence
from typing import Any

import pytest
from dsh.session_persistence._model.stored_events import PackedRun, packed_run
from dsh.session_persistence.backend import (
    SessionEvent,
    StoredEvents,
    decode_storage_lines,
    decode_stored_batch,
    encode_storage_lines,
)
from dsh.session_persistence.testing import event, step_end, step_start, turn_end, turn_start, user_message
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UNSET


def chunk(seq: int, time: int, text: str, *, kind: str = "text-delta", turn: int = 1, step: int = 1) -> SessionEvent:
    if kind == "tool-call-delta":
        body: dict[str, Any] = {"type": kind, "index": 0, "id": "c1", "argumentsDelta": text}
    else:
        body = {"type": kind, "index": 0, "text": text}
    return event(seq, "assistant/chunk", {"turn": turn, "step": step, "chunk": body})


def streamed_log() -> list[SessionEvent]:
    """seq 0..14: a turn whose step streams a 5-member text run, a 3-member tool run and 2 loose reasoning chunks."""
    events = [turn_start(0, 1), step_start(1, 1, 1)]
    events += [chunk(2 + k, 100 + k, f"t{k}") for k in range(5)]
    events += [chunk(7 + k, 200 - k, f"a{k}", kind="tool-call-delta") for k in range(3)]
    events += [chunk(10 + k, 300, f"r{k}", kind="reasoning-delta") for k in range(2)]
    events += [step_end(12, 1, 1), turn_end(13, 1), turn_start(14, 2)]
    return events


def packed(events: list[SessionEvent], first_seq: int = 0) -> StoredEvents:
    data = encode_storage_lines(events, pack_chunks=True)
    decoded, contiguous = decode_stored_batch(data, first_seq)
    assert contiguous
    assert isinstance(decoded, StoredEvents)
    return decoded


def runs_of(events: StoredEvents) -> list[PackedRun]:
    return [item for item in events._segments() if isinstance(item, PackedRun)]


def test_a_packed_batch_decodes_to_runs_that_are_not_expanded_until_asked() -> None:
    log = streamed_log()
    lazy = packed(log)
    runs = runs_of(lazy)
    assert [run.count for run in runs] == [5, 3]  # the two loose reasoning chunks are stored verbatim
    assert len(lazy) == len(log) == 15
    assert all(run._events is None for run in runs)
    assert lazy[0] == log[0] and lazy[-1] == log[-1] and lazy[12] == log[12]
    assert all(run._events is None for run in runs)  # plain events never expand a run
    assert lazy[8] == log[8]
    assert runs[0]._events is None and runs[1]._events is not None  # only the run that was asked for
    assert list(lazy) == log == decode_storage_lines(encode_storage_lines(log, pack_chunks=True))


def test_expansion_is_cached_so_identity_is_stable() -> None:
    lazy = packed(streamed_log())
    first = lazy[3]
    assert lazy[3] is first
    assert next(x for i, x in enumerate(lazy) if i == 3) is first
    assert lazy[2:6][1] is first


def test_indexing_edges() -> None:
    log = streamed_log()
    lazy = packed(log)
    for index in range(-len(log), len(log)):
        assert lazy[index] == log[index]
    for bad in (len(log), -len(log) - 1):
        with pytest.raises(IndexError):
            lazy[bad]
    with pytest.raises(TypeError):
        lazy["1"]  # type: ignore[call-overload]


@given(st.integers(-20, 20) | st.none(), st.integers(-20, 20) | st.none(), st.sampled_from([None, 1, 2, 3, -1, -2]))
def test_slices_match_the_list(start: int | None, stop: int | None, step: int | None) -> None:
    log = streamed_log()
    lazy = packed(log)
    part = lazy[start:stop:step]
    assert isinstance(part, StoredEvents)
    assert list(part) == log[start:stop:step]
    assert len(part) == len(log[start:stop:step])


def test_a_slice_keeps_whole_runs_packed() -> None:
    lazy = packed(streamed_log())
    whole = lazy[1:11]
    assert [run.count for run in runs_of(whole)] == [5, 3]
    assert all(run._events is None for run in runs_of(whole))
    assert runs_of(lazy[4:11]) == runs_of(lazy)[1:]  # the cut text run is expanded, the tool run is shared


def test_sequence_protocol_and_equality() -> None:
    log = streamed_log()
    lazy = packed(log)
    view: object = lazy
    assert isinstance(view, Sequence) and not isinstance(view, MutableSequence)
    assert lazy == log and log == lazy and lazy == tuple(log) and tuple(log) == lazy
    assert lazy == packed(log) and lazy == StoredEvents(log)
    assert lazy != log[:-1] and lazy != [*log[:-1], log[0]] and lazy != "abc"
    assert (lazy == 3) is False
    assert list(reversed(lazy)) == log[::-1]
    assert lazy.index(log[9]) == 9 and lazy.count(log[4]) == 1 and log[4] in lazy
    assert hash(lazy) == hash(tuple(log))
    assert repr(lazy) == f"StoredEvents({log!r})"
    assert pickle.loads(pickle.dumps(lazy)) == log
    assert len(StoredEvents()) == 0 and list(StoredEvents()) == [] and StoredEvents() == ()


def test_concat_and_add_keep_runs_packed() -> None:
    log = streamed_log()
    lazy = packed(log)
    extra = [turn_end(15, 2)]
    for joined in (lazy + extra, StoredEvents.concat((lazy, extra))):
        assert isinstance(joined, StoredEvents)
        assert joined == [*log, *extra]
        assert runs_of(joined) == runs_of(lazy)
    assert tuple(log[:1]) + lazy[1:] == log  # a tuple on the left
    assert StoredEvents.concat([]) == []


def test_a_batch_without_rows_stays_a_list() -> None:
    log = [turn_start(0, 1), step_start(1, 1, 1)]
    decoded, contiguous = decode_stored_batch(encode_storage_lines(log, pack_chunks=True), 0)
    assert type(decoded) is list and decoded == log and contiguous


def test_contiguity_is_reported_for_a_batch_with_rows() -> None:
    data = encode_storage_lines(streamed_log(), pack_chunks=True)
    assert decode_stored_batch(data, 0)[1] is True
    assert decode_stored_batch(data, 1)[1] is False


def test_packed_run_refuses_what_spans_fields() -> None:
    max_safe = 2**53 - 1
    assert packed_run("text-chunks", 0, 0, 1, 1, 0, [1], ["a", "b"], None, UNSET) is not None
    assert packed_run("text-chunks", 0, 0, 1, 1, 0, [], ["a", "b"], None, UNSET) is None  # dt length
    assert packed_run("text-chunks", 0, 0, 1, 1, 0, [], [], None, UNSET) is None  # no member
    assert packed_run("text-chunks", max_safe, 0, 1, 1, 0, [1], ["a", "b"], None, UNSET) is None  # last seq unsafe
    assert packed_run("text-chunks", 0, max_safe, 1, 1, 0, [1], ["a", "b"], None, UNSET) is None  # a time above
    assert packed_run("text-chunks", 0, -max_safe, 1, 1, 0, [-1], ["a", "b"], None, UNSET) is None  # and below
    # Gaps whose magnitudes add up past the safe range while every member time stays inside it.
    swing = packed_run(
        "text-chunks", 0, 5, 1, 1, 0, [max_safe - 5, 5 - max_safe, -5], ["a", "b", "c", "d"], None, UNSET
    )
    assert swing is not None
    assert [e.time for e in swing.events()] == [5, max_safe, 5, 0]
    assert packed_run("text-chunks", 0, 5, 1, 1, 0, [max_safe - 4, 4 - max_safe], ["a", "b", "c"], None, UNSET) is None


# Random batches: every operation agrees with the expanded list.

_kinds = st.sampled_from(["text-delta", "reasoning-delta", "tool-call-delta"])


@st.composite
def _log(draw: st.DrawFn) -> list[SessionEvent]:
    events: list[SessionEvent] = []
    for _ in range(draw(st.integers(0, 12))):
        seq = len(events)
        if draw(st.integers(0, 3)) == 0:
            events.append(step_start(seq, 1, 1))
            continue
        kind = draw(_kinds)
        for k in range(draw(st.integers(1, 6))):
            events.append(chunk(len(events), draw(st.integers(-5, 5)), f"{kind[0]}{k}", kind=kind))
    return events


@given(_log(), st.data())
@settings(max_examples=200)
def test_random_batches_behave_as_their_expanded_list(log: list[SessionEvent], data: st.DataObject) -> None:
    decoded, contiguous = decode_stored_batch(encode_storage_lines(log, pack_chunks=True), 0) if log else ([], True)
    assert contiguous
    lazy = StoredEvents.concat([decoded])
    assert len(lazy) == len(log)
    if log:
        index = data.draw(st.integers(-len(log), len(log) - 1))
        assert lazy[index] == log[index]
    start, stop = data.draw(st.integers(-15, 15)), data.draw(st.integers(-15, 15))
    assert list(lazy[start:stop]) == log[start:stop]
    assert list(reversed(lazy)) == log[::-1]
    assert lazy == log and list(lazy) == log


def test_a_long_log_is_indexed_from_either_end() -> None:
    # Past the last 64 events a position is found through the segments' ends; near the end by walking back.
    log = [turn_start(0, 1), step_start(1, 1, 1)]
    for k in range(60):
        log += [chunk(len(log) + j, 7, f"{k}-{j}") for j in range(4)] + [user_message(len(log) + 4, "hi")]
    data = encode_storage_lines(log, pack_chunks=True)
    backwards, forwards = packed_batch(data), packed_batch(data)
    assert len(backwards) == len(log) > 200
    assert [backwards[i] for i in range(-1, -len(log) - 1, -1)] == log[::-1]
    assert [forwards[i] for i in range(len(log))] == log
    assert [backwards[i] for i in range(len(log))] == log


def packed_batch(data: bytes) -> StoredEvents:
    decoded = decode_stored_batch(data, 0)[0]
    assert isinstance(decoded, StoredEvents)
    return decoded
