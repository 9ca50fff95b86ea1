"""Deferred (inert awaitable, close propagation) and CancelSignal (cooperative, first cause wins)."""

from __future__ import annotations

import gc
import inspect
import warnings
from collections.abc import Awaitable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from dsh.session_persistence._host.boundaries import CancelSignal, Deferred, TurnAborted


@contextmanager
def never_awaited_warnings() -> Iterator[list[str]]:
    """Collect "coroutine ... was never awaited" warnings raised until the block ends (after a gc)."""
    found: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield found
        gc.collect()
    found.extend(str(w.message) for w in caught if "never awaited" in str(w.message))


async def terminal(log: list[str]) -> str:
    log.append("terminal")
    return "result"


async def passthrough(inner: Awaitable[str], log: list[str], label: str) -> str:
    log.append(f"{label}:start")
    value = await inner
    log.append(f"{label}:end")
    return value


class Suspend:
    """Yields control once to whoever drives the coroutine (lets a test hold it mid-flight)."""

    def __await__(self) -> Generator[Any, None, None]:
        yield


# --- Deferred ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_deferred_runs_nothing_until_awaited() -> None:
    log: list[str] = []
    called: list[tuple[object, ...]] = []

    async def fn(inner: Awaitable[str], a: int, *, b: str) -> str:
        called.append((a, b))
        return await inner

    deferred = Deferred(fn, terminal(log), 1, b="two")
    assert log == []
    assert called == []
    assert await deferred == "result"
    assert called == [(1, "two")]
    assert log == ["terminal"]


@pytest.mark.anyio
async def test_nested_deferred_chain_runs_outer_first() -> None:
    log: list[str] = []
    chain = Deferred(passthrough, Deferred(passthrough, terminal(log), log, "inner"), log, "outer")
    assert await chain == "result"
    assert log == ["outer:start", "inner:start", "terminal", "inner:end", "outer:end"]


def test_dropping_an_unawaited_coroutine_warns_control() -> None:
    # Control for the tests below: the detector does see a leaked terminal coroutine.
    with never_awaited_warnings() as found:
        coro = terminal([])
        del coro
    assert len(found) == 1


def test_close_before_start_closes_the_inner_coroutine() -> None:
    log: list[str] = []
    with never_awaited_warnings() as found:
        deferred = Deferred(passthrough, terminal(log), log, "outer")
        deferred.close()
        del deferred
    assert found == []
    assert log == []


def test_close_propagates_through_nested_deferreds() -> None:
    log: list[str] = []
    with never_awaited_warnings() as found:
        innermost = terminal(log)
        chain = Deferred(
            passthrough, Deferred(passthrough, Deferred(passthrough, innermost, log, "1"), log, "2"), log, "3"
        )
        chain.close()
        assert inspect.getcoroutinestate(innermost) == inspect.CORO_CLOSED  # closed, not merely unreferenced
        del chain, innermost
    assert found == []
    assert log == []


def test_dropping_an_unclosed_chain_warns_control() -> None:
    # Control: without close() the terminal coroutine leaks, which is what close() prevents.
    with never_awaited_warnings() as found:
        chain = Deferred(passthrough, Deferred(passthrough, terminal([]), [], "inner"), [], "outer")
        del chain
    assert len(found) == 1


@pytest.mark.anyio
async def test_close_is_idempotent_and_forbids_a_later_await() -> None:
    deferred = Deferred(passthrough, terminal([]), [], "x")
    deferred.close()
    deferred.close()
    with pytest.raises(RuntimeError, match="already closed"):
        await deferred


@pytest.mark.anyio
async def test_a_deferred_is_awaitable_once() -> None:
    deferred = Deferred(passthrough, terminal([]), [], "x")
    assert await deferred == "result"
    with pytest.raises(RuntimeError, match="already started"):
        await deferred


def test_close_after_start_closes_the_running_function() -> None:
    log: list[str] = []

    async def held(inner: Awaitable[str]) -> str:
        try:
            await Suspend()
            return await inner
        finally:
            log.append("finally")
            if hasattr(inner, "close"):
                inner.close()

    deferred = Deferred(held, terminal(log))
    driver = deferred.__await__()
    next(driver)  # now suspended inside held()
    with never_awaited_warnings() as found:
        deferred.close()
        assert log == ["finally"]  # closed by close() itself, not later by the garbage collector
        del driver, deferred
    assert found == []


@pytest.mark.anyio
async def test_fn_failing_before_it_owns_inner_still_closes_inner() -> None:
    def not_async(inner: Awaitable[str]) -> Awaitable[str]:
        raise ValueError("bad wrapper")

    with never_awaited_warnings() as found, pytest.raises(ValueError, match="bad wrapper"):
        await Deferred(not_async, terminal([]))
    assert found == []


@pytest.mark.anyio
async def test_deferred_runs_on_the_current_backend() -> None:
    async def sleepy(inner: Awaitable[str]) -> str:
        await anyio.lowlevel.checkpoint()
        return await inner

    assert await Deferred(sleepy, terminal([])) == "result"


# --- CancelSignal --------------------------------------------------------------------------------


def test_signal_can_be_built_outside_an_event_loop() -> None:
    signal = CancelSignal()
    assert not signal.aborted
    assert signal.reason is None
    signal.raise_if_aborted()  # no-op


def test_first_cause_wins() -> None:
    signal = CancelSignal()
    parent, user = {"kind": "parent"}, {"kind": "user"}
    assert signal.abort(parent) is True
    assert signal.abort(user) is False
    assert signal.aborted
    assert signal.reason is parent
    with pytest.raises(TurnAborted) as info:
        signal.raise_if_aborted()
    assert info.value.reason is parent
    assert "parent" in str(info.value)


@pytest.mark.anyio
async def test_wait_returns_once_aborted() -> None:
    signal = CancelSignal()
    woke: list[object] = []

    async def waiter() -> None:
        await signal.wait()
        woke.append(signal.reason)

    # fail_after only turns a regression (waiters never woken) into a failure instead of a hang.
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert woke == []
            signal.abort("user")
            signal.abort("late")
    assert woke == ["user", "user"]


@pytest.mark.anyio
async def test_wait_on_an_aborted_signal_returns_immediately() -> None:
    signal = CancelSignal()
    signal.abort("disposed")
    with anyio.fail_after(5):
        await signal.wait()


@pytest.mark.anyio
async def test_native_cancellation_of_a_waiter_does_not_abort_the_signal() -> None:
    signal = CancelSignal()
    with anyio.move_on_after(0) as scope:
        await signal.wait()
    assert scope.cancelled_caught
    assert not signal.aborted
