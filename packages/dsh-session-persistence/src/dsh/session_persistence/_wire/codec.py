"""The event codec: events to their JSON wire form and back, with every envelope and surface rule.

Decoding is two-phase: the envelope is checked first, so that an unknown type can be kept verbatim as an
:class:`~dsh.session_persistence.events.OpaqueEvent` (whether it may be *interpreted* is decided by the reader,
see ``versions.first_refused_unknown``), and so that every rejection carries a specific message. The line decoder
takes a typed fast path and falls back to the generic decoder for the exact error text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import msgspec
from msgspec import UNSET

from .._model.errors import EventValidationError
from .._model.events import (
    EVENT_TYPES,
    IGNORABLE_EVENT_TYPES,
    SURFACE_EVENT_TYPES,
    AssistantMessage,
    KnownEvent,
    Message,
    ModelSource,
    OpaqueEvent,
    SessionEvent,
    ToolResult,
    ToolResultBlock,
    ToolSource,
    UserMessage,
)
from .._model.jsonvalue import MAX_SAFE_INTEGER, NotLosslessJsonError, is_safe_int

__all__ = [
    "append_envelope",
    "build_event",
    "check_ignorable",
    "check_message_shape",
    "check_source_event_seqs",
    "check_typed_surface",
    "decode_event",
    "decode_event_line",
    "encode_event",
    "event_to_builtins",
    "event_types",
]

_ENVELOPE_KEYS = frozenset({"type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs", "ignorable"})
_encoder = msgspec.json.Encoder()
_known_decoder = msgspec.json.Decoder(KnownEvent)
_json_decoder = msgspec.json.Decoder()


def _envelope(obj: object) -> tuple[str, int, int, dict[str, Any]]:
    if type(obj) is not dict:
        raise EventValidationError("invalid event envelope: not a JSON object")
    extra = obj.keys() - _ENVELOPE_KEYS
    if extra:
        raise EventValidationError(f"invalid event envelope: unexpected key {sorted(extra)[0]!r}")
    etype = obj.get("type")
    if type(etype) is not str or not etype:
        raise EventValidationError("invalid event envelope: type must be a non-empty string")
    seq = obj.get("seq")
    if not is_safe_int(seq) or seq < 0:  # type: ignore[operator]
        raise EventValidationError(f'invalid event envelope: "{etype}" seq must be a non-negative safe integer')
    time = obj.get("time")
    if not is_safe_int(time):
        raise EventValidationError(f'invalid event envelope: "{etype}" time must be a safe integer')
    if "data" not in obj:
        raise EventValidationError(f'invalid event envelope: "{etype}" has no data')
    if "ignorable" in obj and obj["ignorable"] is not True:
        raise EventValidationError(f'invalid event envelope: "{etype}" ignorable must be true when present')
    return etype, seq, time, obj  # type: ignore[return-value]


def check_ignorable(etype: str, seq: int, ignorable: object) -> None:
    """The types older readers do not know must be written ``ignorable``, or a 0.2 reader refuses the whole log."""
    if ignorable is not True and etype in IGNORABLE_EVENT_TYPES:
        raise EventValidationError(
            f'session event "{etype}" (seq {seq}) must be marked ignorable: readers before 0.3 do not know it'
        )


def _check_surface(etype: str, seq: int, obj: dict[str, Any]) -> None:
    check_ignorable(etype, seq, obj.get("ignorable"))
    surface = etype in SURFACE_EVENT_TYPES
    if not surface:
        for key in ("surfaceOp", "sourceEventSeqs"):
            if key in obj:
                raise EventValidationError(f'session event "{etype}" is not surface-eligible and cannot carry {key}')
        return
    if "surfaceOp" not in obj:
        raise EventValidationError(f'session event "{etype}" is surface-eligible and requires a surfaceOp marker')
    op = obj["surfaceOp"]
    if op != "append":
        if type(op) is dict and op.get("op") == "replace":
            raise EventValidationError(
                f'session event "{etype}" carries a replace surfaceOp, which this build does not support'
            )
        raise EventValidationError(f'session event "{etype}" carries an invalid surfaceOp')
    if "sourceEventSeqs" in obj:
        check_source_event_seqs(etype, seq, obj["sourceEventSeqs"])


_INT_ONLY = {int}


def check_source_event_seqs(etype: str, seq: int, seqs: object) -> None:
    """Raise :class:`EventValidationError` unless ``seqs`` is a valid ``sourceEventSeqs`` for event ``seq``.

    Valid: a list (or tuple) of distinct non-negative safe integers, each lower than ``seq``; empty only for an
    ``assistant/message``.
    """
    # Fast acceptance in C-level passes (an assistant/message names every chunk it was built from, so these lists
    # are long): exact ints, all in [0, seq), no repeats. ``seq`` is a checked safe integer, so the members are too.
    # Anything else takes the loop below, which decides and names the defect exactly as before.
    if type(seqs) in (list, tuple):
        items = cast("Sequence[Any]", seqs)
        if (
            items
            and set(map(type, items)) == _INT_ONLY
            and min(items) >= 0
            and max(items) < seq
            and len(set(items)) == len(items)
        ):
            return
    bad = f'session event "{etype}" carries invalid sourceEventSeqs'
    if type(seqs) not in (list, tuple):
        raise EventValidationError(bad)
    assert isinstance(seqs, (list, tuple))
    if not seqs and etype != "assistant/message":
        raise EventValidationError(bad)
    seen: set[int] = set()
    for s in seqs:
        if not is_safe_int(s) or s < 0 or s >= seq or s in seen:
            raise EventValidationError(bad)
        seen.add(s)


def check_message_shape(event: SessionEvent) -> None:
    """Raise :class:`EventValidationError` when a surface event's message breaks its shape rule.

    ``user/message`` carries a user message; ``assistant/message`` an assistant message with a model source;
    ``tool/result`` a user message with a tool source and exactly one tool-result block answering that call.
    Other events pass.
    """
    kind = type(event)
    if kind is UserMessage:
        message: Message = event.data  # type: ignore[assignment]
        if message.role != "user":
            raise EventValidationError(f'session event "user/message" (seq {event.seq}) must carry a user message')
    elif kind is AssistantMessage:
        message = event.data.message  # type: ignore[union-attr, assignment]
        if message.role != "assistant" or type(message.source) is not ModelSource:
            raise EventValidationError(
                f'session event "assistant/message" (seq {event.seq}) must carry an assistant message '
                "with a model source"
            )
    elif kind is ToolResult:
        message = event.data.message  # type: ignore[union-attr, assignment]
        source = message.source
        blocks = message.content
        if (
            message.role != "user"
            or type(source) is not ToolSource
            or len(blocks) != 1
            or type(blocks[0]) is not ToolResultBlock
            or blocks[0].tool_call_id != source.call_id
        ):
            raise EventValidationError(
                f'session event "tool/result" (seq {event.seq}) must carry exactly one tool-result block '
                "answering its source call"
            )


def decode_event(obj: object) -> SessionEvent:
    """Build a frozen event from its plain JSON form (two-phase: envelope, then type).

    Unknown types become :class:`OpaqueEvent` (kept verbatim); whether a reader may accept them is decided by
    ``versions.first_refused_unknown``. Raises :class:`EventValidationError` with a specific message otherwise.
    """
    etype, seq, _time, env = _envelope(obj)
    cls = EVENT_TYPES.get(etype)
    if cls is None:
        if "surfaceOp" in env or "sourceEventSeqs" in env:
            raise EventValidationError(f'session event "{etype}" is not surface-eligible and cannot carry surfaceOp')
        return msgspec.convert(env, OpaqueEvent)
    _check_surface(etype, seq, env)
    try:
        event = cast("SessionEvent", msgspec.convert(env, cls))
    except msgspec.ValidationError as exc:
        raise EventValidationError(f'invalid session event "{etype}" at seq {seq}: {exc}') from exc
    if cls.surface:
        check_message_shape(event)
    return event


#: The payload type of every known event type (the ``data`` field's declared type).
_DATA_TYPES: dict[str, Any] = {
    etype: next(f.type for f in msgspec.structs.fields(cls) if f.name == "data") for etype, cls in EVENT_TYPES.items()
}


def append_envelope(
    etype: str, seq: int, time: int, data: Any, source_event_seqs: list[Any] | None, ignorable: bool
) -> dict[str, Any]:
    """The wire form a live append describes (surface types get ``surfaceOp: "append"``)."""
    envelope: dict[str, Any] = {"type": etype, "seq": seq, "time": time, "data": data}
    if source_event_seqs is not None:
        envelope["sourceEventSeqs"] = source_event_seqs
    if etype in SURFACE_EVENT_TYPES:
        envelope["surfaceOp"] = "append"
    if ignorable:
        envelope["ignorable"] = True
    return envelope


#: Per known event type, what a live append needs to build it: (class, payload type, surface-eligible, must be marked
#: ignorable). One lookup per appended event.
_BUILD: dict[str, tuple[Any, Any, bool, bool]] = {
    etype: (cls, _DATA_TYPES[etype], cls.surface, etype in IGNORABLE_EVENT_TYPES) for etype, cls in EVENT_TYPES.items()
}
_MIN_SAFE = -MAX_SAFE_INTEGER


def build_event(
    etype: str, seq: int, time: int, data: Any, source_event_seqs: list[Any] | None, ignorable: bool
) -> SessionEvent:
    """``decode_event(append_envelope(...))`` without building and re-checking the envelope for a known type.

    ``data`` and ``source_event_seqs`` must already have passed :func:`snapshot_json`. The envelope checks that
    can fail for a live append are made here (time, seq, surface metadata, the ignorable mark), the payload is
    converted straight into its type, and the event struct is built from parts whose values are already checked;
    anything that fails (or an unknown type) goes through :func:`decode_event` itself, so results and errors are
    the same.
    """
    build = _BUILD.get(etype)
    if (
        build is None
        or type(time) is not int
        or not _MIN_SAFE <= time <= MAX_SAFE_INTEGER
        or not 0 <= seq <= MAX_SAFE_INTEGER
        or (build[3] and not ignorable)
    ):
        return decode_event(append_envelope(etype, seq, time, data, source_event_seqs, ignorable))
    cls, data_type, surface, _ = build
    if source_event_seqs is not None:
        if not surface:
            return decode_event(append_envelope(etype, seq, time, data, source_event_seqs, ignorable))
        check_source_event_seqs(etype, seq, source_event_seqs)
    try:
        payload = msgspec.convert(data, data_type)
    except msgspec.ValidationError:
        # Same conversion inside the envelope: reports the error with its envelope path, as decode_event does.
        return decode_event(append_envelope(etype, seq, time, data, source_event_seqs, ignorable))
    if not surface:
        if ignorable:
            event: SessionEvent = cls(seq=seq, time=time, data=payload, ignorable=True)
            return event
        event = cls(seq=seq, time=time, data=payload)  # ``ignorable`` stays UNSET
        return event
    seqs = UNSET if source_event_seqs is None else tuple(source_event_seqs)
    event = cls(
        seq=seq,
        time=time,
        data=payload,
        ignorable=True if ignorable else UNSET,
        surface_op="append",
        source_event_seqs=seqs,
    )
    check_message_shape(event)
    return event


def check_typed_surface(event: SessionEvent) -> None:
    """The checks of a surface event that a typed decode of its line cannot express (``sourceEventSeqs`` order
    and repeats, the message shape); raises :class:`EventValidationError` like :func:`decode_event` would.
    """
    seqs = event.source_event_seqs  # type: ignore[union-attr]
    # Typed decoding already made every member a non-negative safe int: only order and repeats are left.
    if seqs is not UNSET and not (seqs and max(seqs) < event.seq and len(set(seqs)) == len(seqs)):
        check_source_event_seqs(event.type, event.seq, seqs)
    check_message_shape(event)


def decode_event_line(line: bytes | str) -> SessionEvent:
    """Decode one JSON line into an event; the typed fast path falls back to :func:`decode_event` for errors."""
    try:
        event = _known_decoder.decode(line)
    except (msgspec.DecodeError, RecursionError):  # the slow path explains what is wrong
        pass
    else:
        if event.surface:
            check_typed_surface(event)
        elif event.ignorable is not True and event.type in IGNORABLE_EVENT_TYPES:
            check_ignorable(event.type, event.seq, event.ignorable)
        return event
    try:
        obj = _json_decoder.decode(line)
    except msgspec.DecodeError as exc:
        raise EventValidationError(f"invalid event line: {exc}") from exc
    except RecursionError as exc:  # nesting deeper than the interpreter allows here (see _json.MAX_JSON_DEPTH)
        raise EventValidationError("invalid event line: nested too deeply to decode") from exc
    return decode_event(obj)


def event_to_builtins(event: SessionEvent) -> dict[str, Any]:
    """The event as a plain JSON object (what is stored and exported)."""
    # Through JSON rather than msgspec.to_builtins, which keeps tuples: the result must be plain JSON.
    out: dict[str, Any] = _json_decoder.decode(_encoder.encode(event))
    return out


def encode_event(event: SessionEvent) -> bytes:
    """Compact JSON of one event, without a trailing newline."""
    try:
        return _encoder.encode(event)
    except RecursionError as exc:  # nesting deeper than the interpreter allows here (see _json.MAX_JSON_DEPTH)
        raise NotLosslessJsonError(f'session event "{event.type}" (seq {event.seq})', "nested too deeply", "$") from exc


def event_types(events: Sequence[SessionEvent]) -> list[str]:
    """The wire types of ``events``, in order (handy in tests and tools)."""
    return [e.type for e in events]
