"""Child process for the pydantic-ai crash tests: ``python pydantic_ai_child.py MODE ROOT LEDGER``.

The model is pydantic-ai's own ``FunctionModel``: asked to email Bob, it calls ``send_email``; handed a tool return,
it answers with that return's text. ``send_email`` appends its side effect to LEDGER; in a ``crash`` mode it then
prints ``ready`` and blocks until the process is killed.

* ``crash`` / ``resume``: the agent with ``DshDurability`` (the JSONL store at ROOT). ``resume`` continues the cut
  run without a new prompt; ``resume-check`` does the same with a reconciliation check that reads LEDGER.
* ``bare-crash`` / ``bare-resume``: the same program on bare pydantic-ai, keeping its history the way pydantic-ai's
  docs show (``all_messages_json()`` after each run, in ROOT/history.json): the resumed program runs its prompt again.

Every resume prints one JSON line: the parts of the last request the model received and the run's output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
from dsh.session_persistence import Host, PersistenceCoordinator, Sessions, SessionStore
from dsh.session_persistence.loop import Reconciliation
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_pydantic_ai import DshDurability
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

SESSION_ID = "pydantic-crash"
PROMPT = "Email Bob the report."


def main(mode: str, root: str, ledger: str) -> None:
    seen: list[dict[str, Any]] = []

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen[:] = ModelMessagesTypeAdapter.dump_python(messages[-1:], mode="json")[0]["parts"]
        returns = [part for part in messages[-1].parts if part.part_kind == "tool-return"]
        if returns:
            return ModelResponse(parts=[TextPart(f"send_email said: {returns[0].model_response_str()}")])
        return ModelResponse(parts=[ToolCallPart("send_email", {"to": "bob@example.com"}, tool_call_id="call-1")])

    def agent_with(capabilities: list[Any]) -> Agent[None, str]:
        agent = Agent(FunctionModel(reply), capabilities=capabilities)

        @agent.tool_plain
        async def send_email(to: str) -> str:
            """Send the report by email."""
            async with await anyio.open_file(ledger, "a", encoding="utf-8") as out:
                await out.write(f"sent to {to}\n")
            if "crash" in mode:
                print("ready", flush=True)
                await anyio.sleep_forever()
            return f"sent to {to}"

        return agent

    def check(arguments: Any, call_id: str) -> Reconciliation:
        sent = Path(ledger).read_text(encoding="utf-8").splitlines()
        if f"sent to {arguments['to']}" in sent:
            return Reconciliation.happened(f"sent to {arguments['to']}", "found in the outbox")
        return Reconciliation.did_not_happen("not in the outbox")

    async def durable() -> None:
        checks = {"send_email": check} if mode == "resume-check" else {}
        host = Host()
        host.load_entrypoints()
        # A one-minute write-behind window: nothing reaches the disk before the kill unless a barrier wrote it.
        async with PersistenceCoordinator(host, JsonlBackend(root), write_batch_max_delay_ms=60_000) as persistence:
            sessions = Sessions(host, SessionStore(host), persistence)
            async with DshDurability(sessions, SESSION_ID, checks=checks) as durability:
                await run(durability)

    async def run(durability: DshDurability) -> None:
        agent = agent_with([durability])
        history = await durability.history()
        if mode == "crash":
            await agent.run(PROMPT, message_history=history)
            return
        assert await durability.interrupted()
        result = await agent.run(message_history=history)  # carries the cut run on: no new prompt
        print(json.dumps({"request": seen, "output": result.output}), flush=True)

    async def bare() -> None:
        saved = Path(root) / "history.json"
        history = ModelMessagesTypeAdapter.validate_json(saved.read_bytes()) if saved.exists() else []
        result = await agent_with([]).run(PROMPT, message_history=history)
        saved.write_bytes(result.all_messages_json())
        print(json.dumps({"request": seen, "output": result.output}), flush=True)

    Path(root).mkdir(parents=True, exist_ok=True)
    anyio.run(bare if mode.startswith("bare") else durable)


if __name__ == "__main__":
    main(*sys.argv[1:4])
