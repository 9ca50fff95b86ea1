"""The backend's bounds and policies, validated once at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._errors import PostgresConfigurationError

__all__ = ["Settings"]


def _seconds(name: str, value: float | None, *, allow_none: bool = True) -> float | None:
    if value is None:
        if allow_none:
            return None
        raise PostgresConfigurationError(f"{name} must be a number of seconds, not None")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise PostgresConfigurationError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Settings:
    """How long each step may take, and whether weakened server durability is accepted.

    * ``lock_timeout``: the longest a statement waits for a row or table lock (PostgreSQL ``lock_timeout``);
    * ``statement_timeout``: the longest one statement runs on the server (PostgreSQL ``statement_timeout``);
    * ``client_timeout``: the longest the client waits for a reply before it drops the connection (a server or
      network that went silent); default ``statement_timeout + 5``;
    * ``retry_timeout``: how long a primitive keeps reconnecting (a restarting server) and, after a connection
      lost mid-write, keeps trying to read back what was stored;
    * ``pool_timeout``: the longest one wait for a pooled connection;
    * ``allow_weak_durability``: accept a server with ``fsync`` or ``synchronous_commit`` off.

    ``None`` for ``lock_timeout``/``statement_timeout``/``client_timeout`` means no bound from the backend.
    """

    lock_timeout: float | None = 10.0
    statement_timeout: float | None = 30.0
    client_timeout: float | None = None
    retry_timeout: float = 30.0
    pool_timeout: float = 10.0
    allow_weak_durability: bool = False

    def __post_init__(self) -> None:
        _seconds("lock_timeout", self.lock_timeout)
        _seconds("statement_timeout", self.statement_timeout)
        _seconds("client_timeout", self.client_timeout)
        _seconds("retry_timeout", self.retry_timeout, allow_none=False)
        _seconds("pool_timeout", self.pool_timeout, allow_none=False)

    @property
    def client_deadline(self) -> float | None:
        """Seconds the client waits on one round trip before dropping the connection (``None``: forever)."""
        if self.client_timeout is not None:
            return self.client_timeout
        if self.statement_timeout is not None:
            return self.statement_timeout + 5.0
        return None

    def server_timeouts(self) -> tuple[str, str]:
        """``lock_timeout`` and ``statement_timeout`` as PostgreSQL setting values (``"0"`` disables a bound)."""

        def ms(value: float | None) -> str:
            # PostgreSQL reads 0 as "no timeout": the smallest real bound is 1 ms.
            return "0" if value is None else f"{max(1, round(value * 1000))}ms"

        return ms(self.lock_timeout), ms(self.statement_timeout)
