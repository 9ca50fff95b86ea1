"""Connections: a thread-safe sync pool (owned or the caller's), a free check for stale ones, a client deadline.

Every primitive runs in a worker thread on a sync psycopg connection, so the backend works under any anyio event
loop. What can go wrong with a connection is sorted here into three kinds, because each one is handled
differently by the caller:

* :class:`NotSent`: no connection could be had (server down or restarting, bad address, refused credentials,
  pool exhausted). Nothing reached the server, so any primitive may simply try again.
* :class:`Lost`: the connection broke after a statement was sent (server killed, network reset, a reply that
  never came within the client deadline). A read may be retried; a write is in doubt and must be read back.
* Any other server error arrived on a healthy connection: the server rolled the transaction back, so it is
  definitely not written; it is raised as a typed :class:`SessionStorageError`.

A pooled connection is checked before use without a round trip: an idle connection must have nothing to read,
so a readable socket means the server closed it (a restart's ``terminating connection`` notice, or EOF) and it is
replaced before anything is sent on it.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psycopg
from psycopg import Connection, pq
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from ._core import SessionStorageError

__all__ = ["Connections", "Lost", "NotSent", "is_retryable_connect_error", "server_error"]

Conn = Connection[TupleRow]

#: libpq's connect_timeout when neither the connection string nor the keyword arguments set one (lowered to the
#: client deadline when that is shorter: a connection attempt is bounded like a round trip).
DEFAULT_CONNECT_TIMEOUT = 10

#: libpq treats a connect_timeout below 2 seconds as 2.
_MIN_CONNECT_TIMEOUT = 2

#: At close, how long sending the server-side cancels of the connections still in use (abandoned calls') and
#: waiting for their threads to give them back may take in all; then their sockets are shut down (seconds).
_CLOSE_GRACE = 2.0


def connect_timeout_for(client_deadline: float | None) -> int:
    """The default connect_timeout: 10 s, or the client deadline rounded up if that is shorter (at least 2 s)."""
    if client_deadline is None:
        return DEFAULT_CONNECT_TIMEOUT
    return max(_MIN_CONNECT_TIMEOUT, min(DEFAULT_CONNECT_TIMEOUT, math.ceil(client_deadline)))


class _ConnectFailures:
    """The last error of the pool's own connection attempts (cleared by a success): the real reason of a pool
    timeout."""

    last: psycopg.Error | None = None


def _recording_connection_class(failures: _ConnectFailures) -> type[Connection[Any]]:
    class RecordingConnection(Connection[Any]):
        @classmethod
        def connect(cls, *args: Any, **kwargs: Any) -> Any:
            try:
                conn = super().connect(*args, **kwargs)
            except psycopg.Error as exc:
                failures.last = exc
                raise
            failures.last = None
            return conn

    return RecordingConnection


class NotSent(Exception):
    """Nothing was sent: no usable connection. ``cause`` is the real error (never a bare pool timeout)."""

    def __init__(self, cause: BaseException, retryable: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.retryable = retryable


class Lost(Exception):
    """The connection broke after a statement was sent; ``cause`` is psycopg's error."""

    def __init__(self, cause: BaseException, timed_out: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.timed_out = timed_out


#: Server refusals at connect that pass on their own (a restart in progress, every slot busy).
_PASSING_REFUSALS = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "too many clients",
    "remaining connection slots",
)


def is_retryable_connect_error(exc: BaseException) -> bool:
    """A failure to connect that may pass (refused, reset, server starting or shutting down), not a refusal.

    libpq reports a failed connection without a SQLSTATE; the server's own refusal comes as a ``FATAL:`` line
    (wrong password, unknown role or database, no privilege), which is final unless it is one of the passing
    conditions of a restart.
    """
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate is not None:
        return exc.sqlstate.startswith(("08", "57P", "53300"))
    text = str(exc)
    if "FATAL:" not in text:
        return True  # no answer from a server: refused, reset, unreachable
    return any(passing in text for passing in _PASSING_REFUSALS)


def server_error(action: str, exc: psycopg.Error) -> SessionStorageError:
    """A typed error for a server-side failure on a healthy connection (the transaction was rolled back)."""
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        what = "waited longer than lock_timeout for a lock held by another transaction"
    elif isinstance(exc, psycopg.errors.QueryCanceled):
        what = "ran longer than statement_timeout"
    else:
        what = f"{type(exc).__name__}: {str(exc).strip()}"
    return SessionStorageError(f"PostgreSQL {action} failed ({what}); nothing was written")


