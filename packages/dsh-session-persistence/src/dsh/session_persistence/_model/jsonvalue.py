"""The lossless JSON boundary (spec session-core §4).

Everything the session persists passes through :func:`snapshot_json` before it is encoded. It validates
and copies in one pass, so a value cannot change between the check and the copy, and the copy shares no
mutable container with the caller's value. The common case takes a recursive fast path; anything it does not
plainly accept goes to an iterative walk that decides and names the defect (:func:`snapshot_record` is the fast
path alone, for a caller that names the value only when it has to).

Why this exists: msgspec silently encodes NaN and infinities as ``null``, turns non-string dict keys into
strings, cannot encode lone surrogates, and raises ``RecursionError`` on very deep nesting. Each of those
would either lose data or leave an unreadable log, so they are refused here, up front, with a message
that names what was being written and where in the value the defect sits.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import TypeAlias

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_SAFE_INTEGER",
    "JsonValue",
    "NotLosslessJsonError",
    "is_json_value",
    "is_plain_str",
    "is_safe_int",
    "snapshot_json",
    "snapshot_record",
]

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None
"""A value that survives a JSON round trip unchanged (after :func:`snapshot_json` accepted it)."""

MAX_SAFE_INTEGER = 2**53 - 1
"""``Number.MAX_SAFE_INTEGER``: the largest integer JS holds exactly, so logs stay readable by JS tools."""

# Why 900: the spec requires a 900-deep list to be accepted, and it is also close to the most msgspec can
# carry. msgspec's encoder and decoder recurse once per container level through Py_EnterRecursiveCall,
# which on CPython 3.10/3.11 shares the interpreter's recursion budget (default limit 1000) with the Python
# frames already on the stack. Measured with msgspec 0.23 on 3.11: a nested list round-trips up to 998
# levels from module level and about 950 levels from inside an async pytest test (~40 frames deep); at
# 999 levels both encode and decode raise RecursionError. The value is further wrapped by the event
# envelope (event -> data -> ...) when written. 900 therefore leaves roughly 90 levels for the caller's
# stack plus the envelope. It is NOT a guarantee for callers running deeper than that: the encode/decode
# call sites must still catch RecursionError and report it as the ordinary "not losslessly
# JSON-serializable" error (spec §4). The reference accepts 5,000 levels; this lower limit is a deliberate
# port deviation.
MAX_JSON_DEPTH = 900
"""Deepest container nesting accepted (a bare scalar has depth 0, ``[1]`` depth 1, ``[[1]]`` depth 2)."""

_MIN_SAFE = -MAX_SAFE_INTEGER
_copysign = math.copysign


class NotLosslessJsonError(TypeError):
    """A value cannot be written as JSON and read back unchanged.

    The message reads ``<what> is not losslessly JSON-serializable: <reason> at <path>``, where ``path``
    is a JSONPath-like location such as ``$.content[2]`` (``$`` is the value itself).
    """

    def __init__(self, what: str, reason: str, path: str) -> None:
        super().__init__(f"{what} is not losslessly JSON-serializable: {reason} at {path}")
        self.what = what
        self.reason = reason
        self.path = path


def is_safe_int(x: object) -> bool:
    """True for a real ``int`` (never ``bool``) with ``|x| <= 2**53 - 1``."""
    return type(x) is int and _MIN_SAFE <= x <= MAX_SAFE_INTEGER


def is_json_value(value: object) -> bool:
    """Boolean form of :func:`snapshot_json`: whether ``value`` would be accepted."""
    try:
        snapshot_json(value)
    except NotLosslessJsonError:
        return False
    return True


def snapshot_json(value: object, what: str = "value") -> JsonValue:
    """Validate ``value`` as lossless JSON and return an independent deep copy of it.

    Accepted: ``None``, ``bool``, ``str`` without surrogate code points, ``int`` within ±(2**53-1),
    finite ``float`` other than ``-0.0``, exact ``list``, and exact ``dict`` with ``str`` keys (order kept),
    nested at most :data:`MAX_JSON_DEPTH` deep. A container referenced twice without a cycle (a DAG) is
    copied twice. Everything else -- tuples, sets, bytes, subclasses of dict/list/str/int/float, enums,
    ``msgspec.UNSET``, any other object, cycles -- raises :class:`NotLosslessJsonError`; ``what`` names
    the value in the message (e.g. ``session event "user/message" (seq 0)``).

    Scalars are immutable and returned as-is; only containers are copied.
    """
    t = type(value)
    if t is dict or t is list:
        try:
            return _fast_dict(value, 1) if t is dict else _fast_list(value, 1)  # type: ignore[arg-type]
        except (_Declined, RecursionError):
            # Anything unusual (a defect, a cycle, deep nesting, a caller already deep in the stack): the walk below
            # decides, from the start, and names the defect.
            return _snapshot_tree(value, what)  # type: ignore[arg-type]
    reason = _scalar_defect(value)
    if reason is not None:
        raise NotLosslessJsonError(what, reason, "$")
    return value  # type: ignore[return-value]


def snapshot_record(value: object) -> dict[str, JsonValue] | None:
    """:func:`snapshot_json` of an exact ``dict`` in the common case, without naming anything: its independent copy,
    or ``None`` when it is not that case (not a dict, or anything :func:`snapshot_json` would refuse or has to look
    at closer). On ``None`` the caller runs :func:`snapshot_json`, which decides and names the defect.

    For the per-event hot path (an appended event's ``data``), where building the ``what`` label costs as much as a
    small copy: every value this returns is exactly what :func:`snapshot_json` returns for it.
    """
    if type(value) is not dict:
        return None
    try:
        return _fast_dict(value, 1)
    except (_Declined, RecursionError):
        return None


# The fast path: a recursive copy that checks every value as it copies it and declines (``_Declined``) at the first
# thing that is not plainly fine -- a refused value or key, a string holding surrogates, nesting deeper than
# _FAST_DEPTH (so a cycle ends here too) -- leaving the whole value to the iterative walk below, which decides and
# names the defect. What it accepts and how it copies (a DAG twice, key order kept) are exactly the walk's.
_FAST_DEPTH = 48


class _Declined(Exception):
    """The fast path leaves the value to :func:`_snapshot_tree` (never escapes this module)."""


def _fast_dict(src: dict[Any, Any], depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in src.items():
        if type(key) is not str or not (key.isascii() or _str_ok(key)):
            raise _Declined
        t = type(v)
        if t is str:
            if not (v.isascii() or _str_ok(v)):
                raise _Declined
        elif t is int:
            if not _MIN_SAFE <= v <= MAX_SAFE_INTEGER:
                raise _Declined
        elif t is dict:
            if depth >= _FAST_DEPTH:
                raise _Declined
            v = _fast_dict(v, depth + 1)
        elif t is list:
            if depth >= _FAST_DEPTH:
                raise _Declined
            v = _fast_list(v, depth + 1)
        elif t is float:
            if v - v != 0.0 or (v == 0.0 and _copysign(1.0, v) < 0.0):
                raise _Declined
        elif v is not None and t is not bool:
            raise _Declined
        out[key] = v
    return out


def _fast_list(src: list[Any], depth: int) -> list[Any]:
    out: list[Any] = []
    append = out.append
    for v in src:
        t = type(v)
        if t is str:
            if not (v.isascii() or _str_ok(v)):
                raise _Declined
        elif t is int:
            if not _MIN_SAFE <= v <= MAX_SAFE_INTEGER:
                raise _Declined
        elif t is dict:
            if depth >= _FAST_DEPTH:
                raise _Declined
            v = _fast_dict(v, depth + 1)
        elif t is list:
            if depth >= _FAST_DEPTH:
                raise _Declined
            v = _fast_list(v, depth + 1)
        elif t is float:
            if v - v != 0.0 or (v == 0.0 and _copysign(1.0, v) < 0.0):
                raise _Declined
        elif v is not None and t is not bool:
            raise _Declined
        append(v)
    return out


# A frame of the explicit DFS stack: (items iterator, copy under construction, key or index in the
# parent, id of the source container). A dict frame's iterator yields (key, value) pairs into a dict copy;
# a list frame's yields values into a list copy (the current index is len(copy) at that moment). Each
# entry is read once from the iterator and what is checked is exactly what is stored in the copy.
# Typed loosely on purpose: the hot loop narrows by exact type() tests that mypy cannot follow.
_Frame = tuple["Iterator[Any]", Any, object, int]


def _snapshot_tree(root: dict[str, Any] | list[Any], what: str) -> JsonValue:
    # Hot path: per node one type() call and a short chain of identity tests, no function calls for
    # ASCII strings, ints, floats, bools and None. Paths and reasons are computed only after a defect.
    # (Measured alternatives that were slower on realistic payloads of many small dicts: shallow-copying
    # each container in C first and validating the copy; checking dict keys in bulk with set(map(type)).)
    str_ok = _str_ok
    min_safe = _MIN_SAFE
    max_safe = MAX_SAFE_INTEGER
    copysign = _copysign

    root_copy: Any
    if type(root) is dict:
        root_copy = {}
        stack: list[_Frame] = [(iter(root.items()), root_copy, None, id(root))]
    else:
        root_copy = []
        stack = [(iter(root), root_copy, None, id(root))]
    # ids of the containers on the current path (not of everything visited): a repeat on the path is a
    # cycle, a repeat elsewhere is a DAG and is simply copied again. The source keeps every container
    # alive during the walk, so an id cannot be reused while it is in this set.
    ancestors = {id(root)}

    key: Any
    v: Any
    while stack:
        it, dst, _, _ = stack[-1]
        if type(dst) is dict:
            for key, v in it:
                if type(key) is not str or not (key.isascii() or str_ok(key)):
                    raise _key_failure(what, stack, key)
                t = type(v)
                if t is str:
                    if not (v.isascii() or str_ok(v)):
                        raise _failure(what, stack, key, v)
                elif t is int:
                    if not (min_safe <= v <= max_safe):
                        raise _failure(what, stack, key, v)
                elif t is dict or t is list:
                    break
                elif t is float:
                    if v - v != 0.0 or (v == 0.0 and copysign(1.0, v) < 0.0):
                        raise _failure(what, stack, key, v)
                elif v is not None and t is not bool:
                    raise _failure(what, stack, key, v)
                dst[key] = v
            else:
                ancestors.discard(stack.pop()[3])
                continue
        else:
            for v in it:
                t = type(v)
                if t is str:
                    if not (v.isascii() or str_ok(v)):
                        raise _failure(what, stack, len(dst), v)
                elif t is int:
                    if not (min_safe <= v <= max_safe):
                        raise _failure(what, stack, len(dst), v)
                elif t is dict or t is list:
                    key = len(dst)
                    break
                elif t is float:
                    if v - v != 0.0 or (v == 0.0 and copysign(1.0, v) < 0.0):
                        raise _failure(what, stack, len(dst), v)
                elif v is not None and t is not bool:
                    raise _failure(what, stack, len(dst), v)
                dst.append(v)
            else:
                ancestors.discard(stack.pop()[3])
                continue

        # The loop broke on a container child `v` at `key`: store its (empty) copy first so the order is
        # kept, then descend; the parent's iterator resumes after the child is done.
        cid = id(v)
        if cid in ancestors:
            raise _failure(what, stack, key, v, reason="cycle (a container contains itself)")
        if len(stack) >= MAX_JSON_DEPTH:
            raise _failure(what, stack, key, v, reason=f"nesting deeper than {MAX_JSON_DEPTH} levels")
        new_copy: Any
        if type(v) is dict:
            new_copy = {}
            stack.append((iter(v.items()), new_copy, key, cid))
        else:
            new_copy = []
            stack.append((iter(v), new_copy, key, cid))
        if type(dst) is dict:
            dst[key] = new_copy
        else:
            dst.append(new_copy)
        ancestors.add(cid)

    return root_copy  # type: ignore[no-any-return]


def is_plain_str(value: object) -> TypeGuard[str]:
    """An exact ``str`` that :func:`snapshot_json` accepts as it is (no surrogate code points)."""
    return type(value) is str and (value.isascii() or _str_ok(value))


def _str_ok(s: str) -> bool:
    """Non-ASCII slow path: a ``str`` holding surrogate code points cannot be encoded as UTF-8 JSON."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _scalar_defect(v: object) -> str | None:
    """Why a non-container value is not lossless JSON, or None when it is fine."""
    t = type(v)
    if v is None or t is bool:
        return None
    if t is str:
        return None if _str_ok(v) else "string contains a surrogate code point"  # type: ignore[arg-type]
    if t is int:
        if _MIN_SAFE <= v <= MAX_SAFE_INTEGER:  # type: ignore[operator]
            return None
        return "integer outside the safe range ±(2**53-1)"
    if t is float:
        f: float = v  # type: ignore[assignment]
        if math.isnan(f):
            return "NaN"
        if math.isinf(f):
            return "Infinity" if f > 0 else "-Infinity"
        if f == 0.0 and _copysign(1.0, f) < 0.0:
            return "negative zero"
        return None
    if t is dict or t is list:
        return None
    return f"unsupported type {_type_name(t)}"


def _type_name(t: type) -> str:
    module = t.__module__
    return t.__qualname__ if module == "builtins" else f"{module}.{t.__qualname__}"


def _path(stack: list[_Frame], last: object) -> str:
    keys = [frame[2] for frame in stack[1:]]
    keys.append(last)
    parts = ["$"]
    for k in keys:
        if type(k) is int:
            parts.append(f"[{k}]")
        elif type(k) is str and k.isidentifier():
            parts.append(f".{k}")
        else:
            # ensure_ascii keeps the message printable even for keys with surrogates.
            parts.append(f"[{json.dumps(k) if type(k) is str else repr(k)}]")
    return "".join(parts)


def _failure(what: str, stack: list[_Frame], key: object, value: object, reason: str | None = None) -> Exception:
    """Build the error for a defective ``value`` found at ``key`` in the container on top of ``stack``."""
    if reason is None:
        reason = _scalar_defect(value) or "invalid value"
    return NotLosslessJsonError(what, reason, _path(stack, key))


def _key_failure(what: str, stack: list[_Frame], key: object) -> Exception:
    """Build the error for a bad dict key; the path names the dict, since the key itself is the defect."""
    if type(key) is str:
        reason = "dict key contains a surrogate code point"
    else:
        reason = f"non-string dict key of type {_type_name(type(key))}"
    path = _path(stack[:-1], stack[-1][2]) if len(stack) > 1 else "$"
    return NotLosslessJsonError(what, reason, path)
