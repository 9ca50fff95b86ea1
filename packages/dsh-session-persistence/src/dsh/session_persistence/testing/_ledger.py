"""A deterministic cost ledger: what the commit path spends on the event loop, counted, never timed.

Times belong in the bench; counts are exact on every machine. While :meth:`CostLedger.counting` is active on the
running loop it counts:

* ``tasks``: tasks started (asyncio: the loop's task factory; trio: an instrument's ``task_spawned``);
* ``cancel_scopes``: anyio cancel scopes entered;
* ``events``: ``anyio.Event`` objects made;
* ``futures``: asyncio futures made by the loop (``loop.create_future``; always 0 on trio, whose waits park the task);
* ``handoffs``: calls of the watched backend's append primitives (``append_batch`` and ``submit_append_batch``):
  each is one hand-off of a batch to the backend's writer.

A backend author pins a live commit's cost with it: a steady-state barrier should cost 0 tasks, 0 cancel scopes,
0 events, at most one future and exactly one hand-off.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

__all__ = ["CostLedger", "tracked_reachable"]

B = TypeVar("B")


@dataclass
class CostLedger:
    """Counts of the event-loop machinery spent while :meth:`counting` is active (see the module doc)."""

    tasks: int = 0
    cancel_scopes: int = 0
    events: int = 0
    futures: int = 0
    handoffs: int = 0
    #: The async library the last :meth:`counting` block ran on (``"asyncio"`` or ``"trio"``; trio makes no futures).
    library: str = field(default="", init=False)
    _active: bool = field(default=False, init=False, repr=False)

    def counts(self) -> dict[str, int]:
        """The counts as a dict (for one exact comparison in a test)."""
        return {
            "tasks": self.tasks,
            "cancel_scopes": self.cancel_scopes,
            "events": self.events,
            "futures": self.futures,
            "handoffs": self.handoffs,
        }

    def reset(self) -> None:
        """Set every count back to zero."""
        self.tasks = self.cancel_scopes = self.events = self.futures = self.handoffs = 0

    def watch(self, backend: B) -> B:
        """Count ``backend``'s append hand-offs (wraps its ``append_batch`` and ``submit_append_batch`` on the
        instance); call it before the coordinator is built, which resolves the primitives once. Returns it."""
        for name in ("append_batch", "submit_append_batch"):
            original = getattr(backend, name, None)
            if original is not None:
                setattr(backend, name, self._counted_handoff(original))
        return backend

    def _counted_handoff(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._active:
                self.handoffs += 1
            return original(*args, **kwargs)

        return counted

    @contextmanager
    def counting(self) -> Iterator[CostLedger]:
        """Count on the running loop while the block runs (call it from inside the loop, asyncio or trio)."""
        with self._patched_anyio(), self._patched_loop():
            self._active = True
            try:
                yield self
            finally:
                self._active = False

    @contextmanager
    def _patched_anyio(self) -> Iterator[None]:
        scope_cls = type(anyio.CancelScope())
        enter = scope_cls.__enter__
        # anyio.Event() builds the backend's event in ``__new__`` (and Python then calls ``__init__`` on it once
        # more), so the one place that runs exactly once per event is the base class's ``__new__``.
        make_event = anyio.Event.__new__
        ledger = self

        def counted_enter(scope: Any) -> Any:
            if ledger._active:
                ledger.cancel_scopes += 1
            return enter(scope)

        def counted_new(cls: type[anyio.Event]) -> anyio.Event:
            if ledger._active:
                ledger.events += 1
            return make_event(cls)

        scope_cls.__enter__ = counted_enter  # type: ignore[method-assign]
        anyio.Event.__new__ = counted_new  # type: ignore[method-assign]
        try:
            yield
        finally:
            scope_cls.__enter__ = enter  # type: ignore[method-assign]
            anyio.Event.__new__ = make_event  # type: ignore[method-assign]

    @contextmanager
    def _patched_loop(self) -> Iterator[None]:
        trio = sys.modules.get("trio")
        if trio is not None:
            try:
                trio.lowlevel.current_trio_token()
            except RuntimeError:
                pass
            else:
                self.library = "trio"
                yield from self._on_trio(trio)
                return
        loop = asyncio.get_running_loop()
        self.library = "asyncio"
        yield from self._on_asyncio(loop)

    def _on_trio(self, trio: Any) -> Iterator[None]:
        ledger = self

        class Spawns(trio.abc.Instrument):  # type: ignore[misc]
            def task_spawned(self, task: object) -> None:
                if ledger._active:
                    ledger.tasks += 1

        instrument = Spawns()
        trio.lowlevel.add_instrument(instrument)
        try:
            yield
        finally:
            trio.lowlevel.remove_instrument(instrument)

    def _on_asyncio(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        factory = loop.get_task_factory()
        create_future = loop.create_future
        ledger = self

        def counted_task(target: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
            if ledger._active:
                ledger.tasks += 1
            if factory is not None:
                return factory(target, coro, **kwargs)
            return asyncio.Task(coro, loop=target, **kwargs)

        def counted_future() -> asyncio.Future[Any]:
            if ledger._active:
                ledger.futures += 1
            return create_future()

        loop.set_task_factory(counted_task)
        loop.create_future = counted_future  # type: ignore[method-assign]
        try:
            yield
        finally:
            loop.set_task_factory(factory)
            del loop.create_future


def tracked_reachable(root: object, old: set[int]) -> list[object]:
    """The garbage-collector-tracked objects reachable from ``root`` through objects whose ids are not in ``old``
    (take ``old`` as ``{id(o) for o in gc.get_objects()}`` before the work): what that work left for the collector.

    For footprint tests that pin how many tracked objects an in-flight write or a held lease keeps (counts, never
    times)."""
    found: list[object] = []
    seen: set[int] = set()
    stack: list[Any] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or id(obj) in old or not gc.is_tracked(obj):
            continue
        seen.add(id(obj))
        found.append(obj)
        stack.extend(gc.get_referents(obj))
    return found
