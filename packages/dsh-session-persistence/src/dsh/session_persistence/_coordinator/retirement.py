"""Retirement: what happens when a live Session is disposed, and the coordinator's quiescent teardown.

A disposed Session's final drain runs in the coordinator's task group (the ``retirements`` record lets readers
of the id wait for it); when it is done the Session's state is dropped on the id's chain and, with no state
left for the id, its writer lease is released. Teardown flushes every live Session, waits until every chain
and retirement is idle, then releases the remaining leases.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

import anyio

from .._host.session import Session
from .state import CoordinatorCore, Outcome

__all__ = ["Retirement"]

# Retirement is written against these shapes of the live path (``live_path.LivePath`` and its ``Live`` entries),
# not against that module: the two stand side by side under the service in the import graph.


class _Writes(Protocol):
    @property
    def has_work(self) -> bool: ...


class LiveEntry(Protocol):
    """One live Session's persistence, as retirement reads it."""

    @property
    def init(self) -> Outcome: ...

    @property
    def writes(self) -> _Writes: ...


E = TypeVar("E", bound=LiveEntry)


class LiveSessions(Protocol[E]):
    """The live path, as retirement uses it: its entries by Session, and its flush."""

    live: dict[Session, E]

    def flush(self, session: Session) -> Awaitable[None]: ...


Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]

_logger = logging.getLogger("dsh.session_persistence")


class Retirement(Generic[E]):
    """Disposal of live Sessions and the final drain of one coordinator."""

    def __init__(self, core: CoordinatorCore, live: LiveSessions[E], spawn: Spawn) -> None:
        self.core = core
        self.live = live
        self.spawn = spawn

    async def wait(self, session_id: str) -> None:
        """Wait for a pending retirement of ``session_id`` (readers must not race its final drain)."""
        await self.core.wait_retired(session_id)

    def on_disposed(self, session: Session) -> None:
        """The ``session_disposed`` hook: start the Session's final drain in the background."""
        if session not in self.live.live:
            return
        retirements = self.core.retirements
        record = Outcome()
        retirements[session.id] = record

        async def retire() -> None:
            try:
                await self.retire(session)
            except Exception as exc:
                _logger.warning('%s: session "%s" retirement failed: %s', self.core.name, session.id, exc)
            finally:
                if retirements.get(session.id) is record:
                    del retirements[session.id]
                record.settle()

        try:
            self.spawn(retire)
        except BaseException:
            del retirements[session.id]
            record.settle()
            raise

    async def retire(self, session: Session) -> None:
        """Flush the Session, then drop its state and (with no state left for the id) its lease.

        A failed final flush keeps the Session's controller, so the teardown drain tries once more.
        """
        core = self.core
        entry = self.live.live.get(session)
        try:
            await self.live.flush(session)
        except Exception as exc:
            if not _never_bound(entry, exc):
                raise
            # It never bound to storage (an id collision, a held lease; its owner saw that error) and nothing was
            # appended to it: nothing is lost, so it is dropped like a retired Session instead of failing teardown.
        session_id = session.id

        async def drop() -> None:
            self.live.live.pop(session, None)
            state = core.states.get(session_id)
            if state is not None and state.owner is session:
                del core.states[session_id]
            if session_id not in core.states:
                await core.leases.release(session_id)

        await core.chains.run(session_id, drop)

    async def drain(self, errors: builtins.list[Exception]) -> None:
        """Flush every live Session (collecting failures in ``errors``) and wait until everything is idle."""
        results: dict[int, Exception] = {}

        async def flush_one(index: int, session: Session) -> None:
            entry = self.live.live.get(session)  # before the flush: a concurrent retirement may drop it
            if entry is None:
                # Its retirement ran first and dropped it, which it does only after its final flush: done.
                return
            try:
                await self.live.flush(session)
            except Exception as exc:
                store = self.core.host.sessions
                disposed = store is None or not store.is_live(session)
                if not (disposed and _never_bound(entry, exc)):
                    results[index] = exc

        sessions = list(self.live.live)
        if sessions:
            async with anyio.create_task_group() as tg:
                for index, session in enumerate(sessions):
                    tg.start_soon(flush_one, index, session)
        errors.extend(results[i] for i in sorted(results))
        # Wait until every chain is idle; new ops (retirements, detached appends) may enqueue meanwhile.
        retirements = self.core.retirements
        while retirements or self.core.chains.queues:
            if retirements:
                await next(iter(retirements.values())).wait_settled()
            else:
                await self.core.chains.wait_idle_step()


def _never_bound(entry: LiveEntry | None, exc: Exception) -> bool:
    """Whether ``exc`` is the Session's own failed initialization and no event of it is waiting to be written."""
    return entry is not None and entry.init.error is exc and not entry.writes.has_work
