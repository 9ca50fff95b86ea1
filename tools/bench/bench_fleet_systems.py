"""Section 12's systems (see :mod:`bench_fleet`): a session opens, appends an event (buffered), passes a barrier
(durable) and closes, in dsh, the raw floor (a worker thread or inline) and SQLiteSession."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
import zstandard
from bench_writes import completion_waiter
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
from dsh.session_persistence_jsonl import JsonlBackend

#: The cwd every fleet session is created under.
CWD = "/home/bench/fleet"
#: ``dsh_nowindow``'s write-behind window: longer than any cell, so no window expires within one.
NO_WINDOW_MS = 3_600_000

# --------------------------------------------------------------------------------------------------------------
# The systems: open a session, append an event (buffered), a barrier (durable), close


class System:
    async def open(self, index: int) -> Any:
        raise NotImplementedError

    def append(self, handle: Any, etype: str, data: dict[str, Any], seqs: list[int] | None = None) -> int:
        raise NotImplementedError

    async def barrier(self, handle: Any) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        return None


class _CountedJsonl(JsonlBackend):
    """The bench's JSONL backend, counting the live durable writes the coordinator submits (one per batch)."""

    writes = 0

    def submit_append_batch(self, *args: Any, **kwargs: Any) -> Any:
        self.writes += 1
        return super().submit_append_batch(*args, **kwargs)


class DshSystem(System):
    """dsh over JSONL; ``window_ms`` overrides the coordinator's write-behind window (the default: its own)."""

    def __init__(self, where: str, window_ms: int | None = None) -> None:
        self.host = Host()
        self.store = SessionStore(self.host)
        self.backend = _CountedJsonl(where, compression="zstd", pack_chunks=True)
        if window_ms is None:
            self.coordinator = PersistenceCoordinator(self.host, self.backend)
        else:
            self.coordinator = PersistenceCoordinator(self.host, self.backend, write_batch_max_delay_ms=window_ms)
        self.sessions: list[Any] = []

    @property
    def writes(self) -> int | None:
        """Durable batch writes submitted so far (write-behind windows and barriers alike); ``None`` for a backend
        that does not count them (the PostgreSQL cells' system, :mod:`bench_fleet_pg`)."""
        count = getattr(self.backend, "writes", None)
        return count if isinstance(count, int) else None

    async def start(self) -> None:
        await self.coordinator.__aenter__()

    async def open(self, index: int) -> Any:
        session = self.store.create(f"fleet-{index}", meta={"cwd": CWD})
        session.append("turn/start", {"turn": 1})
        await self.store.flush(session)
        self.sessions.append(session)
        return session

    def append(self, handle: Any, etype: str, data: dict[str, Any], seqs: list[int] | None = None) -> int:
        return int(handle.append(etype, data, source_event_seqs=seqs).seq)

    async def barrier(self, handle: Any) -> None:
        await self.store.flush(handle)

    async def aclose(self) -> None:
        for session in self.sessions:
            self.store.dispose(session)
        await self.coordinator.__aexit__(None, None, None)


class _RawLog:
    __slots__ = ("fd", "pending", "seq")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending: list[bytes] = []
        self.seq = 0


def _write_sync(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


class RawSystem(System):
    """The raw floor: msgspec lines as events come; at a barrier one zstd frame, ``write`` + ``fsync``."""

    def __init__(self, where: str, *, inline: bool) -> None:
        self.where = where
        self.inline = inline
        self.logs: list[_RawLog] = []
        self.encoder = msgspec.json.Encoder()
        self.compressor = zstandard.ZstdCompressor(level=3)
        os.makedirs(where, exist_ok=True)

    async def open(self, index: int) -> Any:
        path = os.path.join(self.where, f"fleet-{index}.jsonl.zstd")
        log = _RawLog(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600))
        self.append(log, "session/header", {"id": f"fleet-{index}", "cwd": CWD})
        await self.barrier(log)
        self.logs.append(log)
        return log

    def append(self, handle: Any, etype: str, data: dict[str, Any], seqs: list[int] | None = None) -> int:
        seq = handle.seq
        event: dict[str, Any] = {"type": etype, "seq": seq, "time": int(time.time() * 1000), "data": data}
        if seqs is not None:
            event["sourceEventSeqs"] = seqs
        handle.pending.append(self.encoder.encode(event) + b"\n")
        handle.seq += 1
        return int(seq)

    async def barrier(self, handle: Any) -> None:
        if not handle.pending:
            return
        frame = self.compressor.compress(b"".join(handle.pending))
        handle.pending.clear()
        if self.inline:
            _write_sync(handle.fd, frame)
        else:
            await anyio.to_thread.run_sync(_write_sync, handle.fd, frame)

    async def aclose(self) -> None:
        for log in self.logs:
            os.close(log.fd)


