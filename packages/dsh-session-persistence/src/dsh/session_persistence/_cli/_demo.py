"""``dsh-sessions demo``: an agent is SIGKILLed in the middle of a tool call, resumed, and explained.

The agent is scripted (no network, no key) unless ``--model NAME`` (with ``--base-url``/``--api-key`` or
``$OPENAI_BASE_URL``/``$OPENAI_API_KEY``) names a real model, served through the separately installed
OpenAI-compatible adapter (see ``_demo_model``). The story and the kill point are the same for both.

1. A child process (``python -m dsh.session_persistence._cli._demo_child``) runs the agent on the JSONL backend
   with the checkpoint policy; it completes turn 1 and dies inside turn 2's ``pay_deposit``, after the payment
   was written to the ledger (SIGKILL: no cleanup, no flush, nothing graceful).
2. This process reads the log (read-only) and says what a load will repair, then resumes the session: the cold
   load commits the repair, ``pay_deposit``'s reconciliation check finds the charge in the ledger by its call id,
   and the agent continues the cut turn (turn 3, naming turn 2) with no new user message: it sends the receipt.
3. It prints the repaired transcript, what each repair means, and the exact commands to look at it again.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

import anyio
import anyio.to_thread

from .._coordinator.service import PersistenceCoordinator
from .._host.reconcile import describe
from .._host.session import SessionStore
from .._loop.agent import AgentLoop
from .._model.events import ToolReconcile
from .._wire.codec import event_to_builtins
from ._context import load_host, select_backend
from ._demo_model import API_KEY_ENV, RealModel, adapter_factory, close_adapter, open_adapter, real_model
from ._demo_script import (
    KILL_MARKER,
    MODEL,
    PROVIDER,
    SESSION_ID,
    SYSTEM,
    DemoModel,
    demo_tools,
    resume_script,
)
from ._errors import EXIT_DEMO_FAILED, EXIT_OK, EXIT_UNAVAILABLE, CliError
from ._examine import SessionReport, closer_plan, examine
from ._io import Io
from ._output import write_json
from ._transcript import REPAIR_MEANINGS, render_transcript, transcript_entries

__all__ = ["cmd_demo"]

POLICY_PLUGIN = "session-checkpoint-policy"
READY_TIMEOUT_S = 60.0
#: A real model answers over the network: a bound for its two turns, not a promise about its speed.
REAL_READY_TIMEOUT_S = 300.0
POLL_S = 0.01


def _prepare_root(root: str) -> tuple[str, str, str]:
    """The session goes into ``root`` itself (so ``list`` on that root shows it) under a fresh id; the agent's
    work directory (its ledger and outbox) is a fresh temporary directory outside the root."""
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        session_id = f"{SESSION_ID}-{stamp}-{secrets.token_hex(2)}"
        work = tempfile.mkdtemp(prefix=f"dsh-demo-work-{stamp}-")  # 0700, never reused
    except OSError as exc:
        raise CliError(f"cannot prepare the demo under {root}: {exc.strerror or exc}", EXIT_UNAVAILABLE) from exc
    return root, work, session_id


def _child_log(work: str) -> str:
    try:
        with open(os.path.join(work, "child.log"), encoding="utf-8", errors="replace") as handle:
            lines = handle.read().strip().splitlines()
    except OSError:
        return ""
    return f" (child's last output: {lines[-1]})" if lines else ""


def _spawn(argv: list[str], log_path: str, env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)


def _read_marker(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


async def _run_and_kill(
    root: str, work: str, session_id: str, backend: str, choice: RealModel | None
) -> tuple[int, int]:
    """Start the child, wait for its marker, SIGKILL it; returns ``(pid, returncode)``."""
    kill = getattr(signal, "SIGKILL", None)
    if kill is None:
        raise CliError("the demo needs POSIX signals (SIGKILL); it does not run on this platform", EXIT_DEMO_FAILED)
    marker = os.path.join(work, "marker")
    argv = [
        sys.executable,
        "-m",
        "dsh.session_persistence._cli._demo_child",
        root,
        work,
        "--session-id",
        session_id,
        "--backend",
        backend,
    ]
    env: dict[str, str] | None = None
    limit = READY_TIMEOUT_S
    if choice is not None:
        argv += ["--model", choice.model] + ([] if choice.base_url is None else ["--base-url", choice.base_url])
        env = {**os.environ, API_KEY_ENV: choice.api_key}  # the key goes by environment, never on a command line
        limit = REAL_READY_TIMEOUT_S
    child = _spawn(argv, os.path.join(work, "child.log"), env)
    try:
        deadline = time.monotonic() + limit
        while True:
            if _read_marker(marker) == KILL_MARKER:
                break
            if child.poll() is not None:
                raise CliError(
                    f"the demo agent exited with {child.returncode} before its kill point{_child_log(work)}",
                    EXIT_DEMO_FAILED,
                )
            if time.monotonic() > deadline:
                raise CliError(
                    f"the demo agent did not reach its kill point in {limit:.0f}s{_child_log(work)}",
                    EXIT_DEMO_FAILED,
                )
            await anyio.sleep(POLL_S)
        child.send_signal(kill)
        returncode = await anyio.to_thread.run_sync(child.wait)
    finally:
        if child.poll() is None:
            child.kill()
            await anyio.to_thread.run_sync(child.wait)
    if returncode != -kill:
        raise CliError(f"the demo agent exited with {returncode}, expected death by SIGKILL", EXIT_DEMO_FAILED)
    return child.pid, returncode


def program() -> str:
    """How the user can run ``dsh-sessions`` again: the bare name when PATH finds this installation's script."""
    sibling = os.path.join(os.path.dirname(sys.executable), "dsh-sessions")
    found = shutil.which("dsh-sessions")
    if os.path.exists(sibling):
        if found is not None and os.path.realpath(found) == os.path.realpath(sibling):
            return "dsh-sessions"
        return sibling
    if found is not None:
        return "dsh-sessions"
    return f"{sys.executable} -m dsh.session_persistence._cli"


