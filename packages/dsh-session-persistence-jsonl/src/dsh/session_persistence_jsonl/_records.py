"""JSONL records: the header line, storage lines (events and packed chunk rows), and their errors (spec §2.1).

Each line is one compact JSON value terminated by LF. Line 1 is the header; every later line is an event or a
packed chunk row that expands to several events.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Any, Union

import msgspec
from dsh.session_persistence._backend import StorageMetadata
from dsh.session_persistence._chunk_rows import CHUNK_ROW_TAGS, expand_chunk_row, pack_chunk_rows, row_member_count
from dsh.session_persistence._errors import SessionFormatUnsupportedError, SessionPersistenceCorruptionError
from dsh.session_persistence._events import (
    AssistantChunk,
    AssistantChunkData,
    KnownEvent,
    ReasoningDeltaChunk,
    SessionEvent,
    TextDeltaChunk,
    ToolCallDeltaChunk,
    _check_message_shape,
    decode_event,
    decode_event_line,
    encode_event,
)
from dsh.session_persistence._header import (
    READABLE_FORMAT_VERSIONS,
    SESSION_FORMAT_VERSION,
    SessionHeader,
    header_from_builtins,
)
from dsh.session_persistence._json import MAX_SAFE_INTEGER, is_safe_int
from msgspec import UNSET, UnsetType

__all__ = [
    "LineDefect",
    "NotAHeaderError",
    "corrupt",
    "decode_frame_lines",
    "decode_line",
    "encode_batch",
    "encode_header_line",
    "parse_header_line",
]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_ChunkEvents = list[AssistantChunk]
_ROW_PREFIXES = tuple(b'{"type":"' + tag.encode() + b'"' for tag in sorted(CHUNK_ROW_TAGS))
_RETIRED_KEYS = ("sandboxMode", "approvalPolicy")


class LineDefect(ValueError):
    """A complete storage line that does not decode to events (bad JSON, bad row, bad envelope)."""


class NotAHeaderError(ValueError):
    """The first line parses as JSON but is not a session header (``list`` skips such sessions)."""


def corrupt(message: str, path: str | None = None) -> SessionPersistenceCorruptionError:
    """A corruption error with the spec's text, naming the artifact when known."""
    return SessionPersistenceCorruptionError(message if path is None else f"{message} (session log: {path})")


# ------------------------------------------------------------------------------------------------------------
# Writing


def encode_header_line(storage: StorageMetadata) -> bytes:
    """The header line, keys in on-disk order, ``delegationDepth`` always present, LF-terminated."""
    header = storage.meta
    obj: dict[str, Any] = {"type": "session", "version": header.version, "id": header.id}
    obj["createdAt"] = header.created_at
    if header.cwd is not UNSET:
        obj["cwd"] = header.cwd
    if header.parent_session is not UNSET:
        obj["parentSession"] = header.parent_session
    obj["isSeeded"] = header.is_seeded
    if storage.inherited_event_count:
        obj["inheritedEventCount"] = storage.inherited_event_count
    if header.origin is not UNSET:
        obj["origin"] = header.origin
    obj["delegationDepth"] = 0 if header.delegation_depth is UNSET else header.delegation_depth
    if header.agent_preset is not UNSET:
        obj["agentPreset"] = header.agent_preset
    return _encoder.encode(obj) + b"\n"


def encode_batch(events: Sequence[SessionEvent], pack_chunks: bool) -> bytes:
    """A batch's storage lines joined by LF plus one trailing LF (``b""`` for an empty batch).

    With ``pack_chunks`` only runs of ``assistant/chunk`` events go through the (dict-based) packer; every other
    event ends a run anyway, so it is encoded straight from its struct: the same bytes as packing the whole
    batch, without a JSON round trip per event (the packer's input, ``to_builtins`` of a chunk event, equals its
    ``event_to_builtins``; non-packable members pass through and encode to the same JSON).
    """
    if not events:
        return b""
    if not pack_chunks:
        return b"\n".join(encode_event(e) for e in events) + b"\n"
    lines: list[bytes] = []
    run: list[SessionEvent] = []
    for event in events:
        if type(event) is AssistantChunk:
            run.append(event)
            continue
        if run:
            lines.extend(_encoder.encode(r) for r in pack_chunk_rows(msgspec.to_builtins(run)))
            run = []
        lines.append(encode_event(event))
    if run:
        lines.extend(_encoder.encode(r) for r in pack_chunk_rows(msgspec.to_builtins(run)))
    return b"\n".join(lines) + b"\n"


