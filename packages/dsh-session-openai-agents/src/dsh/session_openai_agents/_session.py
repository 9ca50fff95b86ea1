"""A dsh-backed Session for the OpenAI Agents SDK, and the run hooks that make model output durable early.

Every SDK item is kept verbatim in an ignorable ``openai-agents/item`` event (what :meth:`DshSession.get_items`
returns), next to the first-class dsh events that say the same thing to dsh readers (``dsh-sessions show``):

* a user, system or developer message: a ``user/message``;
* one model response (recorded by :class:`DurableRunHooks` when it ends): a turn with an ``assistant/message``
  (its text and tool-call blocks) and a ``tool/call`` per function call. The turn stays open until every call has
  its ``function_call_output``, which becomes the ``tool/result``; so a process killed while a tool runs leaves an
  open turn whose call crash repair answers with ``TOOL_OUTCOME_UNKNOWN``, and the next :meth:`get_items` hands
  the model that answer as the call's output instead of running the tool again;
* anything else (reasoning, hosted tool calls...): the verbatim event only.

``pop_item`` appends an ignorable ``openai-agents/pop`` record (the item is gone from ``get_items`` durably; the log
stays append-only); ``clear_session`` cuts the log back to nothing with the coordinator's durable truncation. The
SDK's compaction (``OpenAIResponsesCompactionSession`` over a ``DshSession``) replaces history through the
snapshot hooks it looks for, each an ``openai-agents/compaction`` record (:mod:`._history`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import anyio
from agents import RunHooks
from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit
from dsh.session_persistence import Session, SessionNotFoundError, SessionPersistenceError, Sessions
from dsh.session_persistence.events import TurnStart

from ._history import COMPACTION_EVENT, ITEM_EVENT, POP_EVENT, CompactionSnapshot, Entry, Position, replay

__all__ = [
    "COMPACTION_EVENT",
    "ITEM_EVENT",
    "POP_EVENT",
    "PROVIDER",
    "DshSession",
    "DshSessionClosedError",
    "DurableRunHooks",
    "NotDurableWarning",
]

#: The provider name recorded on assistant messages.
PROVIDER = "openai-agents"

_USER_ROLES = ("user", "system", "developer")


class DshSessionClosedError(SessionPersistenceError, RuntimeError):
    """The :class:`DshSession` was closed (``aclose()`` or the end of its ``async with``); nothing was written.

    Also a ``RuntimeError``, what the SDK's own sessions raise when used after ``close()``."""


class NotDurableWarning(UserWarning):
    """A :class:`DshSession` is written to while no :class:`DurableRunHooks` was made for it: the SDK hands it a
    function call only after the tool ran, so a crash while a tool runs can repeat the tool's side effect. Issued
    once per session object, at its first ``add_items`` (the runner saves the run's input before the model runs)."""


def _plain(item: Any) -> dict[str, Any]:
    """An SDK item as plain JSON (the SDK passes dicts; model output items are pydantic models)."""
    if isinstance(item, Mapping):
        return json.loads(json.dumps(dict(item)))  # type: ignore[no-any-return]
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        return json.loads(json.dumps(dump(exclude_unset=True)))  # type: ignore[no-any-return]
    raise TypeError(f"not an Agents SDK item: {type(item).__name__}")


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
    return "".join(parts)


def _key(item: Mapping[str, Any]) -> tuple[str, str] | None:
    """What identifies an item recorded early when the SDK saves it again: its call id, else its item id."""
    kind = item.get("type")
    if kind in ("function_call", "function_call_output") and isinstance(item.get("call_id"), str):
        return (kind, item["call_id"])
    if isinstance(item.get("id"), str) and item["id"]:
        return (str(kind or "message"), item["id"])
    return None


