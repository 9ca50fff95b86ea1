"""Child side of the kit's faults *inside* a primitive, run with the LD_PRELOAD shim preloaded.

    python -m dsh.session_persistence.testing._primitive_driver MODE FACTORY ROOT REPORT [options]

``first-append``: the first ``append_batch`` of a new session, with the shim failing the ``--nth`` durable
call under ``ROOT`` (``--count`` calls, 0 = every later one: a dead disk); ``--nth 0`` arms nothing.
``cancel``: after a first batch, a second ``append_batch`` runs in a cancel scope; the shim pauses its first
write under ``ROOT`` until ``--release`` exists; the child cancels the scope, lets every task settle
(``anyio.wait_all_tasks_blocked``), notes whether the cancelled call already returned, then releases the write.
The report (JSON) holds the outcome; the parent reloads the storage with a fresh backend and judges.
"""
# A test child: stat-polling a marker file the shim creates from a worker thread (no event can tell us).
# ruff: noqa: ASYNC110, ASYNC240

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from .._backends.protocol import StorageMetadata
from ._crash_common import SESSION_ID, load_factory
from ._logs import meta, simple_turn
from ._shim import OPS, FaultRule, fault_spec

__all__ = ["main"]

DURABLE_OPS = tuple(sorted(OPS))


def _outcome(exc: BaseException | None) -> dict[str, Any]:
    if exc is None:
        return {"ok": True}
    return {"ok": False, "type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__], "text": str(exc)}


async def first_append(backend: Any, root: str, nth: int, count: int, report: dict[str, Any]) -> None:
    storage = StorageMetadata(meta(SESSION_ID), 0)
    if nth:
        os.environ["DSH_SHIM_FAULT"] = fault_spec([FaultRule(DURABLE_OPS, path=root, nth=nth, count=count)])
    try:
        await backend.append_batch(storage, simple_turn(0, 1, "first batch"), False)
    except Exception as exc:  # judged by the parent
        report["append"] = _outcome(exc)
    else:
        report["append"] = _outcome(None)
    finally:
        os.environ["DSH_SHIM_FAULT"] = ""


async def cancel(backend: Any, root: str, release: str, report: dict[str, Any]) -> None:
    storage = StorageMetadata(meta(SESSION_ID), 0)
    await backend.append_batch(storage, simple_turn(0, 1, "first batch"), False)
    os.environ["DSH_SHIM_FAULT"] = fault_spec([FaultRule(("write", "pwrite"), path=root, pause=release)])
    returned = anyio.Event()
    scopes: list[anyio.CancelScope] = []

    async def victim() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            try:
                await backend.append_batch(storage, simple_turn(3, 2, "second batch"), True)
                report["append"] = "completed"
            except anyio.get_cancelled_exc_class():
                report["append"] = "cancelled"
                raise
            except Exception as exc:  # judged by the parent
                report["append"] = _outcome(exc)
        returned.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(victim)
        while not os.path.exists(release + ".paused") and not returned.is_set():
            await anyio.sleep(0.005)  # polling a marker file, never a timing assertion
        report["paused"] = os.path.exists(release + ".paused")
        scopes[0].cancel()
        await anyio.wait_all_tasks_blocked()
        report["returned_while_paused"] = returned.is_set()
        os.environ["DSH_SHIM_FAULT"] = ""
        Path(release).write_bytes(b"")
    report["returned"] = returned.is_set()


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("mode", choices=["first-append", "cancel"])
    parser.add_argument("factory")
    parser.add_argument("root")
    parser.add_argument("report")
    parser.add_argument("--sys-path", action="append", default=[])
    parser.add_argument("--kwargs", default="{}")
    parser.add_argument("--nth", type=int, default=0)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--release", default="")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args(argv)
    backend = load_factory(args.factory, args.sys_path, json.loads(args.kwargs))(args.root)
    report: dict[str, Any] = {}

    async def run() -> None:
        try:
            if args.mode == "first-append":
                await first_append(backend, args.root, args.nth, args.count, report)
            else:
                await cancel(backend, args.root, args.release, report)
        finally:
            close = getattr(backend, "aclose", None)
            if close is not None:
                await close()

    try:
        anyio.run(run, backend=args.backend)
    finally:
        Path(args.report).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
