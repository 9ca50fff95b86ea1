"""Child process for the compaction crash tests: ``python openai_agents_compact_child.py MODE ROOT RELEASE``.

On a fresh JSONL root it saves HISTORY in a ``DshSession``, then runs one turn through the SDK's ``Runner`` with an
``OpenAIResponsesCompactionSession`` over it (retrieval limit 1, so the compaction is the bounded, partial kind).
The fake compaction endpoint prints ``{"size": <log bytes>}`` (the log before the compaction record), then by MODE:

* ``in-compact``: prints ``ready`` and blocks (killed before any replacement is written);
* ``write`` / ``sync``: arms the LD_PRELOAD shim to pause the compaction batch's write (or its fsync) on the
  transcript; the paused call creates ``RELEASE.paused`` and waits (killed inside the write path);
* ``done``: answers; once the run returned, prints ``ready`` and blocks (killed after the record was flushed).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, Runner
from agents.memory import OpenAIResponsesCompactionSession
from agents.testing import ScriptedModel, assistant_message
from dsh.session_openai_agents import DshSession, DurableRunHooks
from dsh.session_persistence import open_sessions
from dsh.session_persistence.testing import FaultRule, fault_spec

SESSION_ID = "agents-compact"
HISTORY: list[dict[str, Any]] = [
    {"role": "user" if n % 2 == 0 else "assistant", "content": f"message {n} " + "x" * 40} for n in range(8)
]
QUESTION = "continue"
REPLY = assistant_message("done")
SUMMARY = {"type": "compaction", "id": "cmp-crash", "encrypted_content": "synthetic-summary " + "y" * 200}


def transcript(root: str) -> Path:
    (path,) = Path(root).rglob("session.jsonl*")
    return path


class Compacted:
    def __init__(self) -> None:
        self.output = [SUMMARY]
        self.usage = None


class Responses:
    def __init__(self, mode: str, root: str, release: str) -> None:
        self.mode, self.root, self.release = mode, root, release

    async def compact(self, **kwargs: Any) -> Compacted:
        print(json.dumps({"size": transcript(self.root).stat().st_size}), flush=True)
        if self.mode == "in-compact":
            print("ready", flush=True)
            await asyncio.Event().wait()
        if self.mode in ("write", "sync"):
            # The next matching call on the transcript is the compaction batch's: nothing else writes it now.
            ops = ("write", "pwrite") if self.mode == "write" else ("fsync", "fdatasync")
            os.environ["DSH_SHIM_FAULT"] = fault_spec([FaultRule(ops=ops, path="session.jsonl", pause=self.release)])
        return Compacted()


class Client:
    def __init__(self, mode: str, root: str, release: str) -> None:
        self.responses = Responses(mode, root, release)


async def main(mode: str, root: str, release: str) -> None:
    async with open_sessions(root) as sessions, DshSession(sessions, SESSION_ID) as session:
        await session.add_items(list(HISTORY))
        compaction = OpenAIResponsesCompactionSession(
            SESSION_ID,
            session,  # type: ignore[arg-type]
            client=Client(mode, root, release),  # type: ignore[arg-type]
            compaction_mode="input",
            should_trigger_compaction=lambda _: True,
        )
        agent = Agent(name="worker", model=ScriptedModel([[REPLY]]))
        config = RunConfig(session_settings={"limit": 1})
        await Runner.run(agent, QUESTION, session=compaction, run_config=config, hooks=DurableRunHooks(session))
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
