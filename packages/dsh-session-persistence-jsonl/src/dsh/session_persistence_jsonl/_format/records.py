"""JSONL records: the header line and its errors (spec §2.1).

Each line is one compact JSON value terminated by LF. Line 1 is the header; every later line is a storage line
(an event or a packed chunk row), written and read by the core codec
(:func:`~dsh.session_persistence.backend.encode_storage_lines`,
:func:`~dsh.session_persistence.backend.decode_storage_lines`).
"""

from __future__ import annotations

from typing import Any

import msgspec
from dsh.session_persistence.backend import (
    SessionHeader,
    SessionPersistenceCorruptionError,
    StorageMetadata,
    check_format_version,
    header_from_stored,
    is_safe_int,
)
from msgspec import UNSET

from .sealed import unsealed_header_object

__all__ = [
    "NotAHeaderError",
    "corrupt",
    "encode_header_line",
    "parse_header_line",
]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_RETIRED_KEYS = ("sandboxMode", "approvalPolicy")


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


# ------------------------------------------------------------------------------------------------------------
# Reading


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
    if type(obj) is dict:
        obj = unsealed_header_object(obj)  # a sealed (v2) header reads as the v1 header it wraps
    if refuse_versions and type(obj) is dict:
        check_format_version(obj.get("id"), obj.get("version"), path)
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
    try:
        header = header_from_stored(body)
    except ValueError as exc:
        raise NotAHeaderError(f"{bad}: {exc}") from exc
    if cut and not header.is_seeded:
        raise NotAHeaderError(f"{bad}: inheritedEventCount {cut} on a session that is not seeded")
    return header, cut
