"""The writer lease: off by default (the compare-and-set on ``next_seq`` refuses a stale writer), or an advisory lock.

With ``writer_lease=True`` a lease is a session-level ``pg_try_advisory_lock`` on a connection of its own, held
until :meth:`AdvisoryLease.release` unlocks it and closes that connection. The unlock is a round trip the server
answers once the lock is free: closing alone frees it only when the server has read the disconnect, some time after
``close()`` returned, so a writer following the release at once (this process deleting or reopening the session
it just let go) was refused ``SessionLockedError`` by its own lease. The server also drops the lock when the
holder's connection ends (its process died, the network went away), so there is never a stale lease to clean up. The
lock key is 64 bits of a SHA-256 of the schema and the session id (computed here, not by ``hashtext``, whose 32
bits would make two live sessions collide in a large fleet). The lease connection carries
``application_name = "dsh lease pid N on HOST"``, which is how a refused writer names the holder.

Costs one connection per leased session, and needs session-level state: not through pgbouncer in transaction
mode. Blocking code for worker threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading

import psycopg

from ._connections import Conn, Connections, NotSent
from ._core import SessionLockedError, SessionStorageError

__all__ = ["AdvisoryLease", "NoLease", "acquire_advisory_lease", "lease_key"]


def lease_key(schema: str, session_id: str) -> int:
    """The signed 64-bit advisory-lock key of one session in one schema."""
    digest = hashlib.sha256(f"dsh-lease\0{schema}\0{session_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def this_holder() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


class NoLease:
    """The lease when ``writer_lease`` is off: nothing is held; the database's compare-and-set still decides."""

    holder: str | None = None

    async def release(self) -> None:
        return None


class AdvisoryLease:
    """A held advisory lock: its own connection, unlocked and closed by :meth:`release`."""

    def __init__(self, conn: Conn, holder: str, key: int, connections: Connections) -> None:
        self._conn: Conn | None = conn
        self._lock = threading.Lock()
        self._key = key
        self._connections = connections
        self.holder: str | None = holder

    @property
    def held(self) -> bool:
        return self._conn is not None

    def release_sync(self) -> None:
        """Unlock (the server answers once the lock is free), then close; returns with the lock free unless the
        connection is broken or silent past ``client_timeout``, then the server frees it when it sees the end."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            with self._connections.guard(conn), contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    async def release(self) -> None:
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.release_sync)


def acquire_advisory_lease(connections: Connections, schema: str, session_id: str) -> AdvisoryLease:
    """Take the session's lease or raise :class:`SessionLockedError` at once (never waits for the holder)."""
    key = lease_key(schema, session_id)
    holder = this_holder()
    try:
        conn = connections.connect_direct(application_name=f"dsh lease {holder}")
    except NotSent as exc:
        raise SessionStorageError(f"PostgreSQL writer lease failed: cannot connect: {exc.cause}") from exc.cause
    try:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if row is not None and row[0]:
            return AdvisoryLease(conn, holder, key, connections)
        other = conn.execute(
            "SELECT a.application_name FROM pg_catalog.pg_locks l"
            " JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
            " AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())"
            " AND ((l.classid::bigint << 32) | l.objid::bigint) = %s LIMIT 1",
            (key,),
        ).fetchone()
    except psycopg.Error as exc:
        conn.close()
        raise SessionStorageError(f"PostgreSQL writer lease failed: {exc}") from exc
    conn.close()
    name = str(other[0]) if other is not None and other[0] else ""
    raise SessionLockedError(session_id, name.removeprefix("dsh lease ") or None)
