"""The live session and the session store (session-core §2.4).

A :class:`Session` is an append-only, in-memory event log: ``append`` validates and copies the payload through
the lossless JSON boundary, assigns ``seq = len(log)`` and ``time``, commits, and only then notifies
``session_event`` observers (each isolated: a failing observer never undoes the append). The
:class:`SessionStore` owns the live sessions of one host and emits the lifecycle hooks.
"""

from __future__ import annotations

import itertools
import time as _time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from msgspec import UNSET

from .._model.errors import (
    EventValidationError,
    ReentrantAppendError,
    SessionAlreadyExistsError,
    SessionLifecycleError,
)
from .._model.events import (
    AssistantChunk,
    AssistantMessage,
    EndSeed,
    EndSeedData,
    EpochHeader,
    Message,
    RequestHeader,
    SessionEvent,
    ToolReconcile,
    ToolResult,
    UserMessage,
)
from .._model.header import SESSION_FORMAT_VERSION, SessionHeader, header_from_builtins, header_to_builtins
from .._model.ids import check_session_id
from .._model.jsonvalue import MAX_SAFE_INTEGER, is_safe_int, snapshot_json, snapshot_record
from .._model.repair import has_open_turn
from .._model.validator import TurnValidator, validate_turns
from .._wire.codec import build_event, decode_event, event_to_builtins
from .._wire.delta_chunks import delta_chunk_data
from .fork import SessionForkError, fork_seed
from .gather import Settled, gather_settled
from .reconcile import substitute_finding

if TYPE_CHECKING:
    from .host import Host

__all__ = ["Clock", "Session", "SessionStore", "wall_clock_ms"]

Clock = Callable[[], int]


def wall_clock_ms() -> int:
    """Wall-clock epoch milliseconds (not monotonic: the wall clock may step back)."""
    return _time.time_ns() // 1_000_000


def _header_from(meta: SessionHeader | dict[str, Any] | None, session_id: str, clock: Clock) -> SessionHeader:
    check_session_id(session_id)
    if meta is None:
        return SessionHeader(id=session_id, created_at=clock())
    obj = header_to_builtins(meta) if isinstance(meta, SessionHeader) else dict(meta)
    obj.setdefault("version", SESSION_FORMAT_VERSION)
    obj.setdefault("id", session_id)
    obj.setdefault("createdAt", clock())
    return header_from_builtins(obj, expected_id=session_id)


def _seed_event(value: SessionEvent | dict[str, Any], index: int) -> SessionEvent:
    if isinstance(value, dict):
        value = snapshot_json(value, f"seed event at index {index}")  # type: ignore[assignment]
        try:
            event = decode_event(value)
        except EventValidationError as exc:
            raise EventValidationError(f"invalid seed event at index {index}: {exc}") from exc
    else:
        event = value
    if event.seq != index:
        raise EventValidationError(
            f"seed event at index {index} has seq {event.seq}: seed seqs must be contiguous from 0"
        )
    return event


