"""The lossless JSON boundary's fast path agrees with the full walk: same copies, same refusals, same messages."""

from __future__ import annotations

import math
import sys
from typing import Any

import msgspec
import pytest
from dsh.session_persistence._model import jsonvalue
from dsh.session_persistence._model.jsonvalue import (
    MAX_SAFE_INTEGER,
    NotLosslessJsonError,
    snapshot_json,
    snapshot_record,
)
from hypothesis import given
from hypothesis import strategies as st


class _MyStr(str):
    pass


class _MyInt(int):
    pass


class _MyFloat(float):
    pass


class _MyDict(dict[str, Any]):
    pass


class _MyList(list[Any]):
    pass


_keys = st.text(max_size=6)  # surrogates included: a key holding one is refused, by both paths alike
_good_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not (f == 0.0 and math.copysign(1, f) < 0))
    | st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
)
_BAD_SCALARS = [
    math.nan,
    math.inf,
    -math.inf,
    -0.0,
    MAX_SAFE_INTEGER + 1,
    -MAX_SAFE_INTEGER - 1,
    2**70,
    "\ud800",
    "ok\udfffok",
    (1,),
    {1},
    frozenset(),
    b"b",
    msgspec.UNSET,
    object(),
    _MyStr("s"),
    _MyInt(1),
    _MyFloat(1.0),
    _MyDict(a=1),
    _MyList([1]),
]
_BAD_KEYS = [1, 1.5, None, True, (1,), _MyStr("k"), "k\udc00"]
_bad_scalars = st.sampled_from(_BAD_SCALARS)
_bad_keys = st.sampled_from(_BAD_KEYS)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(children, max_size=4)
        | st.dictionaries(_keys, children, max_size=4)
        | st.dictionaries(_bad_keys, children, min_size=1, max_size=2)
    )


# Mostly good values with, sometimes, a bad scalar or key somewhere in them.
_values = st.recursive(_good_scalars | _bad_scalars, _containers, max_leaves=30)
_good_values = st.recursive(
    _good_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(st.characters(exclude_categories=["Cs"]), max_size=6), children, max_size=4)
    ),
    max_leaves=30,
)


def _typed(value: object) -> object:
    """``value`` with every node's exact type next to it, so that ``1 == 1.0 == True`` tells apart."""
    if type(value) is dict:
        return ("dict", [(type(k).__name__, k, _typed(v)) for k, v in value.items()])
    if type(value) is list:
        return ("list", [_typed(v) for v in value])
    return (type(value).__name__, value if value == value else "nan")


def _outcome(run: Any, value: object) -> tuple[str, object]:
    try:
        return ("copy", _typed(run(value)))
    except NotLosslessJsonError as exc:
        return ("refused", str(exc))


def _full_walk(value: object) -> object:
    # The walk the fast path stands in front of, on its own (only containers reach it).
    if type(value) in (dict, list):
        return jsonvalue._snapshot_tree(value, "value")  # type: ignore[arg-type]
    return snapshot_json(value)


@given(_values)
def test_property_snapshot_json_agrees_with_the_full_walk(value: object) -> None:
    assert _outcome(snapshot_json, value) == _outcome(_full_walk, value)
    assert _outcome(snapshot_json, [value]) == _outcome(_full_walk, [value])
    assert _outcome(snapshot_json, {"k": value}) == _outcome(_full_walk, {"k": value})


def _stable_id(value: object) -> str:
    """A test id that is the same in every process (pytest-xdist compares them): no object address in it."""
    text = repr(value)
    return type(value).__name__ if " at 0x" in text else text


@pytest.mark.parametrize("bad", _BAD_SCALARS, ids=_stable_id)
def test_each_refused_value_is_refused_by_both_paths_wherever_it_sits(bad: object) -> None:
    for value in ({"k": bad}, [bad], {"a": 1, "k": [0, bad]}, [{"k": "v"}, {"k": bad}], {"k": {"k": {"k": bad}}}):
        outcome = _outcome(snapshot_json, value)
        assert outcome[0] == "refused"
        assert outcome == _outcome(_full_walk, value)
        assert snapshot_record({"data": value}) is None


@pytest.mark.parametrize("bad", _BAD_KEYS, ids=_stable_id)
def test_each_refused_key_is_refused_by_both_paths_wherever_it_sits(bad: object) -> None:
    for value in ({bad: 1}, [{bad: 1}], {"k": {"a": 1, bad: "v"}}, [0, [{bad: None}]]):
        outcome = _outcome(snapshot_json, value)
        assert outcome[0] == "refused"
        assert outcome == _outcome(_full_walk, value)
        assert snapshot_record({"data": value}) is None


@given(_values)
def test_property_snapshot_record_is_snapshot_json_or_declines(value: object) -> None:
    record = {"data": value}
    copy = snapshot_record(record)
    expected = _outcome(snapshot_json, record)
    if copy is not None:
        assert ("copy", _typed(copy)) == expected
    assert snapshot_record(value) is None or type(value) is dict


@given(_good_values)
def test_property_the_fast_path_takes_every_plain_value(value: object) -> None:
    # The fast path is not a formality: a plain value of ordinary depth never falls back to the walk.
    copy = snapshot_record({"data": value})
    assert copy is not None
    assert _typed(copy) == _typed({"data": value})


def _nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize("depth", [jsonvalue._FAST_DEPTH - 1, jsonvalue._FAST_DEPTH, jsonvalue._FAST_DEPTH + 1, 300])
def test_nesting_around_the_fast_depth_is_copied_by_one_path_or_the_other(depth: int) -> None:
    value = _nested(depth)
    assert _typed(snapshot_json(value)) == _typed(value)
    record = {"data": value}
    copy = snapshot_record(record)
    assert (copy is not None) == (depth < jsonvalue._FAST_DEPTH)
    assert _typed(snapshot_json(record)) == _typed(record)


def test_a_cycle_is_reported_by_the_walk() -> None:
    d: dict[str, Any] = {"a": [1]}
    d["a"].append(d)
    assert snapshot_record(d) is None
    with pytest.raises(NotLosslessJsonError, match=r"cycle .* at \$\.a\[1\]$"):
        snapshot_json(d, "value")


def _stack_depth() -> int:
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth += 1
        frame = frame.f_back  # type: ignore[assignment]
    return depth


def test_a_caller_deep_in_the_stack_still_gets_its_copy() -> None:
    # The fast path recurses once per level; with no room left for that, the iterative walk copies instead.
    value = _nested(40)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(_stack_depth() + 12)
    try:
        copy = snapshot_json(value)
        record = snapshot_record({"data": value})
    finally:
        sys.setrecursionlimit(limit)
    assert _typed(copy) == _typed(value)
    assert record is None
