"""Child process for the Agents SDK crash tests: ``python openai_agents_child.py MODE ROOT LEDGER``.

``crash``: a run whose model asks for ``send_email``; the tool body records its side effect in LEDGER, prints
``ready`` and blocks until the process is killed (``crash-nohooks``: the same without ``DurableRunHooks``). ``resume``: the next run on the same session; prints the model's
input and the final output as JSON. ``hold``: opens the session, saves one item, prints ``ready`` and blocks.
"""

from __future__ import annotations

import json
import sys

import anyio
from agents import Agent, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from dsh.session_openai_agents import DshSession, DurableRunHooks
from dsh.session_persistence import open_sessions

SESSION_ID = "agents-crash"


def main(mode: str, root: str, ledger: str) -> None:
    @function_tool
    async def send_email(to: str) -> str:
        """Send an email."""
        async with await anyio.open_file(ledger, "a", encoding="utf-8") as out:
            await out.write(f"sent to {to}\n")
        if mode.startswith("crash"):
            print("ready", flush=True)
            await anyio.sleep_forever()
        return "sent"

    async def run() -> None:
        async with open_sessions(root) as sessions, DshSession(sessions, SESSION_ID) as session:
            if mode == "hold":
                await session.add_items([{"role": "user", "content": "held"}])
                print("ready", flush=True)
                await anyio.sleep_forever()
            if mode.startswith("crash"):
                model = ScriptedModel([[function_call("send_email", {"to": "bob@example.com"}, call_id="call-1")]])
                question = "Email Bob."
            else:
                model = ScriptedModel([[assistant_message("I could not confirm the email went out; please check.")]])
                question = "Did it go out?"
            agent = Agent(name="mailer", model=model, tools=[send_email])
            hooks = None if mode == "crash-nohooks" else DurableRunHooks(session)
            result = await Runner.run(agent, question, session=session, hooks=hooks)
            call = model.last_call
            print(json.dumps({"input": call.input if call else None, "output": result.final_output}), flush=True)

    anyio.run(run)


if __name__ == "__main__":
    main(*sys.argv[1:4])