class DshSession:
    """The Agents SDK ``Session`` protocol over one dsh session of an open store.

    :param sessions: The open store (``async with open_sessions(root) as sessions``).
    :param session_id: The dsh session id (also the SDK's ``session_id``).
    :param session_settings: The SDK's session settings (``SessionSettings`` or its dict form); its ``limit`` is
        what ``get_items()`` returns when called without one.

    The dsh session is opened on first use: resumed (crash-repaired) when stored, else created; from then on this
    object is its only writer (a second writer, in this process or another, gets ``SessionLockedError`` from the
    writer lease). Calls on one object are serialized. Every mutation is durable when it returns. After
    :meth:`aclose` every call raises :class:`DshSessionClosedError` (make a new object to continue the session).

    Pass ``hooks=DurableRunHooks(session)`` to the runner: without them the SDK hands a function call to the session
    only after its tool ran; the first ``add_items`` of an object no hooks were made for warns
    (:class:`NotDurableWarning`, once per object).
    """

    def __init__(
        self, sessions: Sessions, session_id: str, *, session_settings: SessionSettings | dict[str, Any] | None = None
    ) -> None:
        self.sessions = sessions
        self.session_id = session_id
        self.session_settings: SessionSettings = (
            coerce_session_settings(session_settings) if session_settings is not None else SessionSettings()
        )
        self._live: Session | None = None
        self._lock = anyio.Lock()
        self._pending: set[tuple[str, str]] = set()  # recorded early, not yet saved by the SDK
        self._open_calls: dict[str, int] = {}  # call id -> tool/call seq, in the open turn
        self._turn: tuple[int, int] | None = None  # the open (turn, step) of a model response
        self._version = 0  # bumped by every mutation: a compaction snapshot is stale once it moved
        self._closed = False
        self._hooked = False  # a DurableRunHooks was made for this object
        self._warned = False

    # ---------------------------------------------------------------------------------------------
    # Lifecycle

    async def _session(self) -> Session:
        if self._closed:
            raise DshSessionClosedError(f'DshSession "{self.session_id}" is closed; open a new DshSession to continue')
        if self._live is not None:
            return self._live
        store = self.sessions.store
        try:
            view = await self.sessions.persistence.load(self.session_id)
        except SessionNotFoundError:
            live = store.create(self.session_id)
            try:
                await self.sessions.persistence.wait_ready(live)
            except BaseException:
                store.dispose(live)
                raise
        else:
            live = store.create(
                self.session_id, seed=view.events, meta=view.meta, inherited_event_count=view.inherited_event_count
            )
            try:
                await self.sessions.persistence.wait_ready(live)  # the writer lease: a second writer stops here
            except BaseException:
                store.dispose(live)
                raise
        self._live = live
        return live

    async def aclose(self) -> None:
        """Make everything durable and retire the dsh session; later calls raise :class:`DshSessionClosedError`.

        Idempotent."""
        async with self._lock:
            self._closed = True
            live, self._live = self._live, None
            # An open response turn stays open in storage: the next load repairs it honestly.
            self._pending.clear()
            self._open_calls.clear()
            self._turn = None
            if live is not None and self.sessions.store.is_live(live):
                try:
                    await self.sessions.store.flush(live)
                finally:
                    self.sessions.store.dispose(live)

    async def __aenter__(self) -> DshSession:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # ---------------------------------------------------------------------------------------------
    # The Session protocol

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The stored items, oldest first (the latest ``limit``, else the settings' limit, when given); a call whose
        output crash repair wrote gets that output."""
        limit = resolve_session_limit(limit, self.session_settings)
        async with self._lock:
            live = await self._session()
            items = [entry.item for entry in replay(live.events)]
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return items

    async def add_items(self, items: list[Any]) -> None:
        """Record ``items`` (skipping those the hooks recorded already); durable when this returns."""
        async with self._lock:
            live = await self._session()
            self._warn_not_durable()  # the runner saves the run's input first: before any model request or tool
            for raw in items:
                item = _plain(raw)
                key = _key(item)
                if key is not None and key in self._pending:
                    self._pending.discard(key)
                    continue
                self._record(live, item)
                self._version += 1
            await self.sessions.store.flush(live)

    async def pop_item(self) -> Any | None:
        """Remove the most recent item (durably) and return it; ``None`` when there is none."""
        async with self._lock:
            live = await self._session()
            for entry in reversed(replay(live.events)):
                if entry.stored:
                    seq, index = entry.position
                    live.append(
                        POP_EVENT, {"itemSeq": seq, "index": index} if index else {"itemSeq": seq}, ignorable=True
                    )
                    self._version += 1
                    await self.sessions.store.flush(live)
                    return entry.item
            return None

    async def clear_session(self) -> None:
        """Delete every item: the dsh log is cut back to nothing (durable truncation)."""
        async with self._lock:
            live = await self._session()
            cut = live.inherited_event_count
            if len(live.events) > cut:
                await self.sessions.persistence.truncate(live, cut)
                live.truncate(cut)
            self._version += 1
            self._pending.clear()
            self._open_calls.clear()
            self._turn = None

    # ---------------------------------------------------------------------------------------------
    # Compaction: the hooks the SDK's OpenAIResponsesCompactionSession looks for on the session it wraps

    async def _get_compaction_snapshot(
        self, limit: int, *, prune_prefix: Callable[[Any], bool] | None = None
    ) -> CompactionSnapshot:
        """The latest ``limit`` items, whether they are the whole history, and their atomic suffix replacement.

        ``replace_suffix(start, output)`` writes one compaction record: the snapshot's items from ``start`` on give
        way to ``output`` (and, with ``prune_prefix``, the leading run of items it accepts); it writes nothing and
        returns ``False`` when the session changed after the snapshot. Automatic compaction under the runner uses
        this (a bounded read: ``session_settings.limit`` does not hide history from it)."""
        async with self._lock:
            live = await self._session()
            entries = replay(live.events)
            version = self._version
        window = entries[-limit:] if limit > 0 else []

        async def replace_suffix(start: int, output: list[Any]) -> bool:
            replaced = window[start:]
            if not replaced:
                return False
            return await self._compact(replaced[0].position, output, version, prune_prefix)

        return CompactionSnapshot([entry.item for entry in window], len(window) == len(entries), replace_suffix)

    async def _atomic_replace_items(self, items: list[Any]) -> bool:
        """Replace the whole history by ``items`` in one compaction record (the SDK's manual ``run_compaction``)."""
        return await self._compact((0, 0), items, None, None)

    async def _compact(
        self, start: Position, output: list[Any], version: int | None, prune_prefix: Callable[[Any], bool] | None
    ) -> bool:
        async with self._lock:
            live = await self._session()
            if version is not None and version != self._version:
                return False  # a write came after the snapshot: the SDK keeps the history as it is
            data: dict[str, Any] = {"from": list(start), "items": [_plain(item) for item in output]}
            if prune_prefix is not None:
                last: Entry | None = None
                for entry in replay(live.events):
                    if entry.position >= start or not prune_prefix(entry.item):
                        break
                    last = entry
                if last is not None:
                    data["before"] = [last.position[0], last.position[1] + 1]
            live.append(COMPACTION_EVENT, data, ignorable=True)
            self._version += 1
            await self.sessions.store.flush(live)
            return True

    # ---------------------------------------------------------------------------------------------
    # Early recording (the hooks)

    async def record_response(self, output: Sequence[Any], model: str) -> None:
        """Record one model response's output items as they will be saved later; durable when this returns."""
        async with self._lock:
            live = await self._session()
            items = [_plain(raw) for raw in output]
            self._response_turn(live, items, model)
            self._version += 1
            for item in items:
                key = _key(item)
                if key is not None:
                    self._pending.add(key)
            await self.sessions.store.flush(live)

    def _warn_not_durable(self) -> None:
        if self._hooked or self._warned:
            return
        self._warned = True
        warnings.warn(
            f'DshSession "{self.session_id}" is used without DurableRunHooks, so the SDK hands it a function call only '
            "after the tool ran and a crash while a tool runs can repeat its side effect: pass "
            "hooks=DurableRunHooks(session) to Runner.run",
            NotDurableWarning,
            stacklevel=3,
        )

    # ---------------------------------------------------------------------------------------------
    # Writing

    def _last_turn(self, live: Session) -> int:
        for event in reversed(live.events):
            if type(event) is TurnStart:
                return event.data.turn
        return 0

    def _close_turn(self, live: Session) -> None:
        if self._turn is not None:
            turn, step = self._turn
            live.append("step/end", {"turn": turn, "step": step})
            live.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
            self._turn = None
            self._open_calls.clear()

    def _response_turn(self, live: Session, items: list[dict[str, Any]], model: str) -> None:
        self._close_turn(live)  # a new response while calls are unanswered: they were never run
        turn = self._last_turn(live) + 1
        live.append("turn/start", {"turn": turn})
        live.append("step/start", {"turn": turn, "step": 1})
        self._turn = (turn, 1)
        blocks: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        for item in items:
            if item.get("type") == "message" and item.get("role") == "assistant":
                text = _text(item.get("content"))
                if text:
                    blocks.append({"type": "text", "text": text})
            elif item.get("type") == "function_call":
                blocks.append(
                    {"type": "tool-call", "id": item["call_id"], "name": item["name"], "arguments": item["arguments"]}
                )
                calls.append(item)
        if blocks:
            message = {
                "id": f"assistant-{turn}",
                "role": "assistant",
                "content": blocks,
                "source": {"kind": "model", "provider": PROVIDER, "model": model or "unknown"},
            }
            live.append("assistant/message", {"turn": turn, "step": 1, "message": message})
        for call in calls:
            event = live.append(
                "tool/call",
                {
                    "turn": turn,
                    "step": 1,
                    "callId": call["call_id"],
                    "name": call["name"],
                    "arguments": call["arguments"],
                },
            )
            self._open_calls[call["call_id"]] = event.seq
        for item in items:
            live.append(ITEM_EVENT, {"item": item}, ignorable=True)
        if not self._open_calls:
            self._close_turn(live)

    def _record(self, live: Session, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if kind == "function_call_output" and item.get("call_id") in self._open_calls and self._turn is not None:
            turn, step = self._turn
            call_id = item["call_id"]
            result = {
                "turn": turn,
                "step": step,
                "message": {
                    "id": f"tool-result-{call_id}",
                    "role": "user",
                    "content": [
                        {
                            "type": "tool-result",
                            "toolCallId": call_id,
                            "content": [{"type": "text", "text": _text(item.get("output"))}],
                        }
                    ],
                    "source": {"kind": "tool", "callId": call_id},
                },
            }
            live.append("tool/result", result, source_event_seqs=[self._open_calls.pop(call_id)])
            live.append(ITEM_EVENT, {"item": item}, ignorable=True)
            if not self._open_calls:
                self._close_turn(live)
            return
        self._close_turn(live)
        if kind in (None, "message") and item.get("role") in _USER_ROLES:
            message = {
                "id": f"user-{len(live.events)}",
                "role": "user",
                "content": [{"type": "text", "text": _text(item.get("content"))}],
                "source": {"kind": "user"},
            }
            live.append("user/message", message)
        live.append(ITEM_EVENT, {"item": item}, ignorable=True)


class DurableRunHooks(RunHooks[Any]):
    """Run hooks that record each model response in a :class:`DshSession` durably as soon as it ends.

    Pass both to the runner: ``Runner.run(agent, input, session=session, hooks=DurableRunHooks(session))``. A
    function call is then durable before its tool body runs (the SDK itself saves it only after the tool
    returned), so a crash mid-tool is answered honestly on the next run.
    """

    def __init__(self, session: DshSession) -> None:
        self.session = session
        session._hooked = True  # the session stops warning that it is not durable

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        model = agent.model if isinstance(getattr(agent, "model", None), str) else type(agent.model).__name__
        await self.session.record_response(list(response.output), model)
