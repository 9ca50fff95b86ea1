"""An in-memory session backend: every primitive of the backend protocol, atomic, no I/O.

Useful for tests, demos and as the reference for backend authors. The data lives in a :class:`MemoryStore`
that several :class:`MemoryBackend` instances may share, so "a second backend on the same store" simulates a
process restart. Events are kept as encoded JSON lines and decoded afresh on every read, so what a load returns
is never shared with storage or with an earlier load.
"""

from __future__ import annotations

import builtins
import itertools
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

from .._model.errors import (
    SessionAlreadyExistsError,
    SessionChangedError,
    SessionLockedError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
)
from .._model.events import SessionEvent
from .._model.header import SessionHeader, header_to_builtins
from .._wire.codec import decode_event_line, encode_event
from .._wire.contiguity import check_contiguous
from .listing import ListQuery, SessionListing, page_of
from .protocol import SessionSnapshot, StorageMetadata, StoredPrefix, StoredSuffix

__all__ = ["MemoryBackend", "MemoryLease", "MemoryStore"]

#: What an injected torn tail looks like: the first bytes of a line that never finished.
DEFAULT_TORN_FRAGMENT = b'{"type":"turn/end","seq":'


@dataclass
class _Entry:
    header: dict[str, Any]
    inherited_event_count: int
    lines: list[bytes]
    generation: int
    torn: bytes | None = None
    #: Milliseconds since the epoch of the last mutation (the "recent" listing order).
    updated_at: int = field(default_factory=lambda: _now_ms())


@dataclass
class MemoryStore:
    """The shared storage of one or more :class:`MemoryBackend` instances.

    Revisions are ``<store token>:<generation>``: the token is unique per store, and the generation comes from
    one store-wide counter bumped by every mutation, so two stores never compare equal and a re-created id never
    repeats an old revision.
    """

    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    _entries: dict[str, _Entry] = field(default_factory=dict)
    _counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _leases: dict[str, MemoryLease] = field(default_factory=dict)
    _lease_numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def lease_holder(self, session_id: str) -> str | None:
        """Who holds the writer lease of ``session_id`` (``None`` when nobody does)."""
        lease = self._leases.get(session_id)
        return None if lease is None else lease.holder

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._entries

    def ids(self) -> list[str]:
        """Stored ids in creation order."""
        return list(self._entries)

    def revision(self, session_id: str) -> str | None:
        """The current revision of ``session_id``, ``None`` if absent."""
        entry = self._entries.get(session_id)
        return None if entry is None else f"{self.token}:{entry.generation}"

    def events(self, session_id: str) -> list[SessionEvent]:
        """Decoded committed events of ``session_id`` (fresh objects), ``[]`` if absent (test helper)."""
        entry = self._entries.get(session_id)
        return [] if entry is None else [decode_event_line(line) for line in entry.lines]

    # -- test and tooling controls -----------------------------------------------------------------------

    def put(
        self,
        session_id: str,
        header: SessionHeader | dict[str, Any],
        events: Sequence[SessionEvent | dict[str, Any]] = (),
        *,
        inherited_event_count: int = 0,
    ) -> None:
        """Plant a stored log verbatim, replacing any entry (no validation: used to plant damage in tests)."""
        head = header_to_builtins(header) if isinstance(header, SessionHeader) else dict(header)
        self._entries[session_id] = _Entry(
            header=head,
            inherited_event_count=inherited_event_count,
            lines=[_line(e) for e in events],
            generation=next(self._counter),
        )

    def append_raw(self, session_id: str, events: Sequence[SessionEvent | dict[str, Any]]) -> None:
        """Append events verbatim, as an external writer would (no contiguity check)."""
        entry = self._require(session_id)
        entry.lines.extend(_line(e) for e in events)
        self._bump(entry)

    def delete(self, session_id: str) -> None:
        """Remove a stored session (an external deletion)."""
        self._entries.pop(session_id, None)

    def inject_torn_tail(self, session_id: str, fragment: bytes = DEFAULT_TORN_FRAGMENT) -> None:
        """Leave a never-committed fragment after the committed events, as a crash mid-write would.

        The next ``load_stored`` reports a torn marker; ``commit_repair`` with it restores the committed prefix.
        """
        entry = self._require(session_id)
        entry.torn = fragment
        self._bump(entry)

    def set_updated_at(self, session_id: str, updated_at_ms: int) -> None:
        """Pretend the last activity happened at ``updated_at_ms`` (tests of ordering and retention)."""
        self._require(session_id).updated_at = updated_at_ms

    def has_torn_tail(self, session_id: str) -> bool:
        entry = self._entries.get(session_id)
        return entry is not None and entry.torn is not None

    # -- internals ---------------------------------------------------------------------------------------

    def _require(self, session_id: str) -> _Entry:
        entry = self._entries.get(session_id)
        if entry is None:
            raise SessionNotFoundError(session_id)
        return entry

    def _bump(self, entry: _Entry) -> None:
        entry.generation = next(self._counter)
        entry.updated_at = max(_now_ms(), entry.updated_at)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _line(event: SessionEvent | dict[str, Any]) -> bytes:
    if isinstance(event, dict):
        return msgspec.json.encode(event)
    return encode_event(event)


