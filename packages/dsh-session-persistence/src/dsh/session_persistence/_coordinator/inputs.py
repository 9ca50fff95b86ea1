"""What a caller hands the coordinator, checked and snapshotted before any storage work: log offsets and event
batches (copied through the lossless JSON boundary, so later caller mutations are invisible)."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .._backends.protocol import StorageMetadata
from .._model.events import SessionEvent
from .._model.header import SessionHeader, check_header_cwd, header_to_builtins
from .._model.ids import check_session_id
from .._model.jsonvalue import NotLosslessJsonError, is_safe_int, snapshot_json
from .._wire.codec import decode_event, event_to_builtins

__all__ = ["check_offset", "snapshot_batch"]

_LOSSY_BATCH = "session event batch is not losslessly JSON-serializable because it contains non-JSON-serializable data"


def check_offset(value: object) -> int:
    if not is_safe_int(value) or value < 0:  # type: ignore[operator]
        raise TypeError(f"SessionLogOffset must be a non-negative safe integer, got {value!r}")
    return value  # type: ignore[return-value]


def snapshot_batch(events: Sequence[SessionEvent | Mapping[str, Any]]) -> builtins.list[SessionEvent]:
    """Copy the batch through the lossless JSON boundary now, so later caller mutations are invisible."""
    plain: builtins.list[object] = []
    try:
        for event in list(events):
            if isinstance(event, Mapping):
                plain.append(snapshot_json(dict(event), "session event"))
            else:
                data = getattr(event, "data", None)
                if type(data) in (dict, list):
                    # Opaque payloads are plain containers: check them before msgspec would coerce them.
                    snapshot_json(data, f'session event "{event.type}"')
                plain.append(snapshot_json(event_to_builtins(event), f'session event "{event.type}"'))
    except NotLosslessJsonError as exc:
        # The same typed error the live path raises (it names the offending value's path).
        raise NotLosslessJsonError(f"{_LOSSY_BATCH}: {exc.what}", exc.reason, exc.path) from exc
    except TypeError as exc:
        raise TypeError(f"{_LOSSY_BATCH}: {exc}") from exc
    return [decode_event(obj) for obj in plain]


def check_create_meta(meta: SessionHeader | Mapping[str, Any], inherited_event_count: int | None) -> StorageMetadata:
    """The header and cut a ``create`` registers, every rule checked (``TypeError`` naming the first broken one)."""
    raw = header_to_builtins(meta) if isinstance(meta, SessionHeader) else meta
    if isinstance(raw, Mapping) and "id" in raw:
        check_session_id(raw["id"])  # before the JSON check, which would call a lone surrogate "not JSON"
    try:
        data = snapshot_json(dict(raw) if isinstance(raw, Mapping) else raw, "session metadata")
    except NotLosslessJsonError as exc:
        raise TypeError("session metadata must be losslessly JSON-serializable") from exc
    if not isinstance(data, dict):
        raise TypeError("session metadata must be a JSON object")
    created_at = data.get("createdAt")
    if not is_safe_int(created_at) or created_at < 0:  # type: ignore[operator]
        raise TypeError("session metadata createdAt must be a non-negative safe integer")
    seeded = data.get("isSeeded") is True
    if seeded and inherited_event_count is None:
        raise TypeError("seeded session metadata requires an inherited event count")
    cut = 0 if inherited_event_count is None else check_offset(inherited_event_count)
    if not seeded and cut != 0:
        raise TypeError("unseeded session metadata inherited event count must be 0")
    if "cwd" in data:
        check_header_cwd(data["cwd"])  # the live path's rule and message (a relative cwd is never listable)
    try:
        header = meta if isinstance(meta, SessionHeader) else msgspec.convert(data, SessionHeader)
    except msgspec.ValidationError as exc:
        raise TypeError(f"session metadata is not a session header: {exc}") from exc
    return StorageMetadata(header, cut)
