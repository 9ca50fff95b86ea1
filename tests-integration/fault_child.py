"""Fault child: a real coordinator + JSONL session driven through one fault injected below Python.

Usage: ``python fault_child.py <root> <compression> <scenario> <report> [--backend asyncio|trio]``

Run with the LD_PRELOAD shim (``dsh.session_persistence.testing`` builds it) preloaded and no fault armed. The
child writes turn 1 and flushes it; arms the scenario's fault (``DSH_SHIM_FAULT``) and writes turn 2 (a live
flush, or for ``truncate-*`` a ``truncate`` of turn 1's tail); heals the fault and flushes again; writes turn
3 and flushes; then closes everything. The report (JSON) lists every step's outcome (the error's class and
its MRO names when a step failed) and the events acknowledged (every flush that returned), as wire JSON.
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
from dsh.session_persistence.testing import FaultRule, fault_spec, meta, simple_turn
from dsh.session_persistence_jsonl import JsonlBackend

SESSION_ID = "faulted"


def scenarios(session_dir: str, log_name: str) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """Scenario name -> (the step the fault is armed for, the shim rules as dicts)."""
    log = os.path.join(session_dir, log_name)
    return {
        # The first batch publishes header + batch: staging file, fsync, link, directory fsync.
        "materialize-write-eio": ("first", [{"ops": ["write"], "path": session_dir}]),
        "materialize-fsync-enospc": ("first", [{"ops": ["fsync"], "path": session_dir, "errno": "ENOSPC"}]),
        "materialize-link-eio": ("first", [{"ops": ["link"], "path": session_dir}]),
        "materialize-dirfsync-after-link": ("first", [{"ops": ["dirfsync"], "path": session_dir}]),
        # Later batches: append + fsync, rolled back with ftruncate on failure.
        "append-write-eio": ("append", [{"ops": ["write"], "path": log}]),
        "append-write-enospc": ("append", [{"ops": ["write"], "path": log, "errno": "ENOSPC"}]),
        "append-write-landed-eio": ("append", [{"ops": ["write"], "path": log, "after": True}]),
        "append-fsync-eio": ("append", [{"ops": ["fsync"], "path": log}]),
        "append-fsync-landed-eio": ("append", [{"ops": ["fsync"], "path": log, "after": True}]),
        "append-fsync-eio-rollback-ftruncate-eio": (
            "append",
            [{"ops": ["fsync"], "path": log, "after": True}, {"ops": ["ftruncate"], "path": log}],
        ),
        "append-write-landed-rollback-ftruncate-enospc": (
            "append",
            [{"ops": ["write"], "path": log, "after": True}, {"ops": ["ftruncate"], "path": log, "errno": "ENOSPC"}],
        ),
        # A failed sync proves nothing: while every sync of the log fails (and the rollback too), no flush of the
        # batch may be acknowledged, the armed retry included; likewise while every directory sync fails after
        # the first batch's link.
        "append-fsync-always-eio-rollback-ftruncate-eio": (
            "append",
            [{"ops": ["fsync"], "path": log, "count": 0}, {"ops": ["ftruncate"], "path": log, "count": 0}],
        ),
        "materialize-dirfsync-always-eio-after-link": (
            "first",
            [{"ops": ["dirfsync"], "path": session_dir, "count": 0}],
        ),
        # truncate (rewrite): staging file, fsync, rename, directory fsync.
        "truncate-fsync-eio": ("truncate", [{"ops": ["fsync"], "path": session_dir}]),
        "truncate-rename-eio": ("truncate", [{"ops": ["rename"], "path": session_dir}]),
        "truncate-dirfsync-after-rename": ("truncate", [{"ops": ["dirfsync"], "path": session_dir}]),
    }


#: Scenarios whose fault stays armed for one more flush of the failed step (the retry must fail as well).
PERSISTENT = frozenset({"append-fsync-always-eio-rollback-ftruncate-eio", "materialize-dirfsync-always-eio-after-link"})


def rule_spec(rule: dict[str, Any]) -> str:
    return fault_spec([FaultRule(**{**rule, "ops": tuple(rule["ops"])})])


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


def append_all(session: Session, events: Iterable[SessionEvent]) -> None:
    for e in events:
        session.append_event(e)


async def run(args: argparse.Namespace, report: dict[str, Any]) -> None:
    root = Path(args.root)
    backend = JsonlBackend(root, compression=args.compression)
    header = meta(SESSION_ID)
    location = backend.locate(header).path
    assert location is not None
    table = scenarios(os.path.dirname(location), os.path.basename(location))
    arm_at, rules = table[args.scenario]
    spec = "|".join(rule_spec(r) for r in rules)
    host = Host()
    store = SessionStore(host)

    def arm() -> None:
        os.environ["DSH_SHIM_FAULT"] = spec

    def heal() -> None:
        os.environ["DSH_SHIM_FAULT"] = ""

    async def step(name: str, action: Any, session: Session) -> bool:
        try:
            await action()
        except Exception as exc:  # every failure is reported, the parent judges its type
            report["steps"].append({"step": name, **outcome(exc)})
            return False
        report["steps"].append({"step": name, "ok": True})
        report["acked"] = wire(session.events)
        return True

    async with PersistenceCoordinator(host, backend, write_batch_max_delay_ms=2_147_483_647) as coordinator:
        session = store.create(SESSION_ID, meta=header)
        turn1 = simple_turn(0, 1, "first turn")
        turn2 = simple_turn(3, 2, "second turn")
        turn3 = simple_turn(6, 3, "third turn")
        if arm_at == "first":
            arm()
        append_all(session, turn1)
        await step("turn1", lambda: store.flush(session), session)
        if arm_at == "first" and args.scenario in PERSISTENT:
            await step("turn1-armed-again", lambda: store.flush(session), session)
        heal()
        if arm_at == "append":
            arm()
        if arm_at == "truncate":
            append_all(session, turn2)
            await step("turn2", lambda: store.flush(session), session)
            arm()

            async def cut() -> None:
                await coordinator.truncate(session, 3)
                session.truncate(3)

            if not await step("truncate", cut, session):
                heal()
                await step("truncate-retry", cut, session)
            heal()
            if len(session.events) == 3:
                append_all(session, turn2)
        else:
            append_all(session, turn2)
            await step("turn2", lambda: store.flush(session), session)
            if args.scenario in PERSISTENT:
                await step("turn2-armed-again", lambda: store.flush(session), session)
        heal()
        await step("retry", lambda: store.flush(session), session)
        if len(session.events) == 6:
            append_all(session, turn3)
            await step("turn3", lambda: store.flush(session), session)
        store.dispose(session)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("root")
    parser.add_argument("compression", choices=["zstd", "none"])
    parser.add_argument("scenario")
    parser.add_argument("report")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"steps": [], "acked": []}
    try:
        anyio.run(run, args, report, backend=args.backend)
    except BaseException as exc:  # the close itself failed: still report what happened
        report["steps"].append({"step": "close", **outcome(exc)})
    os.environ["DSH_SHIM_FAULT"] = ""
    Path(args.report).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
