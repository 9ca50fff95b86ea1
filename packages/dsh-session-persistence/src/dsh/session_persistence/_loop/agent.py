"""The reference agent loop: one live session, one model adapter, some tools, one turn at a time."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from .._coordinator.hooks import owners_of
from .._host.boundaries import (
    CancelSignal,
    PreStepDecision,
    PreStepInput,
    ToolExecution,
)
from .._host.reconcile import DEFAULT_RECONCILE_TIMEOUT_S
from .._model.errors import CheckpointPolicyMissingError, SessionIdCollisionError
from .._model.events import (
    Message,
    RequestContext,
    TextBlock,
    TurnEnd,
    TurnStart,
    UserSource,
)
from .latest import LatestOfType
from .model_step import ModelSteps
from .protocols import (
    DEFAULT_MAX_PARALLEL_TOOL_CALLS,
    LlmError,
    ModelAdapter,
    Tool,
    _abort_cause,
    _builtins,
    _error_text,
    _unwrap,
)
from .resume import ResumeSteps, answer_pending
from .runtime import runtime
from .tool_calls import ToolSteps, _Slot
from .tools import tool_spec
from .turn_result import TurnResult, turn_result

if TYPE_CHECKING:
    from .._host.host import Host
    from .._host.session import Session, SessionStore
    from .._model.views import SessionInspection

__all__ = ["AgentLoop", "Persistence"]


class Persistence(Protocol):
    """What the loop needs of a persistence coordinator (a :class:`PersistenceCoordinator` is one): the balanced
    view of a stored session, and a wait until a live session is bound to storage. The loop depends on this, not
    on the coordinator's service module, so the two stand side by side in the import graph."""

    async def load(self, session_id: str) -> SessionInspection: ...

    async def wait_ready(self, session: Session) -> None: ...


