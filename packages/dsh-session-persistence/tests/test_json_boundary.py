"""The lossless JSON boundary (spec session-core §4, scenarios 29-31)."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import math
from typing import Any

import msgspec
import pytest
from dsh.session_persistence._model.jsonvalue import (
    MAX_JSON_DEPTH,
    MAX_SAFE_INTEGER,
    JsonValue,
    NotLosslessJsonError,
    is_json_value,
    is_safe_int,
    snapshot_json,
)
from hypothesis import given
from hypothesis import strategies as st


def _nested_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _depth(value: object) -> int:
    """Container depth, computed iteratively (a scalar is 0, [] is 1)."""
    best = 0
    todo: list[tuple[object, int]] = [(value, 0)]
    while todo:
        v, d = todo.pop()
        if type(v) is dict:
            todo.extend((c, d + 1) for c in v.values())
            best = max(best, d + 1)
        elif type(v) is list:
            todo.extend((c, d + 1) for c in v)
            best = max(best, d + 1)
    return best


def _shares_containers(a: object, b: object) -> bool:
    """True when any container of `a` is the very same object as one in `b`."""

    def ids(v: object) -> set[int]:
        out: set[int] = set()
        todo = [v]
        while todo:
            x = todo.pop()
            if type(x) is dict:
                out.add(id(x))
                todo.extend(x.values())
            elif type(x) is list:
                out.add(id(x))
                todo.extend(x)
        return out

    return bool(ids(a) & ids(b))


# --- scenario 29 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, True, False, "text", 1.25, 0, -7, 0.0, [1, {"nested": None}], {}, []])
def test_accepts_plain_json(value: object) -> None:
    copy = snapshot_json(value)
    assert copy == value
    assert type(copy) is type(value)
    assert is_json_value(value)


class _Color(enum.Enum):
    RED = 1


class _StrEnum(str, enum.Enum):
    A = "a"


@dataclasses.dataclass
class _Point:
    x: int


class _Struct(msgspec.Struct):
    x: int


class _MyDict(dict[str, Any]):
    pass


class _MyList(list[Any]):
    pass


class _MyStr(str):
    pass


class _MyInt(int):
    pass


_REJECTED: list[tuple[str, object, str]] = [
    ("negative zero", -0.0, "negative zero"),
    ("nan", float("nan"), "NaN"),
    ("inf", float("inf"), "Infinity"),
    ("-inf", float("-inf"), "-Infinity"),
    ("callable", len, "unsupported type"),
    ("lambda", lambda: None, "unsupported type"),
    ("set", {1, 2}, "unsupported type set"),
    ("frozenset", frozenset(), "unsupported type frozenset"),
    ("tuple", (1, 2), "unsupported type tuple"),
    ("bytes", b"x", "unsupported type bytes"),
    ("bytearray", bytearray(b"x"), "unsupported type bytearray"),
    ("non-str key", {1: "a"}, "non-string dict key of type int"),
    ("tuple key", {(1,): "a"}, "non-string dict key of type tuple"),
    ("unsafe int", 2**64, "integer outside the safe range"),
    ("unsafe int edge", MAX_SAFE_INTEGER + 1, "integer outside the safe range"),
    ("unsafe negative int edge", -MAX_SAFE_INTEGER - 1, "integer outside the safe range"),
    ("lone surrogate", "a\ud800b", "surrogate"),
    ("surrogate key", {"k\udfff": 1}, "surrogate"),
    ("decimal", decimal.Decimal("1.5"), "unsupported type decimal.Decimal"),
    ("datetime", datetime.datetime(2024, 1, 1), "unsupported type datetime.datetime"),
    ("enum", _Color.RED, "unsupported type"),
    ("str enum", _StrEnum.A, "unsupported type"),
    ("dataclass", _Point(1), "unsupported type"),
    ("struct", _Struct(1), "unsupported type"),
    ("dict subclass", _MyDict(a=1), "unsupported type"),
    ("OrderedDict", collections.OrderedDict(a=1), "unsupported type collections.OrderedDict"),
    ("list subclass", _MyList([1]), "unsupported type"),
    ("str subclass", _MyStr("a"), "unsupported type"),
    ("int subclass", _MyInt(1), "unsupported type"),
    ("UNSET", msgspec.UNSET, "unsupported type msgspec.UnsetType"),
    ("object", object(), "unsupported type object"),
]


@pytest.mark.parametrize(("value", "reason"), [(v, r) for _, v, r in _REJECTED], ids=[n for n, _, _ in _REJECTED])
def test_rejects_lossy_values_at_top_level_and_nested(value: object, reason: str) -> None:
    for wrapped, path in ((value, "$"), ({"a": [0, value]}, "$.a[1]"), ([{"b c": value}], '$[0]["b c"]')):
        with pytest.raises(NotLosslessJsonError, match=r"^thing is not losslessly JSON-serializable: ") as info:
            snapshot_json(wrapped, "thing")
        assert reason in info.value.reason
        assert info.value.path == path  # for a bad key: the path of the dict holding it
        assert isinstance(info.value, TypeError)
        assert not is_json_value(wrapped)


def test_scenario_29_unsafe_int_inside_list_is_rejected() -> None:
    with pytest.raises(NotLosslessJsonError, match=r"integer outside the safe range .* at \$\.x\[1\]$"):
        snapshot_json({"x": [1, 2**64, 3]})


def test_error_message_names_what_reason_and_path() -> None:
    with pytest.raises(NotLosslessJsonError) as info:
        snapshot_json({"a": [1, 2, float("nan")]}, 'session event "user/message" (seq 0)')
    assert str(info.value) == (
        'session event "user/message" (seq 0) is not losslessly JSON-serializable: NaN at $.a[2]'
    )
    assert info.value.what == 'session event "user/message" (seq 0)'


def test_bad_key_path_names_the_dict() -> None:
    with pytest.raises(NotLosslessJsonError, match=r"non-string dict key of type int at \$\.outer\[0\]$"):
        snapshot_json({"outer": [{2: "x"}]})


def test_default_what_is_value() -> None:
    with pytest.raises(NotLosslessJsonError, match=r"^value is not losslessly JSON-serializable: unsupported"):
        snapshot_json((1,))


def test_bool_is_not_an_int_for_safe_int_checks() -> None:
    assert is_safe_int(0)
    assert is_safe_int(MAX_SAFE_INTEGER)
    assert is_safe_int(-MAX_SAFE_INTEGER)
    assert not is_safe_int(MAX_SAFE_INTEGER + 1)
    assert not is_safe_int(-MAX_SAFE_INTEGER - 1)
    assert not is_safe_int(True)
    assert not is_safe_int(1.0)
    assert not is_safe_int("1")
    assert MAX_SAFE_INTEGER == 2**53 - 1
    # bools themselves are valid JSON and stay bools in the copy
    assert snapshot_json([True, 1]) == [True, 1]
    assert [type(x) for x in snapshot_json([True, 1])] == [bool, int]  # type: ignore[union-attr]


def test_boundary_scalars() -> None:
    assert snapshot_json([MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, 0.0, 5e-324, 1.7976931348623157e308]) == [
        MAX_SAFE_INTEGER,
        -MAX_SAFE_INTEGER,
        0.0,
        5e-324,
        1.7976931348623157e308,
    ]
    # non-ASCII text and a proper astral character (not surrogates) are fine
    assert snapshot_json({"ünï": "漢字 🎉"}) == {"ünï": "漢字 🎉"}
    assert snapshot_json({"__proto__": {"x": 1}}) == {"__proto__": {"x": 1}}


def test_key_order_is_kept_and_copy_is_fresh() -> None:
    src = {"z": 1, "a": [1, 2], "m": {"y": 1, "b": 2}}
    copy = snapshot_json(src)
    assert list(copy) == ["z", "a", "m"]  # type: ignore[arg-type]
    assert list(copy["m"]) == ["y", "b"]  # type: ignore[arg-type,call-overload,index]
    assert copy is not src
    assert not _shares_containers(copy, src)
    src["a"].append(3)  # type: ignore[attr-defined]
    src["m"]["c"] = 3  # type: ignore[index]
    assert copy == {"z": 1, "a": [1, 2], "m": {"y": 1, "b": 2}}


# --- scenario 30 -----------------------------------------------------------------------------------


def test_dag_is_accepted_and_copied_into_independent_objects() -> None:
    shared: dict[str, Any] = {"k": [1, 2]}
    value = {"list": [shared, shared], "alias": shared}
    copy: Any = snapshot_json(value)
    assert copy == {"list": [{"k": [1, 2]}, {"k": [1, 2]}], "alias": {"k": [1, 2]}}
    first, second, alias = copy["list"][0], copy["list"][1], copy["alias"]
    assert first is not second
    assert first is not alias
    assert second is not alias
    assert first["k"] is not second["k"]
    assert first["k"] is not alias["k"]
    assert not _shares_containers(copy, value)
    shared["k"].append(3)
    shared["new"] = True
    assert copy == {"list": [{"k": [1, 2]}, {"k": [1, 2]}], "alias": {"k": [1, 2]}}
    first["k"].append(9)
    assert second["k"] == [1, 2]
    assert alias["k"] == [1, 2]


def test_same_list_twice_in_a_list_is_not_a_cycle() -> None:
    inner = [1]
    assert snapshot_json([inner, [inner, inner]]) == [[1], [[1], [1]]]


# --- scenario 31 -----------------------------------------------------------------------------------


def test_self_cycle_is_rejected_cleanly() -> None:
    d: dict[str, Any] = {}
    d["self"] = d
    with pytest.raises(NotLosslessJsonError, match=r"cycle .* at \$\.self$"):
        snapshot_json(d)
    assert not is_json_value(d)


def test_indirect_cycle_through_list_is_rejected() -> None:
    a: list[Any] = []
    b: dict[str, Any] = {"a": a}
    a.append({"x": [b]})
    with pytest.raises(NotLosslessJsonError, match=r"cycle .* at \$\[0\]\.x\[0\]\.a$"):
        snapshot_json(a)


def test_cycle_below_the_root_is_rejected_as_a_cycle() -> None:
    inner: dict[str, Any] = {"k": 1}
    inner["again"] = [inner]
    with pytest.raises(NotLosslessJsonError, match=r"cycle .* at \$\.outer\[1\]\.again\[0\]$"):
        snapshot_json({"outer": [0, inner]})


def test_900_deep_list_is_accepted_and_round_trips_through_msgspec() -> None:
    assert MAX_JSON_DEPTH >= 900
    value = _nested_list(900)
    copy = snapshot_json(value)
    assert _depth(copy) == 900
    assert copy == value
    assert msgspec.json.decode(msgspec.json.encode(copy)) == value


def test_depth_limit_is_exact_and_documented_limit_round_trips() -> None:
    at_limit = _nested_list(MAX_JSON_DEPTH)
    assert _depth(snapshot_json(at_limit)) == MAX_JSON_DEPTH
    # the chosen limit is one msgspec can encode and decode (here, inside a pytest test)
    assert msgspec.json.decode(msgspec.json.encode(at_limit)) == at_limit
    deeper = {"wrap": _nested_list(MAX_JSON_DEPTH)}
    with pytest.raises(NotLosslessJsonError, match=rf"nesting deeper than {MAX_JSON_DEPTH} levels"):
        snapshot_json(deeper)


@pytest.mark.parametrize("depth", [1_000, 5_000, 100_000])
def test_far_too_deep_is_rejected_without_recursion_error(depth: int) -> None:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    with pytest.raises(NotLosslessJsonError, match="nesting deeper than"):
        snapshot_json(value)


# --- properties ------------------------------------------------------------------------------------

_keys = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not (f == 0.0 and math.copysign(1, f) < 0))
    | st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
)
_json_values = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(_keys, children, max_size=5),
    max_leaves=40,
)


@given(_json_values)
def test_property_accepted_values_round_trip_through_msgspec(value: JsonValue) -> None:
    copy = snapshot_json(value)
    assert copy == value
    assert not _shares_containers(copy, value)
    decoded = msgspec.json.decode(msgspec.json.encode(copy))
    assert decoded == copy
    # exact types survive (no int/float/bool confusion)
    assert msgspec.json.encode(decoded) == msgspec.json.encode(copy)


_poison = st.sampled_from(
    [
        float("nan"),
        float("inf"),
        float("-inf"),
        -0.0,
        2**53,
        -(2**53),
        2**64,
        (1,),
        {1},
        b"b",
        msgspec.UNSET,
        "\ud800",
        object(),
        _MyDict(),
        _MyList(),
        True.__class__.__mro__,  # a tuple of types
    ]
)


@st.composite
def _poisoned(draw: st.DrawFn) -> object:
    """A valid JSON value with one invalid thing planted somewhere (value, bad key, or as the root)."""
    value = draw(_json_values)
    poison = draw(_poison)
    bad_key = draw(st.sampled_from([None, 1, 1.5, (1,), "k\udc00"]))
    containers: list[Any] = []
    todo: list[Any] = [value]
    while todo:
        v = todo.pop()
        if type(v) is dict:
            containers.append(v)
            todo.extend(v.values())
        elif type(v) is list:
            containers.append(v)
            todo.extend(v)
    if not containers:
        return poison if draw(st.booleans()) else {bad_key: value}
    target = draw(st.sampled_from(containers))
    if type(target) is list:
        target.insert(draw(st.integers(0, len(target))), poison)
    elif draw(st.booleans()):
        target[draw(_keys)] = poison
    else:
        target[bad_key] = 0
    return value


@given(_poisoned())
def test_property_generated_invalid_values_are_rejected(value: object) -> None:
    with pytest.raises(NotLosslessJsonError, match=r"is not losslessly JSON-serializable: .* at \$"):
        snapshot_json(value)
    assert not is_json_value(value)


@given(_json_values)
def test_property_cycles_are_rejected_wherever_planted(value: JsonValue) -> None:
    root: list[Any] = [value]
    containers: list[Any] = []
    todo: list[Any] = [root]
    while todo:
        v = todo.pop()
        if type(v) is dict:
            containers.append(v)
            todo.extend(v.values())
        elif type(v) is list:
            containers.append(v)
            todo.extend(v)
    for target in containers:
        for loop_to in (root, target):  # back to the root, and a container onto itself
            if type(target) is list:
                target.append(loop_to)
            else:
                target["__cycle__"] = loop_to
            with pytest.raises(NotLosslessJsonError, match="cycle"):
                snapshot_json(root)
            if type(target) is list:
                target.pop()
            else:
                del target["__cycle__"]
    assert snapshot_json(root) == root
