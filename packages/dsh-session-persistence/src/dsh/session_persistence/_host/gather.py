"""Run awaitables concurrently and collect each one's outcome without cancelling the others."""

from __future__ import annotations

from collections.abc import Awaitable, Generator, Sequence
from typing import Any

import anyio

__all__ = ["Settled", "gather_settled"]


class Settled:
    """An awaitable that is already settled: awaiting it returns ``None`` or raises ``error``, never suspending."""

    __slots__ = ("_error",)

    def __init__(self, error: Exception | None) -> None:
        self._error = error

    def __await__(self) -> Generator[Any, None, None]:
        if self._error is not None:
            raise self._error
        yield from ()


async def gather_settled(awaitables: Sequence[Awaitable[object]]) -> list[Exception | None]:
    """Await every awaitable concurrently; return, per position, the ``Exception`` it raised or ``None``.

    Only ``Exception`` is collected: cancellation and other ``BaseException``s propagate as usual.
    """
    errors: list[Exception | None] = [None] * len(awaitables)
    if len(awaitables) == 1:  # the common case (one persistence backend): no task group needed
        try:
            await awaitables[0]
        except Exception as exc:
            errors[0] = exc
        return errors

    async def run(index: int, awaitable: Awaitable[object]) -> None:
        try:
            await awaitable
        except Exception as exc:
            errors[index] = exc

    async with anyio.create_task_group() as tg:
        for index, awaitable in enumerate(awaitables):
            tg.start_soon(run, index, awaitable)
    return errors