class FloorSystem(RawSystem):
    """The async floor (DESIGN §12): msgspec lines as events come; at a barrier one hand-off of the session's lines
    to one long-lived writer thread (a ``queue.SimpleQueue``), which compresses one zstd frame (level 3), ``write`` +
    ``fsync``, and completes the caller through the loop's thread-safe call; the caller waits, shielded."""

    def __init__(self, where: str) -> None:
        super().__init__(where, inline=False)
        self.jobs: queue.SimpleQueue[tuple[int, bytes, Callable[[], None]] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="fleet-floor-writer", daemon=True)
        self.thread.start()
        self.wait: Callable[[Callable[[Callable[[], None]], None]], Awaitable[None]] | None = None

    def _serve(self) -> None:
        compressor = zstandard.ZstdCompressor(level=3)
        while (job := self.jobs.get()) is not None:
            fd, data, complete = job
            _write_sync(fd, compressor.compress(data))
            complete()

    async def barrier(self, handle: Any) -> None:
        if not handle.pending:
            return
        data = b"".join(handle.pending)
        handle.pending.clear()
        if self.wait is None:
            self.wait = completion_waiter()
        await self.wait(lambda complete: self.jobs.put((handle.fd, data, complete)))

    async def aclose(self) -> None:
        self.jobs.put(None)
        self.thread.join()
        await super().aclose()


class _SqliteLog:
    __slots__ = ("pending", "seq", "session")

    def __init__(self, session: Any) -> None:
        self.session = session
        self.pending: list[dict[str, Any]] = []
        self.seq = 0


class SqliteSystem(System):
    """OpenAI Agents SDK ``SQLiteSession`` as it ships: a file per session, or one shared file."""

    def __init__(self, where: str, *, shared: bool) -> None:
        self.where = where
        self.shared = shared
        self.logs: list[_SqliteLog] = []
        os.makedirs(where, exist_ok=True)

    async def open(self, index: int) -> Any:
        from agents import SQLiteSession  # type: ignore[import-not-found, unused-ignore]

        db = os.path.join(self.where, "shared.db" if self.shared else f"fleet-{index}.db")
        log = _SqliteLog(SQLiteSession(f"fleet-{index}", db))
        log.pending.append({"type": "session/header", "data": {"id": f"fleet-{index}"}})
        await self.barrier(log)
        self.logs.append(log)
        return log

    def append(self, handle: Any, etype: str, data: dict[str, Any], seqs: list[int] | None = None) -> int:
        seq = handle.seq
        handle.seq += 1
        item: dict[str, Any] = {"type": etype, "seq": seq, "time": int(time.time() * 1000), "data": data}
        if seqs is not None:
            item["sourceEventSeqs"] = seqs
        handle.pending.append(item)
        return int(seq)

    async def barrier(self, handle: Any) -> None:
        if handle.pending:
            items, handle.pending = handle.pending, []
            await handle.session.add_items(items)

    async def aclose(self) -> None:
        for log in self.logs:
            log.session.close()


def make_system(name: str, where: str) -> System:
    if name == "dsh":
        return DshSystem(where)
    if name == "dsh_nowindow":
        # A probe, not a configuration to run: the write-behind window pushed past the cell, so only barriers write
        # (what the write-behind window costs; its writes are durable appends by the spec).
        return DshSystem(where, window_ms=NO_WINDOW_MS)
    if name == "floor":
        return FloorSystem(where)
    if name in ("raw_thread", "raw_inline"):
        return RawSystem(where, inline=name == "raw_inline")
    if name in ("sqlite_file", "sqlite_shared"):
        return SqliteSystem(where, shared=name == "sqlite_shared")
    raise SystemExit(f"unknown fleet system {name!r}")