def _connection_failed(conn: Conn, exc: psycopg.Error) -> bool:
    """True unless ``exc`` is a server's answer on a connection still in a known state.

    A server error carries a SQLSTATE; one without (a client-side or protocol failure, such as a pipeline
    that could not be exited) or of the connection classes (08, 57P: shutdown, crash) leaves the connection's
    state, and so the outcome of what was sent, unknown.
    """
    if conn.closed or conn.broken:
        return True
    state = exc.sqlstate
    return state is None or state.startswith(("08", "57P"))


def _socket_readable(conn: Conn) -> bool:
    try:
        readable, _w, _x = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


def is_stale(conn: Conn) -> bool:
    """True if an idle pooled connection cannot be used (closed, mid-transaction, or the server hung up)."""
    if conn.closed or conn.info.transaction_status != pq.TransactionStatus.IDLE:
        return True
    return _socket_readable(conn)


class _Watchdog:
    """Drops a connection whose round trip outlives the client deadline (a silent server or a dead route).

    Shutting the socket down wakes the thread blocked in libpq with an error; the caller then sees
    :class:`Lost` with ``timed_out`` set. One daemon thread serves every guarded connection of a backend.
    """

    def __init__(self, deadline: float | None) -> None:
        self._deadline = deadline
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._active: dict[int, int] = {}  # token -> socket fd
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    @contextlib.contextmanager
    def guard(self, conn: Conn) -> Iterator[dict[str, bool]]:
        """Watch ``conn`` for the duration of the block; the yielded dict's ``fired`` says if it was dropped."""
        state = {"fired": False}
        if self._deadline is None:
            yield state
            return
        token = next(self._tokens)
        with self._cond:
            self._active[token] = conn.fileno()
            heapq.heappush(self._heap, (time.monotonic() + self._deadline, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dsh-postgres-watchdog", daemon=True)
                self._thread.start()
            elif self._heap[0][1] == token:
                # Due before everything else watched: the watchdog sleeps until a later due (or for ever). Any
                # other entry is due after the one it already waits for, so it is not woken (a thread switch per
                # round trip otherwise).
                self._cond.notify()
        try:
            yield state
        finally:
            with self._cond:
                self._active.pop(token, None)
                state["fired"] = token in self._fired
                self._fired.discard(token)

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                while self._heap and self._heap[0][1] not in self._active:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                due, token = self._heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                fd = self._active.get(token)
                if fd is not None:
                    self._fired.add(token)
                    _shutdown(fd)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()


def _shutdown(fd: int) -> None:
    # shutdown() acts on the socket itself, so doing it through a duplicate descriptor reaches libpq's.
    with contextlib.suppress(OSError):
        dup = socket.socket(fileno=os.dup(fd))
        with contextlib.suppress(OSError):
            dup.shutdown(socket.SHUT_RDWR)
        dup.close()


class Connections:
    """Where the backend gets its connections: its own :class:`ConnectionPool`, or the caller's.

    ``kwargs`` are psycopg connection keyword arguments (``prepare_threshold=None`` for pgbouncer's transaction
    mode, ``options``, ``password``...). Connections the backend opens itself are in autocommit mode; a
    caller's connection is switched to autocommit while the backend uses it and switched back before it is
    returned (the backend always runs explicit transactions).
    """

    def __init__(
        self,
        conninfo: str,
        kwargs: Mapping[str, Any],
        pool: ConnectionPool[Any] | None,
        *,
        min_size: int,
        max_size: int,
        pool_timeout: float,
        client_deadline: float | None,
        name: str,
    ) -> None:
        self._external = pool is not None
        self._pool_timeout = pool_timeout
        self._max_size = max_size if pool is None else pool.max_size
        self._watchdog = _Watchdog(client_deadline)
        self._connect_failures = _ConnectFailures()
        #: Called once on every connection before its first use (the durability check); may raise to refuse it.
        self.on_new_connection: Callable[[Conn], None] | None = None
        self._checked: weakref.WeakSet[Conn] = weakref.WeakSet()
        if pool is not None:
            # psycopg_pool >= 3.3 accepts callables for both; they are evaluated when a connection is made.
            found_conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
            found_kwargs = pool.kwargs() if callable(pool.kwargs) else pool.kwargs
            self._conninfo: str = found_conninfo
            self._kwargs: dict[str, Any] = dict(found_kwargs or {})
            self._pool: ConnectionPool[Any] = pool
        else:
            params = dict(kwargs)
            params.setdefault("autocommit", True)
            if "connect_timeout" not in params and "connect_timeout" not in conninfo_to_dict(conninfo):
                params["connect_timeout"] = connect_timeout_for(client_deadline)
            self._conninfo = conninfo
            self._kwargs = params
            self._pool = ConnectionPool(
                conninfo,
                kwargs=params,
                connection_class=_recording_connection_class(self._connect_failures),
                min_size=min_size,
                max_size=max_size,
                open=False,
                timeout=pool_timeout,
                name=name,
            )
        self._opened = False
        self._configured_connect_timeout = self._read_connect_timeout()
        # Connections handed out and not yet given back (by threads whose callers may have left), for close().
        self._in_use_cond = threading.Condition()
        self._in_use: set[Conn] = set()
        self._closing = False

    def _connect_timeout(self) -> int | None:
        """The connect_timeout the connections are made with (``None``: libpq's default, no bound)."""
        return self._configured_connect_timeout

    def _read_connect_timeout(self) -> int | None:
        try:
            found = self._kwargs.get("connect_timeout", conninfo_to_dict(self._conninfo).get("connect_timeout"))
            return None if found is None else int(found)
        except (TypeError, ValueError, psycopg.Error):
            return None

    def connect_direct(self, wait: float | None = None, **extra: Any) -> Conn:
        """One connection outside the pool (the first contact, so its real error surfaces at once; a lease).

        ``wait`` (seconds left to the caller's retry deadline) lowers libpq's connect_timeout to fit in it.
        """
        params = {**self._kwargs, "autocommit": True, **extra}
        configured = self._connect_timeout()
        if wait is not None:
            fits = max(_MIN_CONNECT_TIMEOUT, math.ceil(wait))
            params["connect_timeout"] = fits if configured is None or configured <= 0 else min(configured, fits)
        try:
            conn: Conn = psycopg.connect(self._conninfo, **params)
        except psycopg.Error as exc:
            raise NotSent(exc, is_retryable_connect_error(exc)) from exc
        return conn

    def guard(self, conn: Conn) -> contextlib.AbstractContextManager[dict[str, bool]]:
        """Watch a connection the caller holds itself (a lease's) by the client deadline, as lent ones are."""
        return self._watchdog.guard(conn)

    def open(self) -> None:
        """Open the owned pool (its connections are made in the background); a caller's pool is left alone."""
        if not self._external and not self._opened:
            self._pool.open(wait=False)
            self._opened = True

    def _pool_timed_out(self, timeout: PoolTimeout) -> NotSent:
        """No pooled connection came within the wait: report the real reason, never open one beside the pool.

        A connection opened outside the pool would break ``max_size`` (30 callers waiting on a row lock would
        open 30 server connections); so the caller retries within its ``retry_timeout`` instead. The reason is
        the pool's last failed connection attempt (the server is down, refusing...) if there is one, else the
        pool was busy.
        """
        failed = self._connect_failures.last
        if failed is not None:
            return NotSent(failed, is_retryable_connect_error(failed))
        busy = PoolTimeout(f"all {self._max_size} pooled connections stayed busy for the wait ({timeout})")
        return NotSent(busy, True)

    def _acquire(self, wait: float | None) -> tuple[Conn, bool]:
        """A usable connection and whether it came from the pool.

        The wait is ``wait`` (what is left of the caller's retry deadline) but never less than one connection
        attempt may take (the connect timeout, within ``pool_timeout``): a pool replacing a connection the server
        closed, or reconnecting after a restart, gets the time to do it.
        """
        floor = min(self._pool_timeout, float(self._connect_timeout() or DEFAULT_CONNECT_TIMEOUT))
        timeout = self._pool_timeout if wait is None else min(self._pool_timeout, max(wait, floor))
        for _attempt in range(64):
            try:
                conn: Conn = self._pool.getconn(timeout=timeout)
            except PoolTimeout as exc:
                raise self._pool_timed_out(exc) from exc
            except PoolClosed as exc:
                raise NotSent(exc, False) from exc
            if not is_stale(conn):
                return conn, True
            # Closed by the server while idle (a restart): drop it; the pool makes a fresh one. Nothing was sent,
            # so waiting for the replacement spends no retry: it gets the whole pool_timeout.
            with contextlib.suppress(psycopg.Error):
                conn.close()
            self._pool.putconn(conn)
            timeout = self._pool_timeout
        raise NotSent(OSError("no usable connection: every pooled connection was closed by the server"), True)

    @contextlib.contextmanager
    def connection(self, *, direct: bool = False, wait: float | None = None) -> Iterator[Conn]:
        """A checked connection in autocommit mode, guarded by the client deadline.

        ``wait`` caps the wait for a pooled connection (seconds; default ``pool_timeout``).

        Raises :class:`NotSent` if none could be had and :class:`Lost` if it broke while in use; psycopg's
        server errors pass through (the connection is rolled back to idle first).
        """
        conn, pooled = (self.connect_direct(wait), False) if direct else self._acquire(wait)
        restore_autocommit = False
        try:
            self._lend(conn)
            if not conn.autocommit:
                conn.autocommit = True
                restore_autocommit = True
            with self._watchdog.guard(conn) as state:
                self._check_new(conn)
                try:
                    yield conn
                except psycopg.Error as exc:
                    if _connection_failed(conn, exc) or state["fired"]:
                        # Unknown state: never reuse it (the pool discards a closed connection).
                        self._close_lent(conn)
                        raise Lost(exc, state["fired"]) from exc
                    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                        conn.rollback()
                    raise
        finally:
            self._given_back(conn)
            if restore_autocommit and not conn.closed:
                with contextlib.suppress(psycopg.Error):
                    conn.autocommit = False
            if pooled:
                self._pool.putconn(conn)
            else:
                conn.close()

    def _check_new(self, conn: Conn) -> None:
        """Run :attr:`on_new_connection` on a connection's first use; a refused or failing one is closed.

        Each connection is a new server session whose settings (``ALTER DATABASE ... SET``, ``ALTER ROLE``, a
        reloaded ``postgresql.conf``) may differ from the last one's, so the check is per connection, not once.
        """
        check = self.on_new_connection
        if check is None or conn in self._checked:
            return
        try:
            check(conn)
        except psycopg.Error as exc:
            # Nothing of the caller's was sent yet.
            self._close_lent(conn)
            raise NotSent(exc, _connection_failed(conn, exc) or is_retryable_connect_error(exc)) from exc
        except BaseException:
            self._close_lent(conn)
            raise
        self._checked.add(conn)

    def _lend(self, conn: Conn) -> None:
        with self._in_use_cond:
            if self._closing:
                raise NotSent(PoolClosed("the backend is closed"), False)  # nothing was sent on it yet
            self._in_use.add(conn)

    def _close_lent(self, conn: Conn) -> None:
        # Under the lock: close() never shuts down a descriptor that this close freed for reuse.
        with self._in_use_cond:
            self._in_use.discard(conn)
            with contextlib.suppress(Exception):
                conn.close()

    def _given_back(self, conn: Conn) -> None:
        with self._in_use_cond:
            self._in_use.discard(conn)
            self._in_use_cond.notify_all()

    def close(self) -> None:
        """Stop what still runs on a connection, then close the owned pool (a caller's pool stays open).

        A connection still in use belongs to a thread whose caller may have left (its deadline passed): that thread
        would go on until the server answers, which may be never (a row lock held elsewhere with no
        ``lock_timeout``, a silent network without ``client_timeout``), and keep the process from exiting. So its
        server-side statement is cancelled (the server rolls it back and drops any lock wait) and, if the thread
        has not given the connection back within a short grace, its socket is shut down (the thread wakes with an
        error). Either way the outcome is what it would be for a lost connection: nothing acknowledged changes,
        and a write whose caller still waits fails typed (in doubt if it was sent). Nothing new starts.
        """
        with self._in_use_cond:
            self._closing = True
            busy = list(self._in_use)
        cancelled = False
        deadline = time.monotonic() + _CLOSE_GRACE
        for conn in busy:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                conn.cancel_safe(timeout=left)
            except Exception:
                continue  # a closed or unreachable server: the shutdown below wakes its thread
            cancelled = True
        with self._in_use_cond:
            while cancelled and self._in_use and self._in_use_cond.wait(max(0.0, deadline - time.monotonic())):
                pass
            for conn in self._in_use:
                # Under the lock: a connection in the set is open and lent (see _close_lent), so its fd is its own.
                if not conn.closed:
                    with contextlib.suppress(Exception):
                        _shutdown(conn.fileno())
        self._watchdog.stop()
        if not self._external and self._opened:
            self._pool.close()