# ------------------------------------------------------------------------------------------------------------
# Reading


def decode_line(line: bytes) -> list[SessionEvent]:
    """Decode one storage line (without its LF) into the events it holds, or raise :class:`LineDefect`.

    Unknown event types come back as ``OpaqueEvent``: whether they may be interpreted is the coordinator's call.
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
        raise LineDefect(str(exc)) from exc


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
    checks are the row validation of ``_chunk_rows`` plus the members' non-negative counts, done in C-level
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
    """A row's member events from its checked-shape fields, or ``None`` where :func:`_fast_row` gives up."""
    if type(turn) is not int or type(step) is not int or type(index) is not int:
        return None
    if not (0 <= turn <= MAX_SAFE_INTEGER and 0 <= step <= MAX_SAFE_INTEGER and 0 <= index <= MAX_SAFE_INTEGER):
        return None
    if type(members) is not list or not members or set(map(type, members)) != _STR_ONLY:
        return None
    if type(dt) is not list or len(dt) != len(members) - 1:
        return None
    if dt and (set(map(type, dt)) != _INT_ONLY or min(dt) < -MAX_SAFE_INTEGER or max(dt) > MAX_SAFE_INTEGER):
        return None
    times = list(accumulate(dt, initial=time0))
    if seq0 < 0 or seq0 + len(members) - 1 > MAX_SAFE_INTEGER or min(times) < -MAX_SAFE_INTEGER:
        return None
    if max(times) > MAX_SAFE_INTEGER:
        return None
    seqs = range(seq0, seq0 + len(members))
    if tag == "tool-call-chunks":
        return [
            AssistantChunk(
                seq=seq,
                time=time,
                data=AssistantChunkData(
                    turn=turn,
                    step=step,
                    chunk=ToolCallDeltaChunk(index=index, id=call_id, name=name, arguments_delta=member),
                ),
            )
            for seq, time, member in zip(seqs, times, members, strict=True)
        ]
    kind = TextDeltaChunk if tag == "text-chunks" else ReasoningDeltaChunk
    return [
        AssistantChunk(
            seq=seq, time=time, data=AssistantChunkData(turn=turn, step=step, chunk=kind(index=index, text=member))
        )
        for seq, time, member in zip(seqs, times, members, strict=True)
    ]


