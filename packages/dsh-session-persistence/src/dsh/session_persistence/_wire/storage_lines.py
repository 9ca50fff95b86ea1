"""Storage lines: the wire form of a stored batch, one compact JSON value per LF-terminated line.

Each line holds one event or one packed chunk row (a run of ``assistant/chunk`` deltas stored as one value, see
:func:`~dsh.session_persistence.backend.pack_chunk_rows`). Encoding and decoding live here once for every
backend: :func:`encode_storage_lines` writes a batch, :func:`decode_storage_line` reads one line and
:func:`decode_storage_lines` reads many at once. The decoders take a typed fast path and fall back to the
generic decoder for anything it does not accept, so every error text comes from one place; the equivalence of
the two paths is a tested property.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Annotated, Any, Union, get_args

import msgspec
from msgspec import UNSET, UnsetType

from .._model.events import (
    IGNORABLE_EVENT_TYPES,
    AssistantChunk,
    KnownEvent,
    SessionEvent,
)
from .._model.jsonvalue import MAX_SAFE_INTEGER
from .._model.stored_events import PackedRun, StoredEvents, packed_run
from .chunk_pack import chunk_run_values, encode_chunk_run
from .chunk_rows import CHUNK_ROW_TAGS, expand_chunk_row, row_events, row_member_count
from .codec import check_typed_surface, decode_event, decode_event_line, encode_event

__all__ = [
    "StorageLineError",
    "decode_storage_line",
    "decode_storage_lines",
    "decode_storage_lines_from",
    "decode_stored_batch",
    "encode_storage_lines",
]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_ChunkEvents = list[AssistantChunk]
_seq_of = operator.attrgetter("seq")
_ROW_PREFIXES = tuple(b'{"type":"' + tag.encode() + b'"' for tag in sorted(CHUNK_ROW_TAGS))


class StorageLineError(ValueError):
    """A complete storage line that does not decode to events (bad JSON, a bad chunk row, a bad event).

    ``line`` is the 1-based line number when :func:`decode_storage_lines` raised it, else ``None``.
    """

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


# ------------------------------------------------------------------------------------------------------------
# Writing


def encode_storage_lines(events: Sequence[SessionEvent], *, pack_chunks: bool) -> bytes:
    """A batch's storage lines joined by LF plus one trailing LF (``b""`` for an empty batch).

    With ``pack_chunks`` each run of packable ``assistant/chunk`` deltas becomes one chunk row. Only chunk events
    go through the packer (on their structs, :func:`~._chunk_pack.chunk_run_values`); every other event ends a run
    anyway, so it is encoded straight from its struct: the same bytes as packing the whole batch as plain JSON.
    The batch's values are encoded in one ``encode_lines`` call; if anything fails on the way, the batch is encoded
    again line by line (:func:`_encode_each`), which raises what it always raised.
    """
    if not events:
        return b""
    try:
        if not pack_chunks:
            return _encoder.encode_lines(events)
        values: list[Any] = []
        run: list[AssistantChunk] = []
        for event in events:
            if type(event) is AssistantChunk:
                run.append(event)
                continue
            if run:
                values.extend(chunk_run_values(run))
                run = []
            values.append(event)
        if run:
            values.extend(chunk_run_values(run))
        return _encoder.encode_lines(values)
    except Exception:  # the line-by-line path decides, and names the defect as before (RecursionError too)
        return _encode_each(events, pack_chunks=pack_chunks)


def _encode_each(events: Sequence[SessionEvent], *, pack_chunks: bool) -> bytes:
    """:func:`encode_storage_lines` one line at a time (its error path: each event's own error text)."""
    if not pack_chunks:
        return b"\n".join(encode_event(e) for e in events) + b"\n"
    lines: list[bytes] = []
    run: list[AssistantChunk] = []
    for event in events:
        if type(event) is AssistantChunk:
            run.append(event)
            continue
        if run:
            lines.extend(encode_chunk_run(run))
            run = []
        lines.append(encode_event(event))
    if run:
        lines.extend(encode_chunk_run(run))
    return b"\n".join(lines) + b"\n"


# ------------------------------------------------------------------------------------------------------------
# Reading one line


def decode_storage_line(line: bytes) -> list[SessionEvent]:
    """Decode one storage line (without its LF) into the events it holds, or raise :class:`StorageLineError`.

    Unknown event types come back as ``OpaqueEvent``: whether they may be interpreted is the reader's call
    (:func:`~dsh.session_persistence.backend.refuse_unknown_events`).
    """
    try:
        if not line.startswith(_ROW_PREFIXES):
            try:
                return [decode_event_line(line)]
            except ValueError:
                # Possibly a row with a different key order: fall through to the generic path.
                pass
        obj = _decoder.decode(line)
        fast = _row_events(obj)
        if fast is not None:
            return fast
        members = expand_chunk_row(obj)
        if members is None:
            return [decode_event(obj)]
        try:
            # One typed conversion for the whole run (a validated row expands to exact, well-formed envelopes).
            chunks: list[SessionEvent] = msgspec.convert(members, _ChunkEvents)
        except msgspec.ValidationError:
            # The per-event path names the defect the way every other decode failure does.
            return [decode_event(m) for m in members]
        return chunks
    except (ValueError, msgspec.MsgspecError, RecursionError) as exc:
        raise StorageLineError(str(exc)) from exc


_ROW_KEYS = frozenset({"type", "seq0", "time0", "data"})
_TEXT_ROW_KEYS = frozenset({"turn", "step", "index", "dt", "texts"})
_TOOL_ROW_KEYS = frozenset({"turn", "step", "index", "dt", "id", "args"})
_NAMED_TOOL_ROW_KEYS = _TOOL_ROW_KEYS | {"name"}
_STR_ONLY = {str}
_INT_ONLY = {int}


def _row_events(obj: object) -> list[SessionEvent] | None:
    """A chunk row's events built straight as structs, or ``None`` (not a row, or left to the generic path).

    Saves building two dicts per member and converting them, the bulk of a load's time (most events of a streamed
    log are packed deltas). :func:`_fast_row` accepts only rows that are valid *and* whose members convert (its
    checks are the row validation of ``expand_chunk_row`` plus the members' non-negative counts, done in C-level
    passes); anything else is validated by ``row_member_count`` (raising the row's own error) and otherwise left
    to the generic path, which reports a member error. The structs equal ``msgspec.convert`` of the members.
    """
    if type(obj) is not dict:
        return None
    tag = obj.get("type")
    if type(tag) is not str or tag not in CHUNK_ROW_TAGS:
        return None
    events = _fast_row(obj, tag)
    if events is None:
        row_member_count(obj)  # raises ChunkRowError for an invalid row
    return events


def _fast_row(row: dict[str, Any], tag: str) -> list[SessionEvent] | None:
    if row.keys() != _ROW_KEYS:
        return None
    seq0, time0, data = row["seq0"], row["time0"], row["data"]
    if type(seq0) is not int or type(time0) is not int or type(data) is not dict:
        return None
    keys = data.keys()
    name: Any = UNSET
    call_id: Any = None
    if tag == "tool-call-chunks":
        if keys == _NAMED_TOOL_ROW_KEYS:
            name = data["name"]
            if type(name) is not str:
                return None
        elif keys != _TOOL_ROW_KEYS:
            return None
        call_id = data["id"]
        if type(call_id) is not str:
            return None
        members = data["args"]
    elif keys == _TEXT_ROW_KEYS:
        members = data["texts"]
    else:
        return None
    return _build_row(tag, seq0, time0, data["turn"], data["step"], data["index"], data["dt"], members, call_id, name)


def _build_row(
    tag: str, seq0: int, time0: int, turn: Any, step: Any, index: Any, dt: Any, members: Any, call_id: Any, name: Any
) -> list[SessionEvent] | None:
    """A row's member events from its checked-shape fields, or ``None`` where the fast paths give up."""
    if type(turn) is not int or type(step) is not int or type(index) is not int:
        return None
    if not (0 <= turn <= MAX_SAFE_INTEGER and 0 <= step <= MAX_SAFE_INTEGER and 0 <= index <= MAX_SAFE_INTEGER):
        return None
    if type(members) is not list or not members or set(map(type, members)) != _STR_ONLY:
        return None
    if type(dt) is not list:
        return None
    if dt and (set(map(type, dt)) != _INT_ONLY or min(dt) < -MAX_SAFE_INTEGER or max(dt) > MAX_SAFE_INTEGER):
        return None
    if seq0 < 0:
        return None
    return row_events(tag, seq0, time0, turn, step, index, dt, members, call_id, name)


# ------------------------------------------------------------------------------------------------------------
# Reading many lines


# The ranges _build_row checks by hand on the dict path, stated to the typed decoder (checked in C while decoding).
_RowCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INTEGER)]
_RowSafeInt = Annotated[int, msgspec.Meta(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]


class _TextRowData(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    turn: _RowCount
    step: _RowCount
    index: _RowCount
    dt: list[_RowSafeInt]
    texts: list[str]


class _ToolRowData(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    turn: _RowCount
    step: _RowCount
    index: _RowCount
    dt: list[_RowSafeInt]
    id: str
    args: list[str]
    name: str | UnsetType = UNSET


class _TextRow(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type", tag="text-chunks", gc=False):
    seq0: _RowCount
    time0: _RowSafeInt
    data: _TextRowData


class _ReasoningRow(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type", tag="reasoning-chunks", gc=False
):
    seq0: _RowCount
    time0: _RowSafeInt
    data: _TextRowData


class _ToolRow(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type", tag="tool-call-chunks", gc=False
):
    seq0: _RowCount
    time0: _RowSafeInt
    data: _ToolRowData


# A typed row decodes only where the dict path's key, type and per-field range checks pass (exact key sets, exact
# ints in range and strings, ``name`` a string when present); what spans fields is then
# checked by the same :func:`~.chunk_rows.row_events` that :func:`_build_row` ends with.
_batch_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(Union[KnownEvent, _TextRow, _ReasoningRow, _ToolRow])
_ROW_TAG_OF: dict[type, str] = {
    _TextRow: "text-chunks",
    _ReasoningRow: "reasoning-chunks",
    _ToolRow: "tool-call-chunks",
}
#: The event classes a typed decode leaves a check to: surface events (their shape) and the types older readers do
#: not know (their ``ignorable`` mark, as :func:`decode_event_line` checks it).
_IGNORABLE_KINDS = frozenset(cls for cls in get_args(KnownEvent) if cls.type in IGNORABLE_EVENT_TYPES)
_ROW, _SURFACE, _IGNORABLE = "row", "surface", "ignorable"
#: What :func:`_batch_from` does with a decoded value of each class beyond taking it (absent: nothing).
_KIND_OF: dict[type, str] = {
    **dict.fromkeys(_ROW_TAG_OF, _ROW),
    **{cls: _SURFACE for cls in get_args(KnownEvent) if cls.surface},
    **dict.fromkeys(_IGNORABLE_KINDS, _IGNORABLE),
}


def decode_storage_lines(data: bytes) -> list[SessionEvent]:
    """All events of LF-terminated storage lines, in order: :func:`decode_storage_line` for each line, at once.

    Raises :class:`StorageLineError` for the first line that does not decode (its error text, with the 1-based
    line number in ``line``), or when ``data`` does not end with LF. Seq contiguity is not checked here
    (:func:`~dsh.session_persistence.backend.check_contiguous` does that).
    """
    return decode_storage_lines_from(data, 0)[0]


def decode_storage_lines_from(data: bytes, first_seq: int) -> tuple[list[SessionEvent], bool]:
    """:func:`decode_storage_lines`, and whether the events carry exactly the seqs ``first_seq, first_seq + 1, ...``.

    For a reader that holds a batch's declared first seq: the answer comes per line (a chunk row's members are
    contiguous by construction), not per event. Same errors as :func:`decode_storage_lines`; a ``False`` is for
    the caller to word (it knows the batch).
    """
    events, contiguous = decode_stored_batch(data, first_seq)
    return (events if type(events) is list else list(events)), contiguous


def decode_stored_batch(data: bytes, first_seq: int) -> tuple[Sequence[SessionEvent], bool]:
    """:func:`decode_storage_lines_from` with packed chunk rows left packed: the events come back as a
    :class:`~dsh.session_persistence.backend.StoredEvents` whose runs expand only where a reader asks (a list
    when the batch holds no row, or when it is decoded line by line). Same events, same errors."""
    fast = _batch_from(data, first_seq)
    if fast is not None:
        return fast
    lines = data.split(b"\n")
    fragment = lines.pop()
    out: list[SessionEvent] = []
    for number, line in enumerate(lines, 1):
        try:
            out.extend(decode_storage_line(line))
        except StorageLineError as exc:
            raise StorageLineError(str(exc), number) from exc.__cause__
    if fragment:
        raise StorageLineError("storage line without a terminating LF", len(lines) + 1)
    return out, list(map(_seq_of, out)) == list(range(first_seq, first_seq + len(out)))


def _batch(data: bytes) -> list[SessionEvent] | None:
    """The batch fast path of :func:`decode_storage_lines`, or ``None`` (see :func:`_batch_from`)."""
    fast = _batch_from(data, 0)
    return None if fast is None else list(fast[0])


def _batch_from(data: bytes, first_seq: int) -> tuple[Sequence[SessionEvent], bool] | None:
    """The batch fast path of :func:`decode_storage_lines_from`, or ``None``: leave the data to the per-line path.

    Taken in the common case (every line a known event or a valid chunk row): each line is decoded on its own by
    one typed decoder in a C-level ``map`` (so whitespace and line boundaries mean exactly what they mean to
    :func:`decode_storage_line`), events get :func:`decode_event_line`'s post-checks (surface events their shape,
    the types older readers do not know their ``ignorable`` mark), and rows go through
    :func:`~.._model.stored_events.packed_run` (the checks of the one unpacker; the run stays packed). Any exception
    or refusal returns ``None``, so error texts come from the per-line path.
    Contiguity from ``first_seq`` is followed line by line: an event line holds its seq, a row ``seq0`` and the
    members after it. A batch without rows (most batches of a commit-per-step log) is its values, as decoded.
    """
    lines = data.split(b"\n")
    if lines.pop():
        return None  # no final LF: the per-line path reports the fragment
    expected = first_seq
    contiguous = True
    try:
        values = list(map(_batch_decoder.decode, lines))
        kind_of = _KIND_OF
        for at, value in enumerate(values):
            kind = kind_of.get(type(value))
            if kind is not None:
                if kind is _ROW:
                    return _rows_from(values, at, expected, contiguous)
                if kind is _SURFACE:
                    check_typed_surface(value)
                elif value.ignorable is not True:
                    return None  # a type older readers do not know, not marked ignorable: the per-line path refuses it
            seq = value.seq
            if seq != expected:
                contiguous = False
            expected = seq + 1
    except Exception:  # anything at all: the per-line path decides and names it
        return None
    return values, contiguous


def _rows_from(values: list[Any], at: int, expected: int, contiguous: bool) -> tuple[StoredEvents, bool] | None:
    """:func:`_batch_from` for a batch that holds chunk rows, from its first row ``values[at]`` on (the values before
    it are events :func:`_batch_from` has checked; ``expected`` and ``contiguous`` are its state there): events and
    rows in order, each row kept as one :class:`~.._model.stored_events.PackedRun` (expanded only where a reader
    asks for its events)."""
    items: list[SessionEvent | PackedRun] = values[:at]
    size = at
    for value in values[at:]:
        tag = _ROW_TAG_OF.get(type(value))
        if tag is None:
            if value.surface:
                check_typed_surface(value)
            elif type(value) in _IGNORABLE_KINDS and value.ignorable is not True:
                return None
            items.append(value)
            size += 1
            if value.seq != expected:
                contiguous = False
            expected = value.seq + 1
            continue
        row = value.data
        tool = tag == "tool-call-chunks"
        run = packed_run(
            tag,
            value.seq0,
            value.time0,
            row.turn,
            row.step,
            row.index,
            row.dt,
            row.args if tool else row.texts,
            row.id if tool else None,
            row.name if tool else UNSET,
        )
        if run is None:
            return None
        items.append(run)
        size += run.count
        if value.seq0 != expected:
            contiguous = False
        expected = value.seq0 + run.count
    return StoredEvents._of(items, size), contiguous
