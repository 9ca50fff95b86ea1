"""``export --salvage``: of a damaged log, the committed events before the first damage, with a warning.

An intact log exports exactly as without ``--salvage``. A damaged one is read through the backend's salvage
primitive (``SupportsSalvage``: decodable events before the first defect), then cut again before the first
event that breaks the turn rules, so what comes out is a log prefix every reader accepts.
"""

from __future__ import annotations

from .._backends.protocol import SupportsSalvage
from .._coordinator.service import PersistenceCoordinator
from .._model.errors import SessionNotFoundError, SessionPersistenceCorruptionError
from .._model.events import SessionEvent
from .._model.validator import TurnValidator
from ._errors import EXIT_DAMAGED, CliError
from ._io import Io

__all__ = ["salvage_events"]


def _valid_prefix(events: list[SessionEvent]) -> tuple[list[SessionEvent], str | None]:
    validator = TurnValidator()
    for index, event in enumerate(events):
        try:
            validator.check(event)
        except ValueError as exc:
            return events[:index], f"event seq {event.seq} breaks the turn rules: {exc}"
    return events, None


async def salvage_events(
    coordinator: PersistenceCoordinator, session_id: str, io: Io, *, backend_name: str
) -> list[SessionEvent]:
    """The events to export: ``inspect``'s view when the log is intact, else the salvaged prefix (warned).

    ``backend_name`` is the backend's name on the command line, for the refusal when it cannot salvage.
    """
    try:
        return list((await coordinator.inspect(session_id)).events)
    except SessionPersistenceCorruptionError as exc:
        damage = str(exc)
    backend = coordinator.backend
    if not isinstance(backend, SupportsSalvage):
        raise CliError(f'{damage} (the "{backend_name}" backend cannot salvage a damaged log)', EXIT_DAMAGED)
    salvaged = await backend.load_salvage(session_id)
    if salvaged is None:
        raise SessionNotFoundError(session_id)
    events, broken = _valid_prefix(salvaged.events)
    reason = broken or salvaged.damage or damage
    io.err.write(
        f"dsh-sessions: warning: session {session_id} is damaged ({' '.join(reason.split())}); exported the "
        f"{len(events)} event(s) before the first damage, nothing after it, and no repair closers\n"
    )
    io.err.flush()
    return events