class AgentLoop(ToolSteps, ModelSteps, ResumeSteps):
    """A reference agent: one live session, one model adapter, some tools, one turn at a time.

    :param host: The plugin host (its ``SessionStore`` is ``store``).
    :param store: The session store; the loop's session lives there.
    :param adapter: The model adapter (:class:`ModelAdapter`).
    :param tools: The tools the model may call (:class:`Tool`), by their ``name``.
    :param provider: Provider name recorded in ``request/header``/``request/context`` (default: the adapter's
        ``provider`` attribute).
    :param model: Model name recorded likewise (default: the adapter's ``model`` attribute).
    :param session_id: Id of the new session to create (``None``: the store picks one).
    :param session: An existing live session of ``store`` to drive instead (used by :meth:`resume`).
    :param system: Optional system prompt (part of the request header).
    :param max_parallel_tool_calls: Bound on concurrently dispatched parallel-safe calls (positive int).
    :param require_checkpoint_policy: When the host persists sessions (a coordinator is registered) but no
        checkpoint policy is (``pip install dsh-session-checkpoint-policy``), refuse with
        :class:`CheckpointPolicyMissingError`: without it nothing is durable before a model request or a tool call.
        ``False`` opts out and runs without checkpoints (a crash may then lose the turn or repeat a tool).

    The loop is the ``agent`` the boundary hooks receive; it exposes :attr:`session`. Call :meth:`close` when done
    (it detaches the loop from the host runtime; disposing the session is the caller's business).
    """

    def __init__(
        self,
        host: Host,
        store: SessionStore,
        adapter: ModelAdapter,
        tools: Iterable[Tool] = (),
        *,
        provider: str | None = None,
        model: str | None = None,
        session_id: str | None = None,
        session: Session | None = None,
        system: str | None = None,
        max_parallel_tool_calls: int = DEFAULT_MAX_PARALLEL_TOOL_CALLS,
        require_checkpoint_policy: bool = True,
    ) -> None:
        if type(max_parallel_tool_calls) is not int or max_parallel_tool_calls < 1:
            raise ValueError("max_parallel_tool_calls must be a positive integer")
        if require_checkpoint_policy:
            _check_checkpoint_policy(host)
        provider = provider or _adapter_name(adapter, "provider")
        model = model or _adapter_name(adapter, "model")
        if not provider or not model:
            raise ValueError(
                "provider and model must be non-empty: pass provider= and model=, or give the adapter "
                "provider and model attributes"
            )
        self.host = host
        self.store = store
        self.adapter = adapter
        self.tools: dict[str, Tool] = {}
        specs: list[dict[str, Any]] = []
        for tool in tools:
            spec = tool_spec(tool)
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
            specs.append(spec)
        self._tool_specs = tuple(specs)
        self.provider: str = provider
        self.model: str = model
        self.system = system
        self.max_parallel_tool_calls = max_parallel_tool_calls
        self._runtime = runtime(host)
        self._owns_session = session is None
        if session is None:
            session = store.create(session_id)
        elif not store.is_live(session):
            raise ValueError(f'session "{session.id}" is not live in this store')
        if session.id in self._runtime.loops:
            raise ValueError(f'session "{session.id}" already has an agent loop')
        self._session = session
        self._runtime.loops[session.id] = self
        self._signal: CancelSignal | None = None
        self._slots: list[_Slot] = []  # the current step's started tool calls
        self._requested = False  # whether this loop instance already logged a request header
        self._context_scan = LatestOfType(RequestContext)  # see ModelSteps._request_context
        self._turn_scan = LatestOfType(TurnStart)
        self._closed = False
        self._require_checkpoint_policy = require_checkpoint_policy
        self._preflight_done = not self._owns_session  # a created session is checked against storage first

    @classmethod
    async def resume(
        cls,
        host: Host,
        store: SessionStore,
        persistence: Persistence,
        session_id: str,
        adapter: ModelAdapter,
        tools: Iterable[Tool] = (),
        *,
        provider: str | None = None,
        model: str | None = None,
        system: str | None = None,
        max_parallel_tool_calls: int = DEFAULT_MAX_PARALLEL_TOOL_CALLS,
        require_checkpoint_policy: bool = True,
        reconcile: bool = True,
        reconcile_timeout: float = DEFAULT_RECONCILE_TIMEOUT_S,
    ) -> AgentLoop:
        """Load a stored session and continue it in a new loop.

        ``persistence.load(session_id)`` returns the balanced (crash-repaired) view; a new live session is seeded
        with it through ``store`` (which appends ``session/end-seed``). The next :meth:`run_turn` continues the turn
        numbering and logs its first request header with reason ``resume``. Loading a session that is live with an
        open turn raises ``LiveTurnOpenError``; a live id cannot be seeded twice (``SessionAlreadyExistsError``).

        ``provider``, ``model`` and ``system`` default to those of the session's last request header (then to the
        adapter's attributes), so a resume names only what is not stored: the adapter and the tools.

        With ``reconcile`` (the default) the loop then runs :meth:`reconcile` (each check bounded by
        ``reconcile_timeout`` seconds), so a tool that can look up its own effect replaces an unknown outcome with
        what happened before the next model request. To carry on the turn a crash cut, call
        :meth:`continue_interrupted` (:attr:`interrupted_turn` says whether there is one).
        """
        if require_checkpoint_policy:
            _check_checkpoint_policy(host)  # before the load commits any repair
        view = await persistence.load(session_id)
        session = store.create(
            session_id, seed=view.events, meta=view.meta, inherited_event_count=view.inherited_event_count
        )
        loop = cls._continuing(
            host,
            store,
            session,
            adapter,
            tools,
            provider,
            model,
            system,
            max_parallel_tool_calls,
            require_checkpoint_policy,
        )
        if reconcile:
            try:
                await loop.reconcile(timeout=reconcile_timeout)
            except BaseException:
                loop._abandon()
                raise
        return loop

    @classmethod
    def _continuing(
        cls,
        host: Host,
        store: SessionStore,
        session: Session,
        adapter: ModelAdapter,
        tools: Iterable[Tool],
        provider: str | None,
        model: str | None,
        system: str | None,
        max_parallel_tool_calls: int,
        require_checkpoint_policy: bool = True,
    ) -> AgentLoop:
        """A loop on ``session``, a live session seeded with stored history (a resume or a fork's child): what the
        caller leaves as ``None`` of provider, model and system comes from its last request header."""
        stored = session.request_header()
        if stored is not None:
            provider = provider or stored.config.provider
            model = model or stored.config.model
            if system is None and isinstance(stored.system, str):
                system = stored.system
        return cls(
            host,
            store,
            adapter,
            tools,
            provider=provider,
            model=model,
            session=session,
            system=system,
            max_parallel_tool_calls=max_parallel_tool_calls,
            require_checkpoint_policy=require_checkpoint_policy,
        )

    # ---------------------------------------------------------------------------------------------
    # Read side

    @property
    def session(self) -> Session:
        """The live session this loop appends to (the checkpoint policy flushes it)."""
        return self._session

    @property
    def running(self) -> bool:
        """Whether a turn is in progress."""
        return self._signal is not None

    @property
    def signal(self) -> CancelSignal | None:
        """The running turn's cancellation signal (``None`` while idle)."""
        return self._signal

    def last_turn(self) -> int:
        """The number of the last turn started in the session (0 if none)."""
        found = self._turn_scan.find(self._session)
        return 0 if found is None else found.data.turn

    # ---------------------------------------------------------------------------------------------
    # Control

    def cancel(self, cause: object = "user") -> bool:
        """Abort the running turn cooperatively with ``cause`` (first cause wins); no-op while idle.

        ``cause`` is a kind string (``"user"``, ``"parent"``, ``"disposed"``), a ``{"kind": ...}`` dict or an
        abort-cause struct; ``turn/end`` records it as ``aborted {reason: cause}``. Returns whether this call
        aborted the turn.
        """
        signal = self._signal
        if signal is None:
            return False
        return signal.abort(cause)

    def close(self) -> None:
        """Detach from the host runtime (the session stays live in the store). Idempotent."""
        if not self._closed:
            self._closed = True
            if self._runtime.loops.get(self._session.id) is self:
                del self._runtime.loops[self._session.id]

    async def dispatch_nested(self, name: str, arguments: Any, *, parent: object, signal: CancelSignal) -> Any:
        """Dispatch a nested (transport) sub-call from inside a composite tool body.

        ``parent`` is the outer call's opaque token (e.g. its call id); the sub-call has no ``tool/call`` event and
        the checkpoint policy does not flush for it. Returns the :class:`ToolExecutionResult`.
        """
        execution = ToolExecution(
            call_id=f"{parent}/{name}", name=name, arguments=arguments, signal=signal, agent=self, parent=parent
        )
        return await self._execute(execution)

    # ---------------------------------------------------------------------------------------------
    # A turn

    async def run_turn(self, messages: str | Message | Sequence[str | Message]) -> TurnResult:
        """Run one turn with ``messages`` as the user input; return its :class:`TurnResult`.

        ``result.reason.kind`` says how it ended, ``result.text`` is the model's last text, ``result.event`` the
        ``turn/end`` event. Before the first turn of a loop that created its session, the session is checked
        against storage: a stored log with the same id raises ``SessionIdCollisionError`` (resume it instead) and
        the loop closes; nothing is appended.

        Errors are contained: a failing turn ends ``error`` (and ``agent_error`` is notified), a cancelled one
        ``aborted``. Native (anyio) cancellation is not swallowed: the turn is closed ``aborted {disposed}`` (unless
        already aborted) and the cancellation propagates.
        """
        return await self._run(messages, None)

    async def _run(self, messages: str | Message | Sequence[str | Message] | None, continues: int | None) -> TurnResult:
        if self._closed:
            raise RuntimeError("this agent loop is closed")
        if self._signal is not None:
            raise RuntimeError("a turn is already running on this agent loop")
        if self._session.has_open_turn():
            raise RuntimeError(f'session "{self._session.id}" has an open turn')
        if self._require_checkpoint_policy:
            _check_checkpoint_policy(self.host)  # persistence may have been registered after construction
        if not self._preflight_done:
            await self.ready()
        signal = CancelSignal()
        self._signal = signal
        self.host.agent_status(self, "running")
        try:
            start = len(self._session)
            claimed = [] if messages is None else self._user_messages(messages)
            end = await self._turn(claimed, signal, continues)
            return turn_result(self._session.events_from(start), end)
        finally:
            self._signal = None
            self.host.agent_status(self, "idle")

    async def ready(self) -> None:
        """Bind a session this loop created to its storage now, so a conflict surfaces before any turn.

        ``SessionIdCollisionError`` when the id is already stored (continue it with :meth:`resume` instead); the
        loop is then closed and its session retired, nothing appended. A no-op for a resumed or forked session and
        once it succeeded; :meth:`run_turn` calls it before the first turn.
        """
        if self._preflight_done:
            return
        try:
            for owner in owners_of(self.host):  # the open coordinators registered in the host
                await cast(Persistence, owner).wait_ready(self._session)
        except SessionIdCollisionError as exc:
            self._abandon()
            raise SessionIdCollisionError(
                f'session "{self._session.id}" is already stored; continue it with AgentLoop.resume(...) '
                f"(or Sessions.resume / resume_or_create) instead of creating it again ({exc})"
            ) from exc
        except BaseException:
            self._abandon()
            raise
        self._preflight_done = True

    def _abandon(self) -> None:
        """Close the loop and retire the session it created (nothing of it was appended)."""
        self.close()
        if self.store.is_live(self._session):
            self.store.dispose(self._session)

    def _user_messages(self, messages: str | Message | Sequence[str | Message]) -> list[Message]:
        items: Sequence[str | Message] = [messages] if isinstance(messages, (str, Message)) else messages
        turn = self.last_turn() + 1
        out: list[Message] = []
        for index, item in enumerate(items):
            if isinstance(item, Message):
                out.append(item)
            else:
                out.append(
                    Message(
                        id=f"user-{turn}-{index}", role="user", content=(TextBlock(text=item),), source=UserSource()
                    )
                )
        return out

    async def _turn(self, claimed: list[Message], signal: CancelSignal, continues: int | None = None) -> TurnEnd:
        session = self._session
        turn = self.last_turn() + 1
        session.append("turn/start", {"turn": turn})
        # A continuation's first step needs no new message when the model owes an answer (see answer_pending).
        first_step_due = False
        if continues is not None:
            session.append("turn/continue", {"turn": turn, "interruptedTurn": continues}, ignorable=True)
            first_step_due = answer_pending(session.derive_messages())
        step = 0
        ends: str | None = None
        reason: dict[str, Any]
        try:
            try:
                while True:
                    signal.raise_if_aborted()
                    step += 1
                    pre_step = PreStepInput(
                        messages=tuple(claimed),
                        turn=turn,
                        step=step,
                        signal=signal,
                        default=PreStepDecision.enter(tuple(claimed)),
                    )
                    claimed = []
                    decision = await self.host.agent_pre_step(self, pre_step)
                    signal.raise_if_aborted()
                    if decision.kind == "reject":
                        ends = "blocked"
                        break
                    if not decision.messages and (ends is not None or (step == 1 and not first_step_due)):
                        ends = ends or "completed"
                        break
                    session.append("step/start", {"turn": turn, "step": step})
                    try:
                        for message in decision.messages:
                            session.append("user/message", _builtins(message))
                        outcome = await self._step(turn, step, signal)
                    finally:
                        session.append("step/end", {"turn": turn, "step": step})
                    if outcome == "max-tokens" or (outcome == "completed" and ends != "max-tokens"):
                        ends = outcome
                    signal.raise_if_aborted()
                    if ends is not None:
                        break
                reason = {"kind": ends}
            except Exception as raised:
                exc = _unwrap(raised)
                if signal.aborted:
                    reason = {"kind": "aborted", "reason": _abort_cause(signal.reason)}
                else:
                    failure = (
                        exc.failure if isinstance(exc, LlmError) else {"message": _error_text(exc), "code": "UNKNOWN"}
                    )
                    reason = {"kind": "error", "error": failure}
                    self.host.agent_error(self, turn, step, exc)
        except BaseException:
            # Native cancellation (host teardown): close the turn honestly, then let the cancellation go on.
            signal.abort("disposed")
            session.append(
                "turn/end", {"turn": turn, "reason": {"kind": "aborted", "reason": _abort_cause(signal.reason)}}
            )
            raise
        event = session.append("turn/end", {"turn": turn, "reason": reason})
        assert isinstance(event, TurnEnd)
        return event

    def __repr__(self) -> str:
        state = "running" if self._signal is not None else "idle"
        return f"<AgentLoop session={self._session.id!r} {state}>"


def _check_checkpoint_policy(host: Host) -> None:
    """Refuse an agent on a persisting host without a checkpoint policy (nothing would be durable in time)."""
    if host.has_session_flush() and not host.has_checkpoint_policy():
        raise CheckpointPolicyMissingError()


def _adapter_name(adapter: object, attribute: str) -> str | None:
    """The adapter's ``provider``/``model`` attribute when it is a non-empty str (adapters may name themselves)."""
    value = getattr(adapter, attribute, None)
    return value if isinstance(value, str) and value else None