class Session:
    """One live, append-only session log.

    ``events`` is an immutable snapshot (a tuple of frozen events) that does not grow after later appends.
    ``first_live_seq`` counts the events that came from the constructor seed (never published to observers).
    """

    def __init__(
        self,
        session_id: str | None = None,
        *,
        header: SessionHeader | dict[str, Any] | None = None,
        seed: Sequence[SessionEvent | dict[str, Any]] | None = None,
        inherited_event_count: int | None = None,
        clock: Clock = wall_clock_ms,
        check_turns: bool = False,
    ) -> None:
        if session_id is None:
            if isinstance(header, SessionHeader):
                session_id = header.id
            elif isinstance(header, dict) and isinstance(header.get("id"), str):
                session_id = header["id"]
            else:
                raise TypeError("a Session needs an id (or a header carrying one)")
        self._clock = clock
        self._header = _header_from(header, session_id, clock)
        self._events: list[SessionEvent] = []
        self._snapshot: tuple[SessionEvent, ...] | None = ()
        self._publishing = False
        self._observer: Callable[[Session, SessionEvent], None] | None = None
        self._request_header: EpochHeader | None = None
        self._messages: list[Message] | None = None
        self._validator: TurnValidator | None = None
        self._inherited = self._check_cut(inherited_event_count, seed)
        validator = TurnValidator()
        if seed is None:
            self._first_live_seq = 0
        else:
            events = [_seed_event(value, i) for i, value in enumerate(seed)]
            validator.check_all(events)
            self._events = events
            self._first_live_seq = len(events)
            if not events or type(events[-1]) is not EndSeed:
                # The seed marker is written before any observer attaches, so it is never published.
                marker = EndSeed(seq=len(events), time=self._clock(), data=EndSeedData())
                self._events.append(marker)
                validator.check(marker)
            self._snapshot = None
        # The state after the seed (and how many events it has seen), kept so that turning the checks on before the
        # first append walks nothing again.
        self._seed_state: tuple[int, TurnValidator] | None = (len(self._events), validator)
        if check_turns:
            self.enforce_turn_rules()

    def enforce_turn_rules(self) -> None:
        """From now on refuse (``TurnInvariantError``, nothing appended) an event that breaks the turn/step rules.

        The rules are the loader's, checked incrementally (O(1) per event). A persistence coordinator calls this
        when it takes the session: what it acknowledges must load. Idempotent; the first call walks the events
        appended since the seed (none, when the coordinator is there from the start) and raises
        ``TurnInvariantError`` if they already break a rule.
        """
        if self._validator is not None:
            return
        seeded, self._seed_state = self._seed_state, None
        if seeded is not None and seeded[0] == len(self._events):  # the log is still the seed (a prefix is kept)
            self._validator = seeded[1]
        else:
            self._validator = validate_turns(self._events)

    @property
    def checks_turns(self) -> bool:
        """Whether an append that breaks the turn/step rules is refused (see :meth:`enforce_turn_rules`)."""
        return self._validator is not None

    def _check_cut(self, count: int | None, seed: Sequence[object] | None) -> int:
        if self._header.is_seeded:
            if seed is None:
                raise ValueError("seeded session requires an explicit constructor seed")
            if count is None:
                raise ValueError("seeded session requires an inherited event count")
            if not is_safe_int(count) or count < 0:
                raise TypeError(f"SessionLogOffset must be a non-negative safe integer, got {count!r}")
            if count > len(seed):
                raise ValueError("session inherited event count exceeds its event log")
            return count
        if count not in (None, 0) or (count is not None and not is_safe_int(count)):
            raise ValueError("unseeded session inherited event count must be 0")
        return 0

    # ----------------------------------------------------------------------------------------------------------
    # Read side

    @property
    def id(self) -> str:
        return self._header.id

    @property
    def header(self) -> SessionHeader:
        return self._header

    @property
    def inherited_event_count(self) -> int:
        """How many leading events were inherited from a fork parent (0 for an unseeded session)."""
        return self._inherited

    @property
    def first_live_seq(self) -> int:
        """Number of events that came from the constructor seed (in-process only, never persisted)."""
        return self._first_live_seq

    @property
    def seq(self) -> int:
        """The next seq, always ``len(events)``."""
        return len(self._events)

    @property
    def events(self) -> tuple[SessionEvent, ...]:
        """An immutable snapshot of the log."""
        snap = self._snapshot
        if snap is None:
            snap = self._snapshot = tuple(self._events)
        return snap

    def events_from(self, start: int) -> tuple[SessionEvent, ...]:
        """The events with ``seq >= start``, as an immutable tuple (empty past the end).

        Copies only that tail: for a reader that wants what a turn or a step appended, where :attr:`events` would
        build a snapshot of the whole log after every append.
        """
        if not is_safe_int(start) or start < 0:
            raise TypeError(f"SessionLogOffset must be a non-negative safe integer, got {start!r}")
        snap = self._snapshot
        if snap is not None:
            return snap[start:]
        return tuple(self._events[start:])

    def __len__(self) -> int:
        return len(self._events)

    def has_open_turn(self) -> bool:
        """Whether the last turn boundary is a ``turn/start``."""
        return has_open_turn(self._events)

    def request_header(self) -> EpochHeader | None:
        """The request header in force: the last ``request/header`` snapshot in the log."""
        if self._request_header is None:
            for event in reversed(self._events):
                if type(event) is RequestHeader:
                    self._request_header = event.data.header
                    break
        return self._request_header

    def derive_messages(self) -> list[Message]:
        """The model-visible history: every surface event projected to its message, in order."""
        if self._messages is None:
            self._messages = []
            for event in self._events:
                self._project(event)
        return list(self._messages)

    def _project(self, event: SessionEvent) -> None:
        assert self._messages is not None
        if isinstance(event, UserMessage):
            self._messages.append(event.data)
        elif isinstance(event, AssistantMessage):
            message = event.data.message
            if message.content:
                self._messages.append(message)
        elif isinstance(event, ToolResult):
            self._messages.append(event.data.message)
        elif type(event) is ToolReconcile:
            substitute_finding(self._messages, self._events, event)

    # ----------------------------------------------------------------------------------------------------------
    # Write side

    def append(
        self,
        event_type: str,
        data: object,
        *,
        source_event_seqs: Iterable[int] | None = None,
        ignorable: bool = False,
    ) -> SessionEvent:
        """Append one event and return it as stored.

        Surface types (``user/message``, ``assistant/message``, ``tool/result``) get ``surfaceOp: "append"``.
        A failure before the commit leaves the log unchanged; after the commit the append is final and observer
        failures are logged by the host, never raised here.
        """
        if event_type == "assistant/chunk" and source_event_seqs is None and not ignorable and not self._publishing:
            # A streamed delta (most appends) is built straight from ``data``; anything else takes the path below.
            chunk_data = delta_chunk_data(data)
            if chunk_data is not None:
                seq = len(self._events)
                time = self._clock()
                if type(time) is int and -MAX_SAFE_INTEGER <= time <= MAX_SAFE_INTEGER:
                    chunk: SessionEvent = AssistantChunk(seq=seq, time=time, data=chunk_data)
                else:  # a clock gone wrong: the general build names it (the clock is read once either way)
                    chunk = build_event(event_type, seq, time, snapshot_json(data), None, False)
                self._commit(chunk)
                return chunk
        payload: Any = snapshot_record(data)  # the usual dict payload, copied without building the label below
        if payload is None:
            payload = snapshot_json(data, f'session event "{event_type}" data')
        seqs: list[Any] | None = None
        if source_event_seqs is not None:
            seqs = list(source_event_seqs)
            snapshot_json(seqs, f'session event "{event_type}" surface metadata')
        if self._publishing:
            raise ReentrantAppendError("session append cannot reenter while another append is being published")
        # The same event (or error) as decode_event of the append's envelope, without building and re-checking it.
        event = build_event(event_type, len(self._events), self._clock(), payload, seqs, ignorable)
        self._commit(event)
        return event

    def append_event(self, event: SessionEvent) -> SessionEvent:
        """Append a ready-made event (its ``seq`` must be the next seq); used by loops and repair tools."""
        if event.seq != len(self._events):
            raise EventValidationError(f"event seq {event.seq} does not match the next seq {len(self._events)}")
        if self._publishing:
            raise ReentrantAppendError("session append cannot reenter while another append is being published")
        self._commit(event)
        return event

    def _commit(self, event: SessionEvent) -> None:
        validator = self._validator
        if validator is not None:
            validator.check(event)
        self._events.append(event)
        self._snapshot = None
        if type(event) is RequestHeader:
            self._request_header = event.data.header
        if self._messages is not None:  # the projection is kept only once derive_messages built it
            self._project(event)
        observer = self._observer
        if observer is not None:
            self._publishing = True
            try:
                observer(self, event)
            finally:
                self._publishing = False

    def truncate(self, length: int) -> None:
        """Cut the live log to ``length`` events (after the backend has durably rewritten it)."""
        if not is_safe_int(length) or length < 0:
            raise TypeError(f"SessionLogOffset must be a non-negative safe integer, got {length!r}")
        if length > len(self._events) or length < self._inherited:
            raise ValueError(f"session truncation length {length} is outside the writable log prefix")
        del self._events[length:]
        self._snapshot = None
        self._request_header = None
        self._messages = None
        if self._validator is not None:
            self._validator = validate_turns(self._events)

    def to_builtins(self) -> list[dict[str, Any]]:
        """The log as plain JSON objects."""
        return [event_to_builtins(e) for e in self._events]

    def __repr__(self) -> str:
        return f"<Session {self.id!r} events={len(self._events)}>"