def _header(obj: dict[str, Any]) -> SessionHeader:
    # Storage keeps whatever header was written (a planted v99 header included); the coordinator validates it.
    return msgspec.convert(obj, SessionHeader)


class MemoryLease:
    """A writer lease of a :class:`MemoryStore`: exclusive per store and session id, until :meth:`release`."""

    def __init__(self, store: MemoryStore, session_id: str) -> None:
        self._store = store
        self._session_id = session_id
        self._holder = f"pid {os.getpid()} on {socket.gethostname()} (memory lease {next(store._lease_numbers)})"

    @property
    def holder(self) -> str:
        return self._holder

    async def release(self) -> None:
        """Give the lease back (idempotent)."""
        if self._store._leases.get(self._session_id) is self:
            del self._store._leases[self._session_id]


class MemoryBackend:
    """Backend keeping sessions in a :class:`MemoryStore` (pass ``store=`` to share one across instances).

    Every write is atomic (it happens between two checkpoints, with nothing awaited in the middle). Supports the
    optional ``materialize_header``, ``rewrite``, ``load_stored_from`` and ``acquire_writer_lease`` (one writer per
    session and store, across every instance sharing the store); ``locate`` returns ``None`` (there is no
    artifact path) and raw artifacts are not supported.
    """

    NAME = "memory"
    supports_raw_artifacts = False

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.store = store if store is not None else MemoryStore()

    # -- reads -------------------------------------------------------------------------------------------

    async def load_stored(self, session_id: str) -> StoredPrefix | None:
        """The stored prefix with fresh objects, a torn marker (the committed event count) if a tail is torn."""
        await anyio.lowlevel.checkpoint()
        entry = self.store._entries.get(session_id)
        if entry is None:
            return None
        meta, events = self._decode(session_id, entry, 0)
        return StoredPrefix(
            meta=meta,
            inherited_event_count=entry.inherited_event_count,
            events=events,
            revision=f"{self.store.token}:{entry.generation}",
            torn_marker=len(entry.lines) if entry.torn is not None else None,
        )

    async def load_stored_from(self, session_id: str, from_seq: int) -> StoredSuffix | None:
        """Seek read: only the events with ``seq >= from_seq`` are decoded."""
        await anyio.lowlevel.checkpoint()
        entry = self.store._entries.get(session_id)
        if entry is None:
            return None
        meta, events = self._decode(session_id, entry, from_seq)
        return StoredSuffix(meta=meta, inherited_event_count=entry.inherited_event_count, events=events)

    async def iter_stored(self, session_id: str, from_seq: int) -> AsyncIterator[StoredSuffix]:
        """Streaming read: the suffix from ``from_seq`` as one run (the log is in memory already)."""
        suffix = await self.load_stored_from(session_id, from_seq)
        if suffix is None:
            raise SessionNotFoundError(session_id)
        yield suffix

    async def read_stored_revision(self, session_id: str) -> str | None:
        await anyio.lowlevel.checkpoint()
        return self.store.revision(session_id)

    async def list(self) -> builtins.list[SessionHeader]:
        await anyio.lowlevel.checkpoint()
        return [_header(entry.header) for entry in self.store._entries.values()]

    async def list_snapshots(self) -> builtins.list[SessionSnapshot]:
        await anyio.lowlevel.checkpoint()
        return [
            SessionSnapshot(header=_header(entry.header), revision=f"{self.store.token}:{entry.generation}")
            for entry in self.store._entries.values()
        ]

    @property
    def cursor_scope(self) -> str:
        """Listing cursors belong to this store (a cursor from another store is refused)."""
        return f"memory:{self.store.token}"

    async def list_page(self, query: ListQuery) -> builtins.list[SessionListing]:
        """Every entry filtered, ordered and cut in memory (headers that do not decode are left out)."""
        await anyio.lowlevel.checkpoint()
        rows: builtins.list[SessionListing] = []
        for entry in self.store._entries.values():
            try:
                header = _header(entry.header)
            except (ValueError, msgspec.MsgspecError):
                continue
            rows.append(SessionListing(header, entry.updated_at, f"{self.store.token}:{entry.generation}"))
        return page_of(rows, query)

    def locate(self, meta: SessionHeader) -> None:
        """No per-session artifact path: always ``None``."""
        return None

    async def acquire_writer_lease(self, meta: SessionHeader) -> MemoryLease:
        """The store-wide exclusive writer lease of ``meta.id``; :class:`SessionLockedError` if it is held."""
        await anyio.lowlevel.checkpoint()
        held = self.store._leases.get(meta.id)
        if held is not None:
            raise SessionLockedError(meta.id, held.holder)
        lease = MemoryLease(self.store, meta.id)
        self.store._leases[meta.id] = lease
        return lease

    # -- writes (each one atomic) ------------------------------------------------------------------------

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        """Append a contiguous batch; the first batch creates the entry with its header and cut in one step."""
        await anyio.lowlevel.checkpoint()
        self._append_now(storage, events, is_materialized)

    def submit_append_batch(
        self,
        storage: StorageMetadata,
        events: Sequence[SessionEvent],
        is_materialized: bool,
        done: Callable[[BaseException | None], None],
    ) -> None:
        """:meth:`append_batch` without an await: the append happens now, ``done`` hears how it ended."""
        try:
            self._append_now(storage, events, is_materialized)
        except Exception as exc:
            done(exc)
        else:
            done(None)

    def _append_now(self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool) -> None:
        session_id = storage.meta.id
        lines = [encode_event(e) for e in events]
        entry = self.store._entries.get(session_id)
        if not is_materialized:
            if entry is not None:
                raise SessionAlreadyExistsError(f'session "{session_id}" already has a persisted log')
            check_contiguous(session_id, 0, events)
            if len(events) < storage.inherited_event_count:
                raise ValueError(f'session "{session_id}" cannot materialize before its inherited prefix is complete')
            self.store._entries[session_id] = _Entry(
                header=header_to_builtins(storage.meta),
                inherited_event_count=storage.inherited_event_count,
                lines=lines,
                generation=next(self.store._counter),
            )
            return
        if entry is None:
            raise SessionNotFoundError(session_id)
        if entry.torn is not None:
            # Appending after a torn fragment would bury it mid-log; the coordinator repairs before appending.
            raise SessionPersistenceCorruptionError(f'session "{session_id}" has an unrepaired torn tail')
        check_contiguous(session_id, len(entry.lines), events)
        entry.lines.extend(lines)
        self.store._bump(entry)

    async def commit_repair(
        self, storage: StorageMetadata, torn_marker: object | None, closers: Sequence[SessionEvent]
    ) -> None:
        """Drop the torn fragment (if ``torn_marker is not None``), then append ``closers``."""
        await anyio.lowlevel.checkpoint()
        session_id = storage.meta.id
        entry = self.store._require(session_id)
        if torn_marker is not None:
            if torn_marker != len(entry.lines):
                raise SessionPersistenceCorruptionError(
                    f'session "{session_id}" changed since its torn tail was observed (marker {torn_marker!r})'
                )
            entry.torn = None
        if entry.torn is not None and closers:
            raise SessionPersistenceCorruptionError(f'session "{session_id}" has an unrepaired torn tail')
        check_contiguous(session_id, len(entry.lines), closers)
        entry.lines.extend(encode_event(e) for e in closers)
        self.store._bump(entry)

    async def materialize_header(self, storage: StorageMetadata) -> None:
        """Create a header-only entry; refuses to clobber an existing one."""
        await anyio.lowlevel.checkpoint()
        session_id = storage.meta.id
        if session_id in self.store._entries:
            raise SessionAlreadyExistsError(f'session "{session_id}" already has a persisted log')
        self.store._entries[session_id] = _Entry(
            header=header_to_builtins(storage.meta),
            inherited_event_count=storage.inherited_event_count,
            lines=[],
            generation=next(self.store._counter),
        )

    async def rewrite(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        """Replace the whole log with ``events`` (contiguous from 0); header and cut unchanged."""
        await anyio.lowlevel.checkpoint()
        session_id = storage.meta.id
        entry = self.store._require(session_id)
        check_contiguous(session_id, 0, events)
        entry.lines = [encode_event(e) for e in events]
        entry.torn = None
        self.store._bump(entry)

    async def delete(self, session_id: str, expected_revision: str | None = None) -> None:
        """Remove the entry in one step; unknown ids raise, a moved revision refuses (nothing removed)."""
        await anyio.lowlevel.checkpoint()
        self.store._require(session_id)
        held = self.store._leases.get(session_id)
        if held is not None:
            raise SessionLockedError(session_id, held.holder)
        if expected_revision is not None and self.store.revision(session_id) != expected_revision:
            raise SessionChangedError(session_id)
        del self.store._entries[session_id]

    async def compact(self, storage: StorageMetadata, events: Sequence[SessionEvent], expected_revision: str) -> None:
        """Replace the lines with ``events`` in one step iff the revision is still ``expected_revision``."""
        await anyio.lowlevel.checkpoint()
        session_id = storage.meta.id
        entry = self.store._require(session_id)
        if self.store.revision(session_id) != expected_revision:
            raise SessionChangedError(session_id)
        check_contiguous(session_id, 0, events)
        entry.header = header_to_builtins(storage.meta)
        entry.inherited_event_count = storage.inherited_event_count
        entry.lines = [encode_event(e) for e in events]
        entry.torn = None
        entry.generation = next(self.store._counter)

    async def aclose(self) -> None:
        """Nothing to release."""
        await anyio.lowlevel.checkpoint()

    # -- internals ---------------------------------------------------------------------------------------

    @staticmethod
    def _decode(session_id: str, entry: _Entry, from_seq: int) -> tuple[SessionHeader, builtins.list[SessionEvent]]:
        try:
            meta = _header(entry.header)
            events = [decode_event_line(line) for line in entry.lines[from_seq:]]
        except (ValueError, msgspec.MsgspecError) as exc:
            raise SessionPersistenceCorruptionError(f'stored session "{session_id}" failed validation: {exc}') from exc
        return meta, events
