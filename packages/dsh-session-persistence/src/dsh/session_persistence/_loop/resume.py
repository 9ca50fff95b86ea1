"""After a crash: reconcile unknown outcomes, then continue the interrupted turn (the loop's resume half).

Crash repair (``load``) closes the cut turn ``interrupted`` and answers each unfinished call honestly; nothing of it
changes here. On top of the balanced log:

* :meth:`ResumeSteps.reconcile` asks every tool that offers ``reconcile(arguments, call_id)`` what became of each
  of its ``TOOL_OUTCOME_UNKNOWN`` calls and records each answer as an ignorable ``tool/reconcile`` event (made
  durable before the next model request);
* :meth:`ResumeSteps.continue_interrupted` runs a new turn that says, in an ignorable ``turn/continue`` right after
  its ``turn/start``, which interrupted turn it carries on; its first step needs no user message.

Both new types are written ``ignorable``, so a 0.2 reader loads and validates the log and simply does not see them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._host.reconcile import DEFAULT_RECONCILE_TIMEOUT_S, reconcile_data, reconciler_of, run_check, unknown_calls
from .._model.errors import NoInterruptedTurnError
from .._model.events import InterruptedReason, Message, ToolReconcile, TurnEnd, TurnStart

if TYPE_CHECKING:
    from .._host.boundaries import CancelSignal
    from .._host.session import Session, SessionStore
    from .protocols import Tool
    from .turn_result import TurnResult

__all__ = ["ResumeSteps", "answer_pending"]


def answer_pending(messages: Sequence[Message]) -> bool:
    """Whether the model owes an answer: the last model-visible message is not the model's own.

    The step a continuation runs is derived from this: after tool results (real, repaired or reconciled) or a user
    message the model is asked again; after an assistant message the cut turn had its answer, and the continuation
    ends ``completed`` without a request. A turn cut before its user message was durable has nothing to answer.
    """
    return bool(messages) and messages[-1].role != "assistant"


class ResumeSteps:
    """The resume part of :class:`~dsh.session_persistence.loop.AgentLoop` (a mixin holding no state)."""

    store: SessionStore
    tools: dict[str, Tool]
    _session: Session
    _signal: CancelSignal | None

    @property
    def interrupted_turn(self) -> int | None:
        """The number of the last turn if crash repair closed it (``interrupted``), else ``None``."""
        for event in reversed(self._session.events):
            if type(event) is TurnEnd:
                return event.data.turn if type(event.data.reason) is InterruptedReason else None
            if type(event) is TurnStart:
                return None
        return None

    async def reconcile(self, *, timeout: float = DEFAULT_RECONCILE_TIMEOUT_S) -> list[ToolReconcile]:
        """Check each unconcluded ``TOOL_OUTCOME_UNKNOWN`` call of a tool that offers ``reconcile``; record findings.

        Each check gets the call's parsed arguments and its call id and at most ``timeout`` seconds; one that
        raises, hangs or answers anything but a :class:`Reconciliation` counts as "cannot tell". Every finding is
        appended as a ``tool/reconcile`` event and the session is flushed before this returns, so the model's
        next request sees it: ``happened`` / ``not-happened`` replace the unknown-outcome text of that call,
        "cannot tell" keeps it. A call that did not happen is never re-run here. :meth:`resume` calls this.
        Returns the recorded events (none when no tool offers a check or nothing is unknown).
        """
        if self._signal is not None or self._session.has_open_turn():
            raise RuntimeError(f'session "{self._session.id}" has a turn in progress: reconcile between turns')
        recorded: list[ToolReconcile] = []
        for call in unknown_calls(self._session.events):
            tool = self.tools.get(call.name)
            check = reconciler_of(tool) if tool is not None else None
            if check is None:
                continue
            finding = await run_check(check, call, timeout)
            data = reconcile_data(call, finding, len(self._session.events))
            event = self._session.append("tool/reconcile", data, ignorable=True)
            assert isinstance(event, ToolReconcile)
            recorded.append(event)
        if recorded:
            await self.store.flush(self._session)
        return recorded

    async def continue_interrupted(self) -> TurnResult:
        """Carry on the turn a crash cut, without a new user message; returns the new turn's :class:`TurnResult`.

        The new turn starts with ``turn/start`` then ``turn/continue {interruptedTurn}``; its first step asks the
        model again when it owes an answer (see :func:`answer_pending`), then the turn runs and ends as any turn
        does. A crash inside it is repaired like any other; call this again to continue that turn in turn.
        ``NoInterruptedTurnError`` if the last turn did not end ``interrupted``.
        """
        interrupted = self.interrupted_turn
        if interrupted is None:
            raise NoInterruptedTurnError(
                f'session "{self._session.id}" has no interrupted turn to continue (its last turn did not end '
                "interrupted)"
            )
        return await self._run(None, interrupted)

    if TYPE_CHECKING:  # implemented by AgentLoop (runs one turn; ``continues``: the interrupted turn it carries on)

        async def _run(self, messages: Any, continues: int | None) -> TurnResult: ...
