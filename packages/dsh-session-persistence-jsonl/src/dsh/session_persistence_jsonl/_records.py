"""JSONL records: the header line, storage lines (events and packed chunk rows), and their errors (spec §2.1).

Each line is one compact JSON value terminated by LF. Line 1 is the header; every later line is an event or a
packed chunk row that expands to several events.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from dsh.session_persistence._backend import StorageMetadata
from dsh.session_persistence._chunk_rows import CHUNK_ROW_TAGS, expand_chunk_row, pack_chunk_rows, row_member_count
from dsh.session_persistence._errors import SessionFormatUnsupportedError, SessionPersistenceCorruptionError
from dsh.session_persistence._events import (
    AssistantChunk,
    AssistantChunkData,
    ReasoningDeltaChunk,
    SessionEvent,
    TextDeltaChunk,
    ToolCallDeltaChunk,
    decode_event,
    decode_event_line,
    encode_event,
)
from dsh.session_persistence._header import SESSION_FORMAT_VERSION, SessionHeader, header_from_builtins
from dsh.session_persistence._json import is_safe_int
from msgspec import UNSET

__all__ = [
    "LineDefect",
    "NotAHeaderError",
    "corrupt",
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


def _row_events(obj: object) -> list[SessionEvent] | None:
    """A valid chunk row's events built straight as structs, or ``None`` (not a row, or left to the generic path).

    The row is validated by ``row_member_count`` (same checks and errors as ``expand_chunk_row``). The structs
    are exactly what ``msgspec.convert`` of the expanded members would give; the only member checks conversion
    adds to the row's own are the non-negative ``turn``/``step``/``index``, so a row failing them (or anything
    unexpected) is left to the generic path, which reports it. Saves building two dicts per member and converting
    them (the bulk of a load's time, since most events of a streamed log are packed deltas).
    """
    if type(obj) is not dict:
        return None
    tag = obj.get("type")
    if type(tag) is not str or tag not in CHUNK_ROW_TAGS:
        return None
    count = row_member_count(obj)  # validates the row completely (raises ChunkRowError)
    data = obj["data"]
    turn, step, index = data["turn"], data["step"], data["index"]
    if turn < 0 or step < 0 or index < 0:
        return None
    seq: int = obj["seq0"]
    time: int = obj["time0"]
    dt = data["dt"]
    events: list[SessionEvent] = []
    append = events.append
    if tag == "tool-call-chunks":
        call_id = data["id"]
        name = data.get("name", UNSET)
        members = data["args"]
        for k in range(count):
            if k:
                time += dt[k - 1]
            chunk: Any = ToolCallDeltaChunk(index=index, id=call_id, name=name, arguments_delta=members[k])
            append(AssistantChunk(seq=seq + k, time=time, data=AssistantChunkData(turn=turn, step=step, chunk=chunk)))
        return events
    kind = TextDeltaChunk if tag == "text-chunks" else ReasoningDeltaChunk
    for k, text in enumerate(data["texts"]):
        if k:
            time += dt[k - 1]
        chunk = kind(index=index, text=text)
        append(AssistantChunk(seq=seq + k, time=time, data=AssistantChunkData(turn=turn, step=step, chunk=chunk)))
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
    if isinstance(version, (int, float)) and type(version) is not bool and version != SESSION_FORMAT_VERSION:
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
