"""The capability: every run of a pydantic-ai agent recorded in one dsh session, durable at the policy's points.

The checkpoints are the dsh checkpoint policy's, taken through the coordinator's flush barrier (the same barrier the
policy calls) from pydantic-ai's lifecycle hooks:

* before each model request (``before_model_request``): the run's history so far, the request included;
* before each tool body (``before_tool_execute``): the response that asked for the call and the call's
  ``tool/call``, so a body never runs before its call is durable;
* at the run's end (``wrap_run``): the whole run, its turn closed.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
from dsh.session_persistence import MemoryBackend, Session, SessionNotFoundError, Sessions
from dsh.session_persistence.loop import DEFAULT_RECONCILE_TIMEOUT_S
from dsh.session_persistence.repair import unknown_calls
from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolCallPart

from ._errors import DurabilityClosedError, NotDurableWarning, RunOverlapError
from ._history import RECONCILE_EVENT, Check, project, reconcile_data, run_check
from ._record import Recorder

__all__ = ["DshDurability"]


@dataclass
class DshDurability(AbstractCapability[Any]):
    """A pydantic-ai capability that keeps every run of an agent in one dsh session, crash-honest.

    :param sessions: The open store (``async with open_sessions(root) as sessions``).
    :param session_id: The dsh session the runs go to (created on first use, else resumed and crash-repaired).
    :param checks: Per tool name, a reconciliation check ``check(arguments, call_id) -> Reconciliation`` (or an
        awaitable of one): on resume, each call of that tool a crash cut mid-body is checked once, and its finding
        replaces the ``TOOL_OUTCOME_UNKNOWN`` answer the model would read.
    :param reconcile_timeout: How long one check may take before it counts as "cannot tell" (seconds).

    Give each run the stored history: ``agent.run(prompt, message_history=await durability.history())``; a run whose
    history does not start with the stored one is refused (:class:`HistoryMismatchError`) before anything is
    written. When the history ends with a request (a run was cut), ``agent.run(message_history=history)`` carries
    that run on without a new prompt. The session takes the dsh writer lease: a second writer, in this process or
    another, gets ``SessionLockedError``. One run at a time (:class:`RunOverlapError`).
    """

    sessions: Sessions
    session_id: str
    checks: Mapping[str, Check] = field(default_factory=dict)
    reconcile_timeout: float = DEFAULT_RECONCILE_TIMEOUT_S
    _recorder: Recorder | None = field(default=None, init=False, repr=False, compare=False)
    _running: bool = field(default=False, init=False, repr=False, compare=False)
    _closed: bool = field(default=False, init=False, repr=False, compare=False)
    _warned: bool = field(default=False, init=False, repr=False, compare=False)

    # ---------------------------------------------------------------------------------------------
    # The session

    async def _open(self) -> Recorder:
        if self._closed:
            raise DurabilityClosedError(f'DshDurability "{self.session_id}" is closed; make a new one to continue')
        if self._recorder is not None:
            return self._recorder
        store = self.sessions.store
        try:
            view = await self.sessions.persistence.load(self.session_id)  # crash-repaired
        except SessionNotFoundError:
            live = store.create(self.session_id)
        else:
            live = store.create(
                self.session_id, seed=view.events, meta=view.meta, inherited_event_count=view.inherited_event_count
            )
        try:
            await self.sessions.persistence.wait_ready(live)  # the writer lease: a second writer stops here
            await self._reconcile(live)
        except BaseException:
            store.dispose(live)
            raise
        self._recorder = Recorder(live)
        return self._recorder

    async def _reconcile(self, live: Session) -> None:
        """Ask each cut call's tool what became of it; the findings are durable before any model request."""
        found = False
        for call in unknown_calls(live.events):
            check = self.checks.get(call.name)
            if check is None:
                continue
            finding = await run_check(check, call, self.reconcile_timeout)
            live.append(RECONCILE_EVENT, reconcile_data(call, finding, len(live.events)), ignorable=True)
            found = True
        if found:
            await self.sessions.store.flush(live)

    async def _retire(self) -> None:
        """Make what was recorded durable and let the session go; the next use reloads it (an open turn repaired)."""
        recorder, self._recorder = self._recorder, None
        if recorder is None or not self.sessions.store.is_live(recorder.live):
            return
        with anyio.CancelScope(shield=True):  # a cancelled run still leaves its record durable
            try:
                await self.sessions.store.flush(recorder.live)
            finally:
                self.sessions.store.dispose(recorder.live)

    async def history(self) -> list[ModelMessage]:
        """The session's pydantic-ai history, crash-repaired: pass it as ``message_history``.

        A call a crash cut is answered by one closing request (the ``TOOL_OUTCOME_UNKNOWN`` text, a reconciliation
        finding, or ``TOOL_NOT_STARTED`` for a call whose body never started); such a history ends with a request,
        and ``agent.run(message_history=history)`` continues the cut run without a new prompt."""
        recorder = await self._open()
        return project(recorder.live.events)

    async def interrupted(self) -> bool:
        """Whether the last run was cut before its end (its history ends with a request the model owes a reply)."""
        history = await self.history()
        return bool(history) and isinstance(history[-1], ModelRequest)

    async def aclose(self) -> None:
        """Make everything durable and release the session; later use raises :class:`DurabilityClosedError`."""
        self._closed = True
        await self._retire()

    async def __aenter__(self) -> DshDurability:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # ---------------------------------------------------------------------------------------------
    # pydantic-ai's lifecycle hooks

    async def wrap_run(self, ctx: RunContext[Any], *, handler: Any) -> Any:
        if self._running:
            raise RunOverlapError(f'a run on session "{self.session_id}" is still running')
        self._running = True
        try:
            recorder = await self._open()
            recorder.check_prefix(ctx.messages)
            try:
                result = await handler()
            except BaseException:
                await self._retire()
                raise
            recorder.sync(result.all_messages())
            recorder.end_run()
            await self.sessions.store.flush(recorder.live)
            return result
        finally:
            self._running = False

    async def before_model_request(self, ctx: RunContext[Any], request_context: Any) -> Any:
        recorder = await self._open()
        recorder.sync(ctx.messages)
        await self.sessions.store.flush(recorder.live)
        return request_context

    async def before_tool_execute(self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: Any, args: Any) -> Any:
        recorder = await self._open()
        recorder.sync(ctx.messages)
        recorder.start_call(call.tool_call_id)
        self._warn_not_durable()
        await self.sessions.store.flush(recorder.live)
        return args

    def _warn_not_durable(self) -> None:
        if self._warned or not isinstance(self.sessions.backend, MemoryBackend):
            return
        self._warned = True
        warnings.warn(
            f'session "{self.session_id}" is kept by the in-memory backend, which keeps nothing past this process: a '
            "crash while this tool runs loses the record of its call. Open the store on a durable backend "
            "(open_sessions(root), the JSONL default, or PostgreSQL)",
            NotDurableWarning,
            stacklevel=2,
        )
