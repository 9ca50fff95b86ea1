"""Sticky-failure child: one EIO below Python on the first append of a resumed, seeded or forked session.

Usage: ``python sticky_child.py <root> <scenario> <report> [--backend asyncio|trio] [--persistent]``

Run with the LD_PRELOAD shim preloaded and no fault armed. The child prepares what the scenario starts from
(a stored session for ``resume``/``seed-stored``, a live flushed source for ``fork``), then arms one EIO on the
first ``write`` into the target session's log (its staging file included) and binds the session:

* ``resume``: ``AgentLoop.resume`` of the stored session (its first append is ``session/end-seed``);
* ``seed-stored``: ``load`` then ``store.create(seed=view.events)``, what ``resume`` does without a loop;
* ``seed-new``: ``store.create(seed=...)`` of an id nothing has stored (its first append materializes it);
* ``fork``: ``store.fork`` of the live source (the child's first append materializes it with its seed).

Then it flushes; appends a turn (``resume``: runs a turn through the loop) and flushes; disposes the session and
closes the coordinator. With ``--persistent`` the fault is never healed (every write into the log fails): the
flushes must fail typed and the close must raise a typed ``SessionPersistenceError``. The report (JSON) lists
every step's outcome (the error's class and MRO names when it failed), the target id, and the session's events
as wire JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio
from dsh.session_persistence import Host, PersistenceCoordinator, Session, SessionStore
from dsh.session_persistence.backend import SessionEvent, encode_event
from dsh.session_persistence.loop import AgentLoop, TurnResult
from dsh.session_persistence.testing import FaultRule, ScriptedAdapter, TextResponse, fault_spec, meta, simple_turn
from dsh.session_persistence_jsonl import JsonlBackend

SOURCE_ID = "sticky-source"
SCENARIOS = ("resume", "seed-stored", "seed-new", "fork")


def target_id(scenario: str) -> str:
    """The session the fault is armed for."""
    return {"resume": SOURCE_ID, "seed-stored": SOURCE_ID, "seed-new": "sticky-seeded", "fork": "sticky-child"}[
        scenario
    ]


def wire(events: Iterable[SessionEvent]) -> list[str]:
    return [encode_event(e).decode() for e in events]


def outcome(exc: BaseException | None) -> dict[str, Any]:
    if exc is None:
        return {"ok": True}
    return {
        "ok": False,
        "type": type(exc).__name__,
        "mro": [cls.__name__ for cls in type(exc).__mro__],
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:],
    }


def completed(result: TurnResult) -> None:
    """A turn that did not complete is a failed step (the loop reports a flush failure in the turn's result)."""
    if result.reason.kind != "completed":
        raise RuntimeError(f"the resumed turn ended {result.reason}")


def adapter() -> ScriptedAdapter:
    return ScriptedAdapter([TextResponse("resumed and answered")], provider="scripted", model="scripted-1")


async def write_source(root: Path) -> None:
    """A stored, closed session with one complete turn (a separate coordinator, no fault armed)."""
    host = Host()
    store = SessionStore(host)
    async with PersistenceCoordinator(host, JsonlBackend(root)):
        session = store.create(SOURCE_ID, meta=meta(SOURCE_ID))
        for e in simple_turn(0, 1, "stored turn"):
            session.append_event(e)
        await store.flush(session)
        store.dispose(session)


async def run(args: argparse.Namespace, report: dict[str, Any]) -> None:
    root = Path(args.root)
    scenario = args.scenario
    if scenario in ("resume", "seed-stored"):
        await write_source(root)
    backend = JsonlBackend(root)
    target = target_id(scenario)
    log = backend.locate(meta(target)).path
    assert log is not None
    count = 0 if args.persistent else 1
    spec = fault_spec([FaultRule(ops=("write",), path=log, count=count)])
    host = Host()
    host.load_entrypoints()  # the checkpoint policy: a resumed loop's turn flushes at its boundaries
    store = SessionStore(host)
    report["target"] = target
    session: Session | None = None

    async def step(name: str, action: Any) -> None:
        try:
            await action()
        except Exception as exc:  # every failure is reported, the parent judges its type
            report["steps"].append({"step": name, **outcome(exc)})
        else:
            report["steps"].append({"step": name, "ok": True})
        if session is not None:
            report["events"] = wire(session.events)

    try:
        async with PersistenceCoordinator(host, backend, write_batch_max_delay_ms=2_147_483_647) as coordinator:
            if scenario == "fork":
                source = store.create(SOURCE_ID, meta=meta(SOURCE_ID))
                for e in simple_turn(0, 1, "source turn"):
                    source.append_event(e)
                await store.flush(source)
            os.environ["DSH_SHIM_FAULT"] = spec
            loop: AgentLoop | None = None
            if scenario == "resume":
                loop = await AgentLoop.resume(host, store, coordinator, SOURCE_ID, adapter())
                session = loop.session
            elif scenario == "seed-stored":
                view = await coordinator.load(SOURCE_ID)
                session = store.create(
                    SOURCE_ID, seed=view.events, meta=view.meta, inherited_event_count=view.inherited_event_count
                )
            elif scenario == "seed-new":
                session = store.create(target, seed=simple_turn(0, 1, "seeded turn"), meta=meta(target))
            else:
                session = store.fork(SOURCE_ID, child_id=target)
            live = session
            await step("flush", lambda: store.flush(live))
            if loop is not None:
                resumed = loop

                async def turn() -> None:
                    completed(await resumed.run_turn("and now?"))

                await step("turn", turn)
                await step("flush-after-turn", lambda: store.flush(live))
                loop.close()
            else:
                first = len(live.events)
                for e in simple_turn(first, 2, "live turn"):
                    live.append_event(e)
                await step("append-flush", lambda: store.flush(live))
            store.dispose(live)
    except BaseException as exc:  # the close: reported, judged by the parent
        report["steps"].append({"step": "close", **outcome(exc)})
    else:
        report["steps"].append({"step": "close", "ok": True})
    finally:
        os.environ["DSH_SHIM_FAULT"] = ""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("root")
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("report")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--persistent", action="store_true")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"steps": [], "events": [], "target": None}
    anyio.run(run, args, report, backend=args.backend)
    Path(args.report).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
