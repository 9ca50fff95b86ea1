"""The tool half of a step: start each call durably, dispatch it (exclusive or in a bounded parallel pool), commit
results in model order, and close every call honestly when the turn is torn down."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from .._host.boundaries import (
    CancelSignal,
    ToolExecution,
    ToolExecutionResult,
    aborted_before_dispatch_result,
    aborted_result,
    error_result,
)
from .protocols import Tool, ToolOwner

if TYPE_CHECKING:
    from .._host.host import Host
    from .._host.session import Session
    from .protocols import ModelAdapter

__all__ = ["ToolSteps"]


@dataclass(eq=False)
class _Slot:
    """One started tool call: its block, ``tool/call`` seq and (once dispatched) its result."""

    block: dict[str, Any]
    call_seq: int
    done: anyio.Event = field(default_factory=anyio.Event)
    result: ToolExecutionResult | None = None
    committed: bool = False


class ToolSteps(ToolOwner):
    """The tool-running part of :class:`~dsh.session_persistence.loop.AgentLoop` (a mixin holding no state)."""

    host: Host
    adapter: ModelAdapter
    tools: dict[str, Tool]
    max_parallel_tool_calls: int
    _session: Session
    _slots: list[_Slot]

    @property
    def session(self) -> Session:
        """The live session this loop appends to."""
        return self._session

    async def _run_tools(self, turn: int, step: int, calls: list[dict[str, Any]], signal: CancelSignal) -> None:
        self._slots = []
        try:
            await self._schedule(turn, step, calls, signal)
        except BaseException as exc:
            if isinstance(exc, Exception):
                raise  # an internal failure: rethrown without fabricating results
            # Native cancellation (teardown): close every call so the transcript stays balanced, then propagate.
            started = {slot.block["id"] for slot in self._slots}
            for slot in list(self._slots):
                if not slot.committed:
                    slot.result = aborted_result()
                    self._commit(turn, step, slot)
            for block in calls:
                if block["id"] not in started:
                    slot = self._start_call(turn, step, block)
                    slot.result = aborted_before_dispatch_result()
                    self._commit(turn, step, slot)
            raise
        finally:
            self._slots = []

    async def _schedule(self, turn: int, step: int, calls: list[dict[str, Any]], signal: CancelSignal) -> None:
        index = 0
        while index < len(calls) and not signal.aborted:
            tool = self.tools.get(calls[index]["name"])
            if not self._is_parallel(tool):
                slot = self._start_call(turn, step, calls[index])
                slot.result = await self._dispatch(turn, step, slot, signal)
                self._commit(turn, step, slot)
                index += 1
                continue
            end = index
            while end < len(calls) and self._is_parallel(self.tools.get(calls[end]["name"])):
                end += 1
            index += await self._run_pool(turn, step, calls[index:end], signal)
        for block in calls[index:]:
            # Never started: a synthetic call + ABORTED_BEFORE_DISPATCH pair keeps the transcript balanced.
            slot = self._start_call(turn, step, block)
            slot.result = aborted_before_dispatch_result()
            self._commit(turn, step, slot)

    @staticmethod
    def _is_parallel(tool: Tool | None) -> bool:
        try:
            return tool is not None and tool.parallel is True
        except Exception:  # a throwing concurrency predicate means exclusive
            return False

    async def _run_pool(self, turn: int, step: int, group: list[dict[str, Any]], signal: CancelSignal) -> int:
        """A rolling pool of at most ``max_parallel_tool_calls`` dispatches; results committed in model order."""
        semaphore = anyio.Semaphore(self.max_parallel_tool_calls)
        started: list[_Slot] = []
        committed = 0

        def commit_ready() -> None:
            nonlocal committed
            while committed < len(started) and started[committed].done.is_set():
                self._commit(turn, step, started[committed])
                committed += 1

        async def run(slot: _Slot) -> None:
            try:
                slot.result = await self._dispatch(turn, step, slot, signal)
            finally:
                slot.done.set()
                semaphore.release()

        async with anyio.create_task_group() as tg:
            for block in group:
                commit_ready()
                await semaphore.acquire()
                if signal.aborted:
                    semaphore.release()
                    break
                slot = self._start_call(turn, step, block)
                started.append(slot)
                tg.start_soon(run, slot)
            # Drain started calls, committing each as soon as everything before it is committed.
            for slot in started[committed:]:
                await slot.done.wait()
                commit_ready()
        commit_ready()
        return len(started)

    def _start_call(self, turn: int, step: int, block: dict[str, Any]) -> _Slot:
        event = self._session.append(
            "tool/call",
            {"turn": turn, "step": step, "callId": block["id"], "name": block["name"], "arguments": block["arguments"]},
        )
        slot = _Slot(block=block, call_seq=event.seq)
        self._slots.append(slot)
        return slot

    async def _dispatch(self, turn: int, step: int, slot: _Slot, signal: CancelSignal) -> ToolExecutionResult:
        block = slot.block
        if signal.aborted:  # prepare: never reaches tools_execute
            return aborted_before_dispatch_result()
        try:
            arguments = json.loads(block["arguments"]) if block["arguments"] else {}
        except ValueError as exc:
            return error_result(f"invalid tool arguments: {exc}")
        if block["name"] not in self.tools:
            return error_result(f"unknown tool {block['name']!r}")
        execution = ToolExecution(
            call_id=block["id"],
            name=block["name"],
            arguments=arguments,
            signal=signal,
            agent=self,
            turn=turn,
            step=step,
        )
        return await self._execute(execution)

    async def _execute(self, execution: ToolExecution) -> ToolExecutionResult:
        """Await the ``tools_execute`` chain; any ``Exception`` escaping it is the call's final error result."""
        try:
            result = await self.host.tools_execute(execution)
        except Exception as exc:
            return error_result(str(exc) or type(exc).__name__)
        if execution.signal.aborted and not result.is_error:
            return aborted_result()
        return result

    def _commit(self, turn: int, step: int, slot: _Slot) -> None:
        result = slot.result
        assert result is not None
        call_id = slot.block["id"]
        block: dict[str, Any] = {
            "type": "tool-result",
            "toolCallId": call_id,
            "content": [dict(b) for b in result.content],
        }
        if result.is_error:
            block["isError"] = True
        data: dict[str, Any] = {
            "turn": turn,
            "step": step,
            "message": {
                "id": f"tool-result-{call_id}",
                "role": "user",
                "content": [block],
                "source": {"kind": "tool", "callId": call_id},
            },
        }
        info = result.error.get("info") if result.error is not None else None
        if isinstance(info, Mapping) and isinstance(info.get("name"), str) and isinstance(info.get("code"), str):
            data["error"] = {"name": info["name"], "code": info["code"]}
        self._session.append("tool/result", data, source_event_seqs=[slot.call_seq])
        slot.committed = True
