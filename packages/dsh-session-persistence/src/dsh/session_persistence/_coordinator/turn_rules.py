"""The turn rules on the coordinator's own ``append`` (a batch for a cold id): the loader's validator, incremental.

A live Session checks its own appends once a coordinator holds it (``Session.enforce_turn_rules``). A batch handed
to ``PersistenceCoordinator.append`` is checked here, against the validator state at the stored end, before the
durable write: a batch the loader would refuse is refused (``TurnInvariantError``) and nothing is written. The state
after a write is kept per id, so consecutive batches cost their own events only; it is trusted only for the same
bookkeeping object at the same stored length, and otherwise rebuilt once from the stored log.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._model.events import SessionEvent
from .._model.validator import TurnValidator, validate_turns
from .state import CoordinatorCore, SessionState

__all__ = ["ColdTurnRules"]


class ColdTurnRules:
    """Per id: the validator state at the stored end, as of the last batch this coordinator appended."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[SessionState, int, TurnValidator]] = {}

    async def check(
        self, core: CoordinatorCore, session_id: str, state: SessionState, batch: Sequence[SessionEvent]
    ) -> TurnValidator | None:
        """Check ``batch`` as the continuation of the stored log; the validator after it, or ``None`` when the
        batch does not continue the stored end (the durable write refuses it, or acknowledges an unchanged retry,
        and writes nothing new either way)."""
        kept = self._kept.pop(session_id, None)  # whatever happens next, the state moves or is rebuilt
        if not batch or batch[0].seq != state.cursor:
            return None
        if kept is not None and kept[0] is state and kept[1] == state.cursor:
            validator = kept[2]
        elif state.cursor == 0:
            validator = TurnValidator()
        else:
            stored = await core.backend.load_stored(session_id)
            if stored is None or len(stored.events) != state.cursor:
                return None  # the durable write's own checks decide
            validator = validate_turns(stored.events)
        validator.check_all(batch)
        return validator

    def keep(self, session_id: str, state: SessionState, validator: TurnValidator | None) -> None:
        """Remember ``validator`` as the state at ``state.cursor`` after a write that stored its batch."""
        if validator is not None:
            self._kept[session_id] = (state, state.cursor, validator)