def _ledger(work: str) -> list[str]:
    ledger = os.path.join(work, "ledger")
    return sorted(os.listdir(ledger)) if os.path.isdir(ledger) else []


def _outbox(work: str) -> list[str]:
    outbox = os.path.join(work, "outbox")
    return sorted(os.listdir(outbox)) if os.path.isdir(outbox) else []


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _repairs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for entry in entries:
        code = entry.get("repair")
        if code is None:
            continue
        item = {"seq": entry["seq"], "code": code, "meaning": REPAIR_MEANINGS[code]}
        if entry["kind"] == "tool-result":
            item.update(callId=entry["callId"], name=entry["name"])
        else:
            item["turn"] = entry.get("turn")
        out.append(item)
    return out


async def cmd_demo(args: argparse.Namespace, base: str, io: Io) -> int:
    """Run the demo with its session stored in ``base`` (the resolved ``--root``) under a fresh id."""
    choice = real_model(args.model, args.base_url, args.api_key)
    if choice is not None:
        adapter_factory()  # a missing adapter is reported before anything is created or spawned
    host = load_host()
    _name, backend_cls = select_backend(host, "jsonl")
    if host.get_plugin(POLICY_PLUGIN) is None:
        raise CliError(
            "the demo needs the checkpoint policy: pip install dsh-session-checkpoint-policy", EXIT_UNAVAILABLE
        )
    root, work, session_id = _prepare_root(base)
    out = io.out
    human = not args.json
    if human:
        if choice is None:
            out.write("dsh sessions demo: a scripted agent (no network, no API key) on the JSONL backend\n")
        else:
            out.write(f"dsh sessions demo: {choice.describe()} (dsh-session-adapter-openai) on the JSONL backend\n")
        out.write(f"root: {root}\n")
        out.write(f"session: {session_id} (stored in that root: `dsh-sessions --root {root} list` shows it)\n")
        out.write(f"work: {work} (the agent's ledger and outbox)\n\n")
        out.write("1. The agent runs in a child process: turn 1 asks for the weather; turn 2 asks it to pay a\n")
        out.write("   20 EUR deposit (pay_deposit) and then email the receipt (send_receipt).\n")
        out.flush()
    pid, returncode = await _run_and_kill(root, work, session_id, args.child_backend, choice)
    charged = _ledger(work)
    if human:
        out.write(f"2. Inside pay_deposit, after the payment hit the ledger ({', '.join(charged) or 'nothing'}), the\n")
        out.write(f"   child (pid {pid}) was killed with SIGKILL (exit status {returncode}): no cleanup ran.\n")

    store = SessionStore(host)
    backend: Any = backend_cls(root)  # type: ignore[call-arg]
    async with PersistenceCoordinator(host, backend) as coordinator:
        before: SessionReport = await examine(coordinator, session_id)
        if before.status not in ("interrupted", "torn"):
            raise CliError(f"expected an interrupted session after the kill, found {before.status}", EXIT_DEMO_FAILED)
        if human:
            out.write(f"   On disk: {before.stored_events} events, turn 2 still open. A load will:\n")
            for line in closer_plan(before):
                out.write(f"     - {line}\n")
            out.write("3. Resuming: the cold load commits that repair; pay_deposit's check looks the charge\n")
            out.write("   up in the ledger by its call id; then the agent continues turn 2 (as turn 3), with no\n")
            out.write("   new user message.\n")
            out.flush()
        model: Any = DemoModel(resume_script()) if choice is None else open_adapter(choice)
        try:
            names: dict[str, Any] = {"provider": PROVIDER, "model": MODEL} if choice is None else {}
            loop = await AgentLoop.resume(
                host, store, coordinator, session_id, model, demo_tools(work), system=SYSTEM, **names
            )
            findings = [event_to_builtins(e)["data"] for e in loop.session.events if type(e) is ToolReconcile]
            if loop.interrupted_turn is None:
                raise CliError("the resumed session has no interrupted turn to continue", EXIT_DEMO_FAILED)
            end = await loop.continue_interrupted()
            await store.flush(loop.session)
            loop.close()
            store.dispose(loop.session)
        finally:
            await close_adapter(model)
        after = await examine(coordinator, session_id)
    if end.reason.error is not None:
        failure = end.reason.error
        raise CliError(f"the model failed in the resumed turn: {failure.code}: {failure.message}", EXIT_DEMO_FAILED)
    # The scripted model checks the ledger; a real model decides for itself, so its charges are reported, not judged.
    if after.status != "ok" or (choice is None and len(_ledger(work)) != 1):
        raise CliError(f"the resumed session is {after.status} with {len(_ledger(work))} charges", EXIT_DEMO_FAILED)
    entries = transcript_entries(after.events, after.stored_events)
    repairs = _repairs(entries)
    run = program()
    commands = [f"{run} --root {root} list", f"{run} --root {root} show {session_id}", f"{run} --root {root} verify"]
    if args.json:
        write_json(
            out,
            {
                "root": root,
                "sessionId": session_id,
                "work": work,
                "model": None if choice is None else {"model": choice.model, "baseUrl": choice.base_url},
                "child": {"pid": pid, "returncode": returncode, "signal": "SIGKILL"},
                "charges": len(_ledger(work)),
                "resumedTurnEnd": end.reason.kind,
                "continuedTurn": {"turn": end.turn, "interruptedTurn": end.turn - 1},
                "reconciled": findings,
                "events": after.stored_events,
                "repairs": repairs,
                "entries": entries,
                "commands": commands,
            },
        )
        return EXIT_OK
    out.write(f"\nThe repaired transcript ({after.stored_events} events; chunks and request headers not shown):\n")
    render_transcript(out, entries)
    out.write("\nWhat the repairs mean:\n")
    for item in repairs:
        what = f"{item['name']} [{item['callId']}]" if "callId" in item else f"turn {item['turn']}"
        out.write(f"  {item['code']}: {what}\n")
        out.write(textwrap.fill(item["meaning"], 100, initial_indent="    ", subsequent_indent="    ") + "\n")
    out.write("\nWhat the resume found out:\n")
    for finding in findings:
        out.write(f"  {describe(finding)}\n")
    out.write(f"  turn {end.turn} continued the interrupted turn {end.turn - 1} and ended {end.reason.kind}\n")
    if choice is None:
        out.write(
            f"\nThe ledger holds {len(_ledger(work))} charge: the check found the deposit charged once, the agent\n"
            "continued the cut turn without a new message and sent the receipt that had certainly never been sent.\n"
        )
    else:
        charges, receipts = len(_ledger(work)), len(_outbox(work))
        out.write(
            f"\nThe model was told what the ledger check found and chose what to do: the ledger holds {charges}\n"
            f"charge(s) and the outbox {receipts} receipt(s) ({end.reason.kind} turn {end.turn}: "
            f"{_one_line(end.text)}).\n"
        )
    out.write("\nLook at it yourself:\n")
    for command in commands:
        out.write(f"  {command}\n")
    return EXIT_OK
