"""Format refusals: a stored log that is intact but that this build cannot interpret.

A refusal is never wrapped as corruption: it tells the operator which way to go (upgrade the harness, or there
is no upgrade path) and, when the backend keeps one artifact per session, where the raw log is.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from .._model.errors import SessionFormatUnsupportedError
from .._model.events import OpaqueEvent, SessionEvent
from .._model.header import READABLE_FORMAT_VERSIONS, SESSION_FORMAT_VERSION

__all__ = ["check_format_version", "first_refused_unknown", "refuse_unknown_events"]


def check_format_version(session_id: object, version: object, location: str | None = None) -> None:
    """Raise :class:`SessionFormatUnsupportedError` unless ``version`` is one this build reads.

    A version that is not a number is left to header validation (it is corruption, not a refusal). A
    ``session_id`` that is not a string (a damaged header's ``id``) is shown as its JSON text.
    """
    if type(version) not in (int, float) or version in READABLE_FORMAT_VERSIONS:
        return
    shown = int(version) if isinstance(version, float) and version.is_integer() else version
    current = SESSION_FORMAT_VERSION
    sid = _id_text(session_id)
    if version > current:  # type: ignore[operator]
        message = (
            f'session "{sid}" uses log format v{shown}, but this harness reads only v{current}: '
            "the log was written by a newer harness — upgrade the harness to open it"
        )
    else:
        message = (
            f'session "{sid}" uses log format v{shown}, older than the supported v{current}, '
            "and this build ships no upgrade path for it"
        )
    raise SessionFormatUnsupportedError(message, location)


def _id_text(value: object) -> str:
    if type(value) is str:
        return value
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, msgspec.MsgspecError):  # a value decoded from JSON always re-encodes
        return repr(value)


def refuse_unknown_events(session_id: str, events: Iterable[SessionEvent], location: str | None = None) -> None:
    """Raise :class:`SessionFormatUnsupportedError` for the first unknown event type not marked ``ignorable``."""
    refused = first_refused_unknown(events)
    if refused is None:
        return
    raise SessionFormatUnsupportedError(
        f'session "{session_id}" contains event type "{refused.type}" (seq {refused.seq}) unknown to this harness '
        "and not marked ignorable; refusing to interpret the log — it was likely written by a newer harness",
        location,
    )


def first_refused_unknown(events: Iterable[SessionEvent]) -> OpaqueEvent | None:
    """The first stored event whose type is unknown to this build and not marked ``ignorable``."""
    # Usually there is no unknown type at all: for a list or tuple one C-level pass over the types answers that.
    if type(events) in (list, tuple) and OpaqueEvent not in set(map(type, events)):
        return None
    for event in events:
        if type(event) is OpaqueEvent and event.ignorable is not True:
            return event
    return None
