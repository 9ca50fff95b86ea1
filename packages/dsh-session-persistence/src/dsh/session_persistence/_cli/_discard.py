"""``repair --discard-damaged-tail``: the explicit operator step that cuts a damaged *final* batch.

Load and crash repair never delete damage. A backend that can bound damage to its last batch (the JSONL
backend's declared batches) offers this step; the command prints exactly what is lost and asks first.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .._backends.protocol import SessionBackend
from ._errors import EXIT_DAMAGED, EXIT_DECLINED, CliError
from ._io import Io

__all__ = ["DiscardsDamagedTail", "discard_damaged_tail"]


@runtime_checkable
class DiscardsDamagedTail(Protocol):
    """A backend that can find and cut a damaged final batch (``find`` never writes)."""

    async def find_damaged_tail(self, session_id: str) -> Any: ...

    async def discard_damaged_tail(self, session_id: str, tail: Any) -> None: ...


async def discard_damaged_tail(
    backend: SessionBackend, io: Io, session_id: str, *, backend_name: str, yes: bool, json: bool, confirm: Any
) -> str:
    """Find the damaged final batch, print what is lost, confirm, cut it; returns what was lost (one line).

    ``backend_name`` is the backend's name on the command line, for the refusal when it cannot discard.
    """
    if not isinstance(backend, DiscardsDamagedTail):
        raise CliError(f'backend "{backend_name}" cannot discard a damaged final batch', EXIT_DAMAGED)
    try:
        tail = await backend.find_damaged_tail(session_id)
    except Exception as exc:  # the damage is not confined to the final batch: nothing is discarded
        raise CliError(f"cannot discard: {exc}", EXIT_DAMAGED) from exc
    if tail is None:
        raise CliError(
            f"cannot discard: session {session_id} has no damaged final batch (its damage is elsewhere)", EXIT_DAMAGED
        )
    lost = str(tail.describe())
    if not json:
        io.out.write(f"session {session_id}: discarding will permanently lose {lost}\n")
        io.out.flush()
    if not yes and not confirm(io, session_id):
        raise CliError("discard declined; nothing was written", EXIT_DECLINED)
    await backend.discard_damaged_tail(session_id, tail)
    if not json:
        io.out.write(f"discarded {tail.lost_bytes} bytes from session {session_id}\n")
    return lost