class SessionStore:
    """The live sessions of one host; emits ``session_created``/``session_event``/``session_disposed``."""

    def __init__(self, host: Host, *, clock: Clock = wall_clock_ms, check_turns: bool = False) -> None:
        self._host = host
        self._clock = clock
        self._check_turns = check_turns
        self._sessions: dict[str, Session] = {}
        self._counter = itertools.count(1)
        host.sessions = self

    @property
    def host(self) -> Host:
        return self._host

    def create(
        self,
        session_id: str | None = None,
        *,
        seed: Sequence[SessionEvent | dict[str, Any]] | None = None,
        meta: SessionHeader | dict[str, Any] | None = None,
        inherited_event_count: int | None = None,
    ) -> Session:
        """Create, publish and return a live session.

        A ``session_created`` implementation that raises vetoes the publication: the session is removed again,
        the paired ``session_disposed`` is emitted, and the error propagates.
        """
        if session_id is None:
            if isinstance(meta, SessionHeader):
                session_id = meta.id
            elif isinstance(meta, dict) and isinstance(meta.get("id"), str):
                session_id = meta["id"]
        if session_id is None:
            session_id = next(f"session-{n}" for n in self._counter if f"session-{n}" not in self._sessions)
        if session_id in self._sessions:
            raise SessionAlreadyExistsError(f'session "{session_id}" already exists')
        session = Session(
            session_id,
            header=meta,
            seed=seed,
            inherited_event_count=inherited_event_count,
            clock=self._clock,
            check_turns=self._check_turns,
        )
        return self.publish(session)

    def publish(self, session: Session) -> Session:
        """Make an unpublished ``Session`` live in this store (used by resume)."""
        if session.id in self._sessions:
            raise SessionAlreadyExistsError(f'session "{session.id}" already exists')
        self._sessions[session.id] = session
        session._observer = self._host.session_event  # called once per appended event, directly
        try:
            self._host.session_created(session)
        except BaseException:
            self._sessions.pop(session.id, None)
            session._observer = None
            self._host.session_disposed(session)
            raise
        return session

    def get(self, session_id: str) -> Session | None:
        """The live session with this id, if any."""
        return self._sessions.get(session_id)

    def list(self) -> list[Session]:
        """Live sessions in creation order."""
        return list(self._sessions.values())

    def is_live(self, session: Session) -> bool:
        """Whether ``session`` is the live instance for its id in this store."""
        return self._sessions.get(session.id) is session

    def _require_live(self, session: Session) -> None:
        if not self.is_live(session):
            raise SessionLifecycleError(f'session "{session.id}" is not live in this store')

    async def flush(self, session: Session) -> bool:
        """The durability barrier: run every ``session_flush`` implementation concurrently.

        Waits for all of them, then raises the failure of the first-registered failing implementation.
        Returns whether any implementation ran.
        """
        self._require_live(session)
        awaitables = self._host.session_flush(session)
        if len(awaitables) == 1:
            await awaitables[0]  # one implementation (one persistence backend): its own outcome, nothing to gather
            return True
        if not awaitables:
            return False
        if sum(type(awaitable) is not Settled for awaitable in awaitables) <= 1:
            # Every implementation but at most one has settled already (it returned None or raised): awaiting them in
            # order is awaiting them concurrently, and no task is started for the one that runs.
            first: Exception | None = None
            for awaitable in awaitables:
                try:
                    await awaitable
                except Exception as exc:
                    if first is None:
                        first = exc
            if first is not None:
                raise first
            return True
        errors = await gather_settled(awaitables)
        for error in errors:
            if error is not None:
                raise error
        return True

    def dispose(self, session: Session) -> None:
        """Retire a live session; ``session_disposed`` implementations run the final drain."""
        self._require_live(session)
        del self._sessions[session.id]
        session._observer = None
        self._host.session_disposed(session)

    def fork(self, source: Session | str, boundary: int | None = None, child_id: str | None = None) -> Session:
        """Create a child session seeded with ``source``'s events up to and including ``boundary``.

        The child's header is seeded (``isSeeded``) and its inherited cut is the seed length.
        """
        if child_id is not None and child_id in self._sessions:
            raise SessionAlreadyExistsError(f'session "{child_id}" already exists')
        live = self._resolve(source)
        seed = fork_seed(live, boundary)
        meta: dict[str, Any] = {"parentSession": live.id, "isSeeded": True}
        if live.header.cwd is not UNSET:
            meta["cwd"] = live.header.cwd
        return self.create(child_id, seed=seed, meta=meta, inherited_event_count=len(seed))

    def _resolve(self, source: Session | str) -> Session:
        if isinstance(source, str):
            live = self._sessions.get(source)
            if live is None:
                raise SessionForkError(f'session "{source}" not found', "SESSION_NOT_FOUND")
            return live
        live = self._sessions.get(source.id)
        if live is None:
            raise SessionForkError(f'session "{source.id}" not found', "SESSION_NOT_FOUND")
        if live is not source:
            raise SessionForkError(f'session "{source.id}" is not the live store instance', "SESSION_NOT_LIVE")
        return live