class _TextRowData(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    turn: int
    step: int
    index: int
    dt: list[int]
    texts: list[str]


class _ToolRowData(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    turn: int
    step: int
    index: int
    dt: list[int]
    id: str
    args: list[str]
    name: str | UnsetType = UNSET


class _TextRow(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type", tag="text-chunks", gc=False):
    seq0: int
    time0: int
    data: _TextRowData


class _ReasoningRow(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type", tag="reasoning-chunks", gc=False
):
    seq0: int
    time0: int
    data: _TextRowData


class _ToolRow(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type", tag="tool-call-chunks", gc=False
):
    seq0: int
    time0: int
    data: _ToolRowData


# A typed row decodes only where the dict path's key and type checks pass (exact key sets, exact ints and
# strings, ``name`` a string when present); the value checks are then the same :func:`_build_row`.
_frame_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(Union[KnownEvent, _TextRow, _ReasoningRow, _ToolRow])
_ROW_TAG_OF: dict[type, str] = {
    _TextRow: "text-chunks",
    _ReasoningRow: "reasoning-chunks",
    _ToolRow: "tool-call-chunks",
}


def decode_frame_lines(plaintext: bytes) -> list[SessionEvent] | None:
    """All events of a complete frame's LF-terminated lines, or ``None``: leave the frame to :func:`decode_line`.

    The batch path for the common case (every line a known event or a valid chunk row): each line is decoded on
    its own by one typed decoder in a C-level ``map`` (so whitespace and line boundaries mean exactly what they
    mean to :func:`decode_line`), surface events get :func:`decode_event_line`'s post-checks, and rows go through
    :func:`_build_row`. Any exception or refusal returns ``None`` and the caller redoes the whole frame line by
    line, so error texts and torn/corrupt decisions come from the one per-line path. The events equal
    :func:`decode_line`'s for each line, in order.
    """
    lines = plaintext.split(b"\n")
    if lines.pop():
        return None  # no final LF: the per-line path keeps the fragment
    try:
        values = list(map(_frame_decoder.decode, lines))
        events: list[SessionEvent] = []
        for value in values:
            tag = _ROW_TAG_OF.get(type(value))
            if tag is None:
                if value.surface:
                    # decode_event_line's post-checks; an unusual sourceEventSeqs is left to it entirely.
                    seqs = value.source_event_seqs
                    if seqs is not UNSET and not (seqs and max(seqs) < value.seq and len(set(seqs)) == len(seqs)):
                        return None
                    _check_message_shape(value)
                events.append(value)
                continue
            data = value.data
            built = _build_row(
                tag,
                value.seq0,
                value.time0,
                data.turn,
                data.step,
                data.index,
                data.dt,
                data.args if tag == "tool-call-chunks" else data.texts,
                data.id if tag == "tool-call-chunks" else None,
                data.name if tag == "tool-call-chunks" else UNSET,
            )
            if built is None:
                return None
            events.extend(built)
    except Exception:  # anything at all: the per-line path decides and names it
        return None
    return events


def _version_text(version: int | float) -> str:
    if type(version) is float and version.is_integer():
        return str(int(version))
    return str(version)


def _id_text(value: object) -> str:
    if type(value) is str:
        return value
    try:
        return _encoder.encode(value).decode()
    except (TypeError, msgspec.MsgspecError):  # pragma: no cover - decoded JSON always re-encodes
        return repr(value)


def format_refusal(obj: dict[str, Any], version: int | float) -> str:
    """The session-core §5.5 refusal text for a header whose version is not ours."""
    sid = _id_text(obj.get("id"))
    v = _version_text(version)
    if version > SESSION_FORMAT_VERSION:
        return (
            f'session "{sid}" uses log format v{v}, but this harness reads only v{SESSION_FORMAT_VERSION}: '
            "the log was written by a newer harness — upgrade the harness to open it"
        )
    return (
        f'session "{sid}" uses log format v{v}, older than the supported v{SESSION_FORMAT_VERSION}, '
        "and this build ships no upgrade path for it"
    )


def _foreign_version(obj: object) -> int | float | None:
    if type(obj) is not dict:
        return None
    version = obj.get("version")
    if isinstance(version, (int, float)) and type(version) is not bool and version not in READABLE_FORMAT_VERSIONS:
        return version
    return None


def parse_header_line(line: bytes, path: str, *, refuse_versions: bool = True) -> tuple[SessionHeader, int]:
    """Validate the first line (without LF) in the spec's order; return the header and the inherited cut.

    Order: JSON, then the version refusal straight from the raw object (a future header need not look like
    today's), then the shape, then retired keys. ``refuse_versions=False`` (``list``) accepts any well-shaped
    version. Raises :class:`NotAHeaderError` for JSON that is not a header, so ``list`` can skip it.
    """
    try:
        obj = _decoder.decode(line)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise NotAHeaderError("corrupt session log: header line is not valid JSON") from exc
    version = _foreign_version(obj)
    if refuse_versions and version is not None:
        assert type(obj) is dict
        raise SessionFormatUnsupportedError(format_refusal(obj, version), location=path)
    if type(obj) is not dict or obj.get("type") != "session":
        raise NotAHeaderError("corrupt session log: first line is not a session header")
    if obj.get("id") == "":
        raise corrupt(f'corrupt session log "{path}": header id cannot name a storage path')
    header, cut = _header_shape(obj)
    if any(key in obj for key in _RETIRED_KEYS):
        raise corrupt("corrupt session log: session header uses retired policy baseline fields", path)
    return header, cut


def _header_shape(obj: dict[str, Any]) -> tuple[SessionHeader, int]:
    bad = "corrupt session log: first line is not a session header"
    version = obj.get("version")
    if not is_safe_int(version) or "delegationDepth" not in obj:
        raise NotAHeaderError(bad)
    cut = obj.get("inheritedEventCount", 0)
    if not is_safe_int(cut) or cut < 0:
        raise NotAHeaderError(bad)
    body = {k: v for k, v in obj.items() if k not in ("type", "inheritedEventCount", *_RETIRED_KEYS)}
    body["version"] = SESSION_FORMAT_VERSION
    try:
        header = header_from_builtins(body)
    except ValueError as exc:
        raise NotAHeaderError(f"{bad}: {exc}") from exc
    if cut and not header.is_seeded:
        raise NotAHeaderError(f"{bad}: inheritedEventCount {cut} on a session that is not seeded")
    if version != SESSION_FORMAT_VERSION:
        header = msgspec.structs.replace(header, version=version)
    return header, cut
