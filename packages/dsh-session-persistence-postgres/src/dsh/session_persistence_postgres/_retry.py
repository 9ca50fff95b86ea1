"""The retry rules: reads retry over lost connections, writes retry only what was never sent, else read back.

A write whose connection broke after its statement was sent is in doubt: it may have committed (a lost
``COMMIT`` reply) or not. It is settled by reading the stored state back on another connection: exactly the
batch stored means done; none of it means the write is sent again (safe: the compare-and-set on ``next_seq``
refuses a second copy even if the first one commits late); anything else is a conflict with another writer. If
the state cannot be read back within ``retry_timeout`` the write raises :class:`SessionWriteInDoubtError`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg

from ._connections import Conn, Connections, Lost, NotSent, server_error
from ._core import SeqMismatchError, SessionAlreadyExistsError, SessionStorageError, SessionWriteInDoubtError

__all__ = ["FIRST_DELAY", "MAX_DELAY", "Outcome", "Retrier", "in_doubt_error", "unreachable_error"]

T = TypeVar("T")

FIRST_DELAY = 0.05
MAX_DELAY = 1.0


class Outcome(enum.Enum):
    """What reading back an in-doubt write found."""

    STORED = "stored"  # exactly the batch: the write committed
    ABSENT = "absent"  # none of it: the write did not commit and may be sent again


class Retrier:
    """Runs primitives on :class:`Connections` under the retry rules, within ``retry_timeout`` seconds."""

    def __init__(self, connections: Connections, retry_timeout: float) -> None:
        self._connections = connections
        self._retry_timeout = retry_timeout

    def once(self, action: str, body: Callable[[Conn], T], direct: bool, deadline: float) -> T:
        """``body`` on one connection: raises :class:`NotSent`, :class:`Lost` or a typed server error."""
        try:
            with self._connections.connection(direct=direct, wait=deadline - time.monotonic()) as conn:
                return body(conn)
        except psycopg.Error as exc:
            raise server_error(action, exc) from exc

    def read(self, action: str, body: Callable[[Conn], T], *, direct: bool = False) -> T:
        """Run an idempotent ``body``, reconnecting and retrying while the failure is a connection's."""
        deadline = time.monotonic() + self._retry_timeout
        delay = FIRST_DELAY
        while True:
            try:
                return self.once(action, body, direct, deadline)
            except NotSent as exc:
                if not exc.retryable or time.monotonic() + delay > deadline:
                    raise unreachable_error(action, exc.cause) from exc.cause
            except Lost as exc:
                if time.monotonic() + delay > deadline:
                    raise _lost(action, exc) from exc.cause
            time.sleep(delay)
            delay = min(delay * 2, MAX_DELAY)

    def write(self, action: str, attempt: Callable[[Conn], T], settle: Callable[[Conn], Outcome]) -> T | None:
        """Run ``attempt``; settle a lost connection by ``settle`` (a read-back) before anything is sent again.

        Returns ``attempt``'s result, or ``None`` when the write was found already stored by a read-back.
        """
        deadline = time.monotonic() + self._retry_timeout
        delay = FIRST_DELAY
        in_doubt: Lost | None = None
        while True:
            try:
                return self.once(action, attempt, False, deadline)
            except NotSent as exc:
                # Nothing was sent this time: waiting and sending again is safe.
                if not exc.retryable or time.monotonic() + delay > deadline:
                    if in_doubt is not None:
                        raise in_doubt_error(action, in_doubt, exc.cause) from exc.cause
                    raise unreachable_error(action, exc.cause) from exc.cause
                time.sleep(delay)
                delay = min(delay * 2, MAX_DELAY)
                continue
            except Lost as exc:
                in_doubt = exc
            except (SeqMismatchError, SessionAlreadyExistsError):
                # After an in-doubt attempt the conflicting writer may be our own first copy, committed late.
                if in_doubt is None or self._settle(action, settle, in_doubt, deadline) is not Outcome.STORED:
                    raise
                return None
            if self._settle(action, settle, in_doubt, deadline) is Outcome.STORED:
                return None
            if time.monotonic() > deadline:
                # Not stored when read back, but the lost copy might still land: only the CAS makes that safe.
                raise in_doubt_error(action, in_doubt, in_doubt.cause) from in_doubt.cause

    def _settle(self, action: str, settle: Callable[[Conn], Outcome], in_doubt: Lost, deadline: float) -> Outcome:
        delay = FIRST_DELAY
        while True:
            try:
                return self.once(f"{action} (read-back)", settle, False, deadline)
            except NotSent as exc:
                if not exc.retryable or time.monotonic() + delay > deadline:
                    raise in_doubt_error(action, in_doubt, exc.cause) from in_doubt.cause
            except Lost as exc:
                if time.monotonic() + delay > deadline:
                    raise in_doubt_error(action, in_doubt, exc.cause) from in_doubt.cause
            time.sleep(delay)
            delay = min(delay * 2, MAX_DELAY)


def _text(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def unreachable_error(action: str, cause: BaseException) -> SessionStorageError:
    return SessionStorageError(f"PostgreSQL {action} failed: cannot get a connection: {_text(cause)}")


def _lost(action: str, lost: Lost) -> SessionStorageError:
    how = "no reply within client_timeout" if lost.timed_out else _text(lost.cause)
    return SessionStorageError(f"PostgreSQL {action} failed: the connection was lost ({how})")


def in_doubt_error(action: str, lost: Lost, last: BaseException) -> SessionWriteInDoubtError:
    how = "no reply within client_timeout" if lost.timed_out else _text(lost.cause)
    return SessionWriteInDoubtError(
        f"PostgreSQL {action}: the connection was lost after the write was sent ({how}) and what was stored "
        f"could not be read back within retry_timeout ({_text(last)}); read the session back before writing again"
    )
