"""Child processes for the conformance kit's cross-process cases (started with ``multiprocessing``'s spawn).

Each function runs in its own process, builds its backend from a picklable zero-argument factory, and reports
through a ``multiprocessing`` queue as plain tuples: ``("ok", pid)``, ``("locked", pid, holder)``,
``("error", pid, text)``, or ``("materialized", pid, session_id)``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import anyio

from .._backends.protocol import SessionBackend, StorageMetadata
from .._coordinator.service import PersistenceCoordinator
from .._host.host import Host
from .._model.errors import SessionLockedError
from .._model.header import SESSION_FORMAT_VERSION, SessionHeader
from .._wire.codec import decode_event
from ._logs import one_turn_log

__all__ = ["churn_materializations", "write_and_hold"]

Factory = Callable[[], SessionBackend]


def write_and_hold(
    factory: Factory,
    session_id: str,
    header: dict[str, Any] | None,
    events: list[dict[str, Any]],
    start: Any,
    results: Any,
    release: Any,
) -> None:
    """Wait for ``start``, append ``events`` to ``session_id`` through a coordinator (``create`` first when a
    ``header`` is given), report, and when the append succeeded keep the coordinator (and so the writer lease)
    open until the parent closes (or writes to) the ``release`` pipe, or kills the process.

    ``release`` is the receiving end of a pipe, not a shared event: a process killed while waiting on a
    ``multiprocessing.Event`` would deadlock the parent's ``set()``."""
    anyio.run(_write_and_hold, factory, session_id, header, events, start, results, release)


async def _write_and_hold(
    factory: Factory,
    session_id: str,
    header: dict[str, Any] | None,
    events: list[dict[str, Any]],
    start: Any,
    results: Any,
    release: Any,
) -> None:
    pid = os.getpid()
    try:
        async with PersistenceCoordinator(Host(), factory()) as persistence:
            if start is not None:
                await anyio.to_thread.run_sync(start.wait)
            try:
                if header is not None:
                    await persistence.create(header)
                await persistence.append(session_id, [decode_event(e) for e in events])
            except SessionLockedError as exc:
                results.put(("locked", pid, exc.holder))
                return
            results.put(("ok", pid))
            await anyio.to_thread.run_sync(_wait_closed, release)
    except Exception as exc:  # reported to the parent, which fails the test with it
        results.put(("error", pid, f"{type(exc).__name__}: {exc}"))


def churn_materializations(factory: Factory, prefix: str, results: Any) -> None:
    """Materialize sessions ``<prefix>-0``, ``<prefix>-1``, ... straight through the backend's first-batch
    ``append_batch`` until killed, reporting each one that returned."""
    anyio.run(_churn, factory, prefix, results)


async def _churn(factory: Factory, prefix: str, results: Any) -> None:
    backend = factory()
    pid = os.getpid()
    index = 0
    while True:
        session_id = f"{prefix}-{index}"
        header = SessionHeader(version=SESSION_FORMAT_VERSION, id=session_id, created_at=1000, is_seeded=False)
        storage = StorageMetadata(header)
        await backend.append_batch(storage, one_turn_log(), False)
        results.put(("materialized", pid, session_id))
        index += 1


def _wait_closed(connection: Any) -> None:
    with contextlib.suppress(EOFError):
        connection.recv()
