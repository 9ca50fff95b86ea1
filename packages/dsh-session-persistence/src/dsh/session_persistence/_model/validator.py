"""The incremental turn/step validator (session-core §2.2): O(1) per event.

The one definition of the turn rules: the loader runs it over every stored log (and seed), and a live session
runs the same state machine on every append once a persistence coordinator holds it (or its store was built with
``check_turns=True``), so an event the loader would refuse is refused before it is written. The invariant
companion runs it to report instead. Crash-repair output always satisfies it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from msgspec import UNSET, UnsetType

from .codes import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN
from .errors import TurnInvariantError
from .events import (
    AssistantChunk,
    AssistantMessage,
    InterruptedReason,
    OpaqueEvent,
    RequestContext,
    RequestHeader,
    SessionEvent,
    StepEnd,
    StepStart,
    TodoWrite,
    ToolCall,
    ToolReconcile,
    ToolResult,
    ToolResultBlock,
    ToolSource,
    TurnContinue,
    TurnEnd,
    TurnStart,
)

__all__ = ["TurnValidator", "validate_turns"]


class PackedSegment(Protocol):
    """What the one-pass check reads of a packed chunk run (``StoredEvents``' ``PackedRun``): its first member's
    seq, the turn and step every member names, and how many members it has."""

    seq0: int
    turn: int
    step: int
    count: int


class TurnValidator:
    """Checks one event at a time against the turn/step rules; raises :class:`TurnInvariantError`."""

    __slots__ = (
        "_fresh_turn",
        "_last_interrupted",
        "_last_seq",
        "_next_step",
        "_next_turn",
        "_open_step",
        "_open_turn",
        "_pending",
        "_unknown",
    )

    def __init__(self) -> None:
        self._open_turn: int | None = None
        self._open_step: int | None = None
        self._next_turn = 1
        self._next_step = 1
        self._pending: set[str] = set()
        self._last_seq = -1
        self._fresh_turn = False  # the previous event was turn/start (a turn/continue must come right after it)
        self._last_interrupted = False  # the last closed turn ended interrupted (only such a turn is continued)
        self._unknown: dict[str, int] = {}  # call id -> seq of its unconcluded TOOL_OUTCOME_UNKNOWN result

    @property
    def open_turn(self) -> int | None:
        """The open turn number, or ``None`` between turns."""
        return self._open_turn

    def check(self, event: SessionEvent) -> None:
        """Validate ``event`` against the state so far and advance the state.

        O(1): one type lookup picks the event's rule (types without one only advance the seq). The live append
        path runs this on every event, so the common cases stay a few comparisons.
        """
        seq = event.seq
        if seq <= self._last_seq:
            self._fail("seq-order", seq, f"event seq {seq} is not greater than the previous seq {self._last_seq}")
        if type(event) is AssistantChunk:  # most events of a streamed log: two comparisons when it is in its step
            chunk_data = event.data
            if chunk_data.turn != self._open_turn or chunk_data.step != self._open_step:
                self._require_step(seq, "assistant/chunk", chunk_data.turn, chunk_data.step)
        else:
            kind = type(event)
            rule = _RULES.get(kind, _UNRESOLVED)
            if rule is _UNRESOLVED:
                rule = _rule_for(kind)
            if rule is not None:
                rule(self, event)
        self._last_seq = seq
        self._fresh_turn = type(event) is TurnStart

    def _turn_start(self, event: TurnStart) -> None:
        turn = event.data.turn
        if self._open_turn is not None:
            self._fail("turn-open", event.seq, f"turn/start {turn} while turn {self._open_turn} is still open")
        if turn != self._next_turn:
            self._fail("turn-number", event.seq, f"turn/start expected turn {self._next_turn}, got {turn}")
        self._open_turn = turn
        self._next_step = 1
        self._pending.clear()

    def _turn_end(self, event: TurnEnd) -> None:
        turn, seq = event.data.turn, event.seq
        if turn != self._open_turn:
            self._fail("turn-end", seq, f"turn/end {turn} does not match open turn {self._open_turn}")
        if self._open_step is not None:
            self._fail("turn-end-step", seq, f"turn/end {turn} while step {self._open_step} is still open")
        self._open_turn = None
        self._next_turn += 1
        self._pending.clear()
        self._last_interrupted = type(event.data.reason) is InterruptedReason

    def _step_start(self, event: StepStart) -> None:
        step_data, seq = event.data, event.seq
        self._require_turn(seq, "step/start", step_data.turn)
        if self._open_step is not None:
            self._fail("step-open", seq, f"step/start {step_data.step} while step {self._open_step} is still open")
        if step_data.step != self._next_step:
            self._fail("step-number", seq, f"step/start expected step {self._next_step}, got {step_data.step}")
        self._open_step = step_data.step

    def _step_end(self, event: StepEnd) -> None:
        self._require_step(event.seq, "step/end", event.data.turn, event.data.step)
        self._open_step = None
        self._next_step += 1
        self._pending.clear()

    def _in_step(self, event: AssistantChunk | AssistantMessage) -> None:
        self._require_step(event.seq, event.type, event.data.turn, event.data.step)

    def _tool_call(self, event: ToolCall) -> None:
        self._require_step(event.seq, "tool/call", event.data.turn, event.data.step)
        self._pending.add(event.data.call_id)

    def _tool_result(self, event: ToolResult) -> None:
        result, seq = event.data, event.seq
        self._require_step(seq, "tool/result", result.turn, result.step)
        call_id = getattr(result.message.source, "call_id", None)
        synthetic_not_started = getattr(result.error, "code", None) == TOOL_NOT_STARTED
        if call_id in self._pending:
            self._pending.discard(call_id)
        elif not synthetic_not_started:
            self._fail("result-without-call", seq, f'tool/result for "{call_id}" has no pending tool/call')
        if isinstance(call_id, str) and getattr(result.error, "code", None) == TOOL_OUTCOME_UNKNOWN:
            self._unknown[call_id] = seq

    def _in_turn(self, event: RequestHeader | RequestContext | TodoWrite) -> None:
        if self._open_turn is None:
            self._fail("outside-turn", event.seq, f"{event.type} outside an open turn")

    def _check_continue(self, event: TurnContinue) -> None:
        seq, data = event.seq, event.data
        if not self._fresh_turn:
            self._fail("continue-position", seq, "turn/continue must come right after its turn/start")
        if data.turn != self._open_turn:
            self._fail(
                "continue-turn", seq, f"turn/continue names turn {data.turn} but the open turn is {self._open_turn}"
            )
        if data.interrupted_turn != data.turn - 1 or not self._last_interrupted:
            self._fail(
                "continue-target",
                seq,
                f"turn/continue of turn {data.interrupted_turn}: only the turn just before ({data.turn - 1}) may be "
                "continued, and only if it ended interrupted",
            )

    def _check_reconcile(self, event: ToolReconcile) -> None:
        seq, data = event.seq, event.data
        if self._open_turn is not None:
            self._fail("reconcile-in-turn", seq, f"tool/reconcile while turn {self._open_turn} is open")
        if self._unknown.get(data.call_id) != data.result_seq:
            self._fail(
                "reconcile-target",
                seq,
                f'tool/reconcile of "{data.call_id}" names seq {data.result_seq}, which is not its unconcluded '
                "unknown-outcome result",
            )
        message = data.message
        if data.outcome == "unknown":
            if message is not UNSET:
                self._fail("reconcile-message", seq, "tool/reconcile outcome unknown must not carry a message")
            return
        blocks = () if isinstance(message, UnsetType) else message.content
        if (
            isinstance(message, UnsetType)
            or message.role != "user"
            or message.source != ToolSource(call_id=data.call_id)
            or len(blocks) != 1
            or not isinstance(blocks[0], ToolResultBlock)
            or blocks[0].tool_call_id != data.call_id
        ):
            self._fail(
                "reconcile-message",
                seq,
                f'tool/reconcile outcome {data.outcome} must carry one tool-result message answering "{data.call_id}"',
            )
        del self._unknown[data.call_id]

    def check_all(self, events: Iterable[SessionEvent]) -> None:
        """:meth:`check` every event in order (same result; runs of ``assistant/chunk`` take an inlined path)."""
        check = self.check
        for event in events:
            if type(event) is AssistantChunk:
                # What check() does for a chunk in the passing case; anything else goes through check() itself,
                # which leaves the state untouched until it has passed and raises the exact error.
                data = event.data
                open_step = self._open_step
                seq = event.seq
                if (
                    seq > self._last_seq
                    and open_step is not None
                    and data.step == open_step
                    and self._open_turn is not None
                    and data.turn == self._open_turn
                ):
                    self._last_seq = seq
                    continue
            check(event)

    def _check_log(self, events: Iterable[Any], run: type[PackedSegment] | None = None) -> bool:
        """:meth:`check_all` over a whole stored log in the same pass as its seq contiguity and its event types.

        ``events``: the log's events in order, or its segments, where an item of type ``run`` is a packed chunk run
        (a ``StoredEvents``' ``_segments()`` with ``PackedRun``: the caller that holds one says so, and this layer
        needs no import of theirs).

        ``True``: ``events`` carry the seqs ``0, 1, ...``, hold no ``OpaqueEvent`` and pass the turn rules (the
        state then continues after the last event, as after :meth:`check_all`). ``False``, or a raised
        :class:`TurnInvariantError`, when any of that does not hold: the state is then undefined and the caller
        runs the separate checks in their order, which decide and name the defect. A fast path only: a stored
        log is walked once instead of three times, and each pass over a large log's events costs milliseconds.
        """
        expected = self._last_seq + 1
        if expected != 0:
            return False  # only a fresh validator: the contiguity is from seq 0
        open_step = self._open_step
        open_turn = self._open_turn
        rules = _RULES
        # A packed chunk run is checked as one unit, without building its events. Its members are contiguous
        # ``assistant/chunk`` events of one turn and step from ``seq0``, so the rules each member would meet are the
        # first member's: its seq, and the open turn and step. A run that is not in the open step returns ``False``
        # (its first member would fail), and the separate checks, which expand it, name the defect exactly as for
        # the expanded log. (Items typed Any: ``type(x) is`` is the cheap test, and it does not narrow a union.)
        for event in events:
            if type(event) is run:
                if (
                    event.seq0 != expected
                    or open_step is None
                    or event.step != open_step
                    or open_turn is None
                    or event.turn != open_turn
                ):
                    return False
                expected += event.count
                continue
            seq = event.seq
            if seq != expected:
                return False
            expected = seq + 1
            kind = type(event)
            if type(event) is AssistantChunk:  # (not `kind is`: that does not narrow the event's type)
                data = event.data
                # What check() does for a chunk in the passing case (seq order holds: the seqs are contiguous).
                if (
                    open_step is not None
                    and data.step == open_step
                    and open_turn is not None
                    and data.turn == open_turn
                ):
                    continue
            elif kind is OpaqueEvent:
                return False
            # What check() does past its seq order (which contiguity already proved): the event's rule, then the
            # turn/start memory; no rule reads the last seq, set once at the end.
            rule = rules.get(kind, _UNRESOLVED)
            if rule is _UNRESOLVED:
                rule = _rule_for(kind)
            if rule is not None:
                rule(self, event)
                open_step = self._open_step
                open_turn = self._open_turn
            self._fresh_turn = kind is TurnStart
        self._last_seq = expected - 1
        return True

    def _require_turn(self, seq: int, what: str, turn: int) -> None:
        if self._open_turn is None or turn != self._open_turn:
            self._fail("turn-mismatch", seq, f"{what} names turn {turn} but the open turn is {self._open_turn}")

    def _require_step(self, seq: int, what: str, turn: int, step: int) -> None:
        self._require_turn(seq, what, turn)
        if self._open_step is None or step != self._open_step:
            self._fail("step-mismatch", seq, f"{what} names step {step} but the open step is {self._open_step}")

    @staticmethod
    def _fail(rule: str, seq: int, message: str) -> None:
        raise TurnInvariantError(f"{message} (seq {seq}, rule {rule})", rule, seq)


#: The rule of each event type (exact type; a subclass finds its base's rule through :func:`_rule_for`). Types
#: without a rule (user messages, usage, opaque events...) only advance the seq.
_RULES: dict[type, Callable[[TurnValidator, Any], None] | None] = {
    TurnStart: TurnValidator._turn_start,
    TurnEnd: TurnValidator._turn_end,
    StepStart: TurnValidator._step_start,
    StepEnd: TurnValidator._step_end,
    AssistantChunk: TurnValidator._in_step,
    AssistantMessage: TurnValidator._in_step,
    ToolCall: TurnValidator._tool_call,
    ToolResult: TurnValidator._tool_result,
    TurnContinue: TurnValidator._check_continue,
    ToolReconcile: TurnValidator._check_reconcile,
    RequestHeader: TurnValidator._in_turn,
    RequestContext: TurnValidator._in_turn,
    TodoWrite: TurnValidator._in_turn,
}
_UNRESOLVED: Any = object()


def _rule_for(kind: type) -> Callable[[TurnValidator, Any], None] | None:
    """The rule of the nearest base of ``kind`` that has one (``None``: no rule), remembered for ``kind``."""
    rule = next((_RULES[base] for base in kind.__mro__ if base in _RULES), None)
    _RULES[kind] = rule
    return rule


def validate_turns(events: Iterable[SessionEvent]) -> TurnValidator:
    """Validate a whole log; returns the validator so callers can continue checking appended events."""
    validator = TurnValidator()
    validator.check_all(events)
    return validator
