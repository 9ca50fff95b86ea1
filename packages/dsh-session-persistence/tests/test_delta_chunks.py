"""A live append of a delta chunk built straight from its payload is exactly the general append: same event, same
refusals, same messages, and the clock read once either way."""

from __future__ import annotations

from typing import Any

import pytest
from dsh.session_persistence import Session
from dsh.session_persistence._model.jsonvalue import MAX_SAFE_INTEGER, NotLosslessJsonError, snapshot_json
from dsh.session_persistence._wire.codec import build_event
from dsh.session_persistence._wire.delta_chunks import delta_chunk_data
from hypothesis import given
from hypothesis import strategies as st


class _Str(str):
    pass


class _Int(int):
    pass


class _Dict(dict[str, Any]):
    pass


def _general(data: object, seq: int = 3, time: int = 1000) -> object:
    """What the general path makes of ``data``: the event's payload, or the exception it raises."""
    try:
        payload = snapshot_json(data, 'session event "assistant/chunk" data')
        return build_event("assistant/chunk", seq, time, payload, None, False).data
    except Exception as exc:  # compared by type and text
        return (type(exc), str(exc))


_counts = st.integers(min_value=-3, max_value=5) | st.sampled_from([MAX_SAFE_INTEGER, MAX_SAFE_INTEGER + 1])
_texts = st.text(max_size=6)  # surrogates included: refused by both paths
_leaf = (
    _counts
    | _texts
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False, max_value=10, min_value=-10)
    | st.sampled_from([_Str("x"), _Int(1), True, 1.0])
)
_kinds = st.sampled_from(
    ["text-delta", "reasoning-delta", "tool-call-delta", "block-start", "usage", _Str("text-delta")]
)


@st.composite
def _chunks(draw: st.DrawFn) -> dict[Any, Any]:
    kind = draw(_kinds)
    chunk: dict[Any, Any] = {"type": kind, "index": draw(_counts | _leaf)}
    if kind in ("tool-call-delta",):
        chunk["id"] = draw(_texts | _leaf)
        chunk["argumentsDelta"] = draw(_texts | _leaf)
        if draw(st.booleans()):
            chunk["name"] = draw(_texts | _leaf)
    else:
        chunk["text"] = draw(_texts | _leaf)
    if draw(st.integers(0, 6)) == 0:
        chunk[draw(st.sampled_from(["extra", _Str("index"), "name"]))] = draw(_leaf)
    if draw(st.integers(0, 6)) == 0:
        del chunk[draw(st.sampled_from(sorted(chunk, key=str)))]
    return _Dict(chunk) if draw(st.integers(0, 12)) == 0 else chunk


@st.composite
def _payloads(draw: st.DrawFn) -> object:
    data: dict[Any, Any] = {"turn": draw(_counts | _leaf), "step": draw(_counts | _leaf), "chunk": draw(_chunks())}
    if draw(st.integers(0, 6)) == 0:
        data[draw(st.sampled_from(["extra", _Str("turn")]))] = draw(_leaf)
    if draw(st.integers(0, 8)) == 0:
        del data[draw(st.sampled_from(["turn", "step", "chunk"]))]
    return _Dict(data) if draw(st.integers(0, 12)) == 0 else data


@given(_payloads())
def test_property_the_delta_path_is_the_general_path_or_declines(data: object) -> None:
    fast = delta_chunk_data(data)
    general = _general(data)
    if fast is not None:
        assert fast == general
    # A declined payload is the general path's to build or refuse; nothing more to compare.


@given(_payloads())
def test_property_session_append_agrees_with_the_general_path(data: object) -> None:
    session = Session("s", clock=lambda: 1000)
    for _ in range(3):
        session.append("custom/pad", {})
    general = _general(data)
    if isinstance(general, tuple):
        with pytest.raises(general[0]) as raised:
            session.append("assistant/chunk", data)
        assert (type(raised.value), str(raised.value)) == general
        assert len(session.events) == 3
    else:
        event = session.append("assistant/chunk", data)
        assert event.data == general
        assert (event.seq, event.time) == (3, 1000)


