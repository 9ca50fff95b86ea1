"""The recorded session of the crash-state harness, run in a child process with the trace shim preloaded.

    python -m dsh.session_persistence.testing._crash_driver FACTORY ROOT ACKS EPOCHS [--sys-path P ...]

``FACTORY`` is ``module:callable``; ``callable(root, **KWARGS)`` (``--kwargs`` JSON) returns a new backend over
``root``. Through public API
only, the child: materializes a live session with its first batch, appends two more batches (the last leaves
its turn open), closes; reopens and ``load``s (crash repair commits the closers); adopts the session live and
``truncate``s it to its first turn when the backend can rewrite, then appends again. After every call that
acknowledged durability it appends the epoch number to ``ACKS`` (one traced write, so the trace shows where
each acknowledgement happened) and at the end writes ``EPOCHS``: for each epoch, its kind (``append`` or
``rewrite``) and the stored log it acknowledged, as wire JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from .._coordinator.service import PersistenceCoordinator
from .._host.host import Host
from .._host.session import SessionStore
from .._model.events import SessionEvent
from .._wire.codec import encode_event
from ._crash_common import SESSION_ID, load_factory
from ._logs import meta, simple_turn, step_start, turn_start, user_message

__all__ = ["main"]

NEVER_MS = 2_147_483_647


def _wire(events: Sequence[SessionEvent]) -> list[str]:
    return [encode_event(e).decode() for e in events]


class _Acks:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.epochs: list[dict[str, Any]] = []

    def ack(self, kind: str, events: Sequence[SessionEvent]) -> None:
        self.epochs.append({"kind": kind, "events": _wire(events)})
        os.write(self._fd, f"{len(self.epochs) - 1}\n".encode())


async def _aclose(backend: Any) -> None:
    close = getattr(backend, "aclose", None)
    if close is not None:
        await close()


async def run(factory: Callable[[str], Any], root: str, acks: _Acks) -> None:
    header = meta(SESSION_ID)
    host = Host()
    store = SessionStore(host)
    async with PersistenceCoordinator(host, factory(root), write_batch_max_delay_ms=NEVER_MS):
        session = store.create(SESSION_ID, meta=header)
        for batch in (
            simple_turn(0, 1, "first turn " * 40),
            simple_turn(3, 2, "second turn " * 400),  # spans pages: dropped and reordered blocks
            [turn_start(6, 3), step_start(7, 3, 1), user_message(8, "an open turn")],
        ):
            for e in batch:
                session.append_event(e)
            await store.flush(session)
            acks.ack("append", session.events)
        store.dispose(session)
    host = Host()
    store = SessionStore(host)
    backend = factory(root)
    async with PersistenceCoordinator(host, backend, write_batch_max_delay_ms=NEVER_MS) as coordinator:
        repaired = await coordinator.load(SESSION_ID)
        acks.ack("append", repaired.events)
        if getattr(backend, "rewrite", None) is None:
            return
        session = store.create(SESSION_ID, meta=repaired.meta, seed=list(repaired.events))
        await store.flush(session)  # adoption appends the session's end-of-seed marker
        acks.ack("append", session.events)
        await coordinator.truncate(session, 3)
        session.truncate(3)
        acks.ack("rewrite", session.events)
        for e in simple_turn(3, 2, "second turn, again"):
            session.append_event(e)
        await store.flush(session)
        acks.ack("append", session.events)
        store.dispose(session)


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("factory")
    parser.add_argument("root")
    parser.add_argument("acks")
    parser.add_argument("epochs")
    parser.add_argument("--sys-path", action="append", default=[])
    parser.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments for the factory")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args(argv)
    factory = load_factory(args.factory, args.sys_path, json.loads(args.kwargs))
    acks = _Acks(args.acks)
    anyio.run(run, factory, args.root, acks, backend=args.backend)
    Path(args.epochs).write_text(json.dumps(acks.epochs))


if __name__ == "__main__":
    main(sys.argv[1:])
