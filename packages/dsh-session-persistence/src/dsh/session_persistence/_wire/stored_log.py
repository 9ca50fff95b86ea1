"""The one validation of a stored log that every reader in the coordinator uses (load, inspect, read_from,
adoption, the in-doubt read-back).

What it checks, in this order: the stored header names the requested id; its format version is the one this
build reads (refused as :class:`SessionFormatUnsupportedError`, never wrapped); the events are contiguous from
their first seq; (for a whole log) the turn rules hold, the inherited cut fits and the header round-trips; no
event has a type this build does not know without being ``ignorable``. Every defect in committed data is a
:class:`SessionPersistenceCorruptionError` reading ``stored session "<id>" failed validation: <cause>`` with the
cause chained, whichever reader found it.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._model.errors import SessionPersistenceCorruptionError
from .._model.events import SessionEvent
from .._model.header import SessionHeader, header_from_builtins, header_to_builtins
from .._model.jsonvalue import is_safe_int
from .._model.stored_events import PackedRun, StoredEvents
from .._model.validator import TurnValidator, validate_turns
from .codec import event_to_builtins
from .contiguity import first_seq_gap
from .versions import check_format_version, refuse_unknown_events

__all__ = [
    "check_contiguous",
    "corruption",
    "same_events",
    "same_header",
    "validate_stored",
]


def corruption(session_id: str, cause: Exception) -> SessionPersistenceCorruptionError:
    """The one wrapping of a defect found in stored data (``cause`` chained)."""
    error = SessionPersistenceCorruptionError(f'stored session "{session_id}" failed validation: {cause}')
    error.__cause__ = cause
    return error


def check_contiguous(events: Sequence[SessionEvent], start: int = 0) -> None:
    """Raise ``ValueError`` naming the first stored event whose seq is not ``start + index`` (the rule itself is
    :func:`first_seq_gap`; this is its wording for stored data)."""
    index = first_seq_gap(events, start)
    if index is not None:
        raise ValueError(f"stored event at index {start + index} has seq {events[index].seq}")


def same_events(left: Sequence[SessionEvent], right: Sequence[SessionEvent]) -> bool:
    """JSON equality of two event lists: what storage holds for each."""
    if len(left) != len(right):
        return False
    return all(a is b or event_to_builtins(a) == event_to_builtins(b) for a, b in zip(left, right, strict=True))


def same_header(left: SessionHeader, right: SessionHeader, *, any_version: bool = False) -> bool:
    """Whether two headers store the same thing (an absent ``delegationDepth`` is the stored depth 0).

    ``any_version``: the format version may differ (a backend may store an older readable header upgraded to
    the version it writes).
    """
    a, b = header_to_builtins(left), header_to_builtins(right)
    a.setdefault("delegationDepth", 0)
    b.setdefault("delegationDepth", 0)
    if any_version:
        a.pop("version", None)
        b.pop("version", None)
    return a == b


def _check_cut(session_id: str, cut: object, stored: int) -> None:
    if not is_safe_int(cut) or cut < 0:  # type: ignore[operator]
        raise ValueError(f"inherited event count {cut!r} is not a non-negative safe integer")
    if cut > stored:  # type: ignore[operator]
        raise ValueError(f'session "{session_id}" inherited event count exceeds its stored event count')


def _one_pass(events: Sequence[SessionEvent]) -> TurnValidator | None:
    """Contiguity, turn rules and known types of a whole log in one walk (:meth:`TurnValidator._check_log`), or
    ``None`` when that pass did not accept the log."""
    validator = TurnValidator()
    try:
        if type(events) is StoredEvents:  # walked by its segments: a packed run is checked as one unit
            accepted = validator._check_log(events._segments(), PackedRun)
        else:
            accepted = validator._check_log(events)
    except Exception:  # whatever it is, the separate checks decide and name it
        return None
    return validator if accepted else None


def validate_stored(
    session_id: str,
    meta: SessionHeader,
    cut: int,
    events: Sequence[SessionEvent],
    location: str | None,
    *,
    start: int = 0,
    whole: bool = True,
) -> TurnValidator | None:
    """Validate what a backend returned for ``session_id``; raise on the first defect.

    With ``whole`` (the default), ``events`` is the entire stored log from seq 0: the turn rules, the cut and the
    header are checked too, and the validator that walked the log is returned so a caller can continue it over
    repair closers without walking the log again. Without it (storage-only reads such as ``read_from``, or a
    seek read's suffix starting at ``start``) only identity, version, contiguity and unknown types are checked,
    and ``None`` is returned.
    """
    if meta.id != session_id:
        raise corruption(
            session_id,
            ValueError(f'stored session identity mismatch: requested "{session_id}", header contains "{meta.id}"'),
        )
    check_format_version(session_id, meta.version, location)
    validator = _one_pass(events) if whole and start == 0 else None
    if validator is None:
        # The checks one by one, in their order (also what decides and names a defect the one pass declined).
        try:
            check_contiguous(events, start)
            if whole:
                validator = validate_turns(events)
        except Exception as exc:
            raise corruption(session_id, exc) from exc
        refuse_unknown_events(session_id, events, location)
    if whole:
        try:
            _check_cut(session_id, cut, len(events))
            header_from_builtins(header_to_builtins(meta), expected_id=session_id)
        except Exception as exc:
            raise corruption(session_id, exc) from exc
    return validator