@pytest.mark.parametrize(
    "data",
    [
        {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "hi"}},
        {"turn": 1, "step": 2, "chunk": {"type": "reasoning-delta", "index": 3, "text": "é"}},
        {"turn": 1, "step": 1, "chunk": {"type": "tool-call-delta", "index": 0, "id": "c1", "argumentsDelta": "{"}},
        {
            "turn": 1,
            "step": 1,
            "chunk": {"type": "tool-call-delta", "index": 0, "id": "c1", "name": "f", "argumentsDelta": ""},
        },
    ],
    ids=["text", "reasoning", "tool", "tool-named"],
)
def test_every_delta_kind_takes_the_delta_path(data: dict[str, Any]) -> None:
    built = delta_chunk_data(data)
    assert built is not None
    assert built == _general(data)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({_Str("turn"): 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x"}}, NotLosslessJsonError),
        ({"turn": 1, "step": 1, "chunk": {_Str("text"): "x", "type": "text-delta", "index": 0}}, NotLosslessJsonError),
        ({"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "a\ud800"}}, NotLosslessJsonError),
        ({"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": _Str("x")}}, NotLosslessJsonError),
        ({"turn": _Int(1), "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x"}}, NotLosslessJsonError),
        ({"turn": True, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x"}}, Exception),
        ({"turn": -1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x"}}, Exception),
        ({"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": -1, "text": "x"}}, Exception),
        ({"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x", "id": "c"}}, Exception),
        ({"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0}}, Exception),
        ({"turn": 1, "step": 1, "x": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x"}}, Exception),
        ({"turn": 1, "step": 1, "chunk": {"type": "tool-call-delta", "index": 0, "id": "c", "name": 3}}, Exception),
        (
            {"turn": 1, "step": 1, "chunk": {"type": "tool-call-delta", "index": 0, "id": "c", "argumentsDelta": 1}},
            Exception,
        ),
        (
            {
                "turn": 1,
                "step": 1,
                "chunk": {"type": "tool-call-delta", "index": 0, "id": "c", "argumentsDelta": "", "name": "f", "x": 1},
            },
            Exception,
        ),
    ],
    ids=[
        "subclass-key",
        "subclass-chunk-key",
        "surrogate",
        "subclass-text",
        "subclass-int",
        "bool-turn",
        "negative-turn",
        "negative-index",
        "extra-chunk-key",
        "missing-text",
        "extra-key",
        "tool-name-not-str",
        "tool-delta-not-str",
        "tool-extra-key",
    ],
)
def test_a_refused_delta_is_refused_with_the_general_message(data: dict[str, Any], error: type[Exception]) -> None:
    assert delta_chunk_data(data) is None
    general = _general(data)
    assert isinstance(general, tuple)
    session = Session("s", clock=lambda: 1000)
    for _ in range(3):
        session.append("custom/pad", {})
    with pytest.raises(error) as raised:
        session.append("assistant/chunk", data)
    assert (type(raised.value), str(raised.value)) == general
    assert len(session.events) == 3


def test_the_event_shares_nothing_with_the_payload() -> None:
    data: dict[str, Any] = {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "a"}}
    session = Session("s", clock=lambda: 5)
    event = session.append("assistant/chunk", data)
    data["chunk"]["text"] = "changed"
    data["turn"] = 9
    assert event.data.chunk.text == "a"  # type: ignore[union-attr]
    assert event.data.turn == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("now", [1.5, MAX_SAFE_INTEGER + 1, "soon"], ids=["float", "unsafe", "str"])
def test_a_bad_clock_is_read_once_and_named_as_before(now: object) -> None:
    reads: list[object] = []

    def clock() -> Any:
        reads.append(now)
        return now

    data = {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x"}}
    session = Session("s", clock=clock)
    reads.clear()  # the header's creation time
    with pytest.raises(Exception) as fast:
        session.append("assistant/chunk", data)
    assert reads == [now]
    assert session.events == ()
    with pytest.raises(Exception) as general:
        build_event("assistant/chunk", 0, now, snapshot_json(data), None, False)  # type: ignore[arg-type]
    assert (type(fast.value), str(fast.value)) == (type(general.value), str(general.value))
