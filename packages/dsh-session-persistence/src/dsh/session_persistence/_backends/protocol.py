"""The backend protocol: the only contract between the coordinator and storage (coordinator.md §2.1).

A backend implements small durable primitives; the :class:`~dsh.session_persistence.PersistenceCoordinator`
owns serialization, cursors, lazy materialization, validation and crash repair on top of them. Blocking I/O
belongs in worker threads (``anyio.to_thread.run_sync``), one durable step per call.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .._model.events import SessionEvent
from .._model.header import SessionHeader

__all__ = [
    "RawArtifact",
    "SalvagedLog",
    "SessionBackend",
    "SessionLocation",
    "SessionSnapshot",
    "StorageMetadata",
    "StoredArtifact",
    "StoredPrefix",
    "StoredSuffix",
    "SupportsArtifactScan",
    "SupportsCompact",
    "SupportsDelete",
    "SupportsKeySources",
    "SupportsSalvage",
    "SupportsAclose",
    "SupportsLocate",
    "SupportsMaterializeHeader",
    "SupportsRawArtifacts",
    "SupportsRewrite",
    "SupportsSeek",
    "SupportsSubmitAppend",
    "SupportsWriterLease",
    "WriterLease",
]


@dataclass(frozen=True, slots=True)
class StorageMetadata:
    """The header and the exact inherited cut, which always travel together."""

    meta: SessionHeader
    inherited_event_count: int = 0


@dataclass(slots=True)
class StoredPrefix:
    """What ``load_stored`` returns: the longest valid contiguous prefix from seq 0.

    ``torn_marker`` is opaque to the coordinator and is present (``is not None``) iff a never-committed tail
    fragment follows ``events``; it is handed back unchanged to ``commit_repair``. ``revision`` identifies
    exactly these values. The objects must be fresh and unshared. ``events`` is any sequence: a list, or a
    :class:`~dsh.session_persistence.backend.StoredEvents` whose packed chunk runs expand only where a reader asks.
    """

    meta: SessionHeader
    inherited_event_count: int
    events: Sequence[SessionEvent]
    revision: str
    torn_marker: object | None = None


@dataclass(frozen=True, slots=True)
class StoredSuffix:
    """What the optional seek read ``load_stored_from`` returns (no torn marker, nothing repaired)."""

    meta: SessionHeader
    inherited_event_count: int
    events: Sequence[SessionEvent]


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """A stored header with an opaque revision token: compare revisions with ``==`` only."""

    header: SessionHeader
    revision: str


@dataclass(frozen=True, slots=True)
class SessionLocation:
    """Where a backend keeps one session's artifact: a hint, not proof that it exists."""

    kind: str
    path: str


@dataclass(frozen=True, slots=True)
class RawArtifact:
    """A session's artifact text, verbatim (decoded from compression, never re-serialized)."""

    meta: SessionHeader
    inherited_event_count: int
    filename: str
    content: str


@runtime_checkable
class SessionBackend(Protocol):
    """Durable primitives every backend provides.

    Optional primitives are separate protocols a backend may also satisfy (:class:`SupportsSeek`,
    :class:`SupportsMaterializeHeader`, :class:`SupportsRewrite`, :class:`SupportsLocate`,
    :class:`SupportsRawArtifacts`, :class:`SupportsAclose`, :class:`SupportsWriterLease`); the coordinator
    checks them once, when it is built.
    """

    @property
    def NAME(self) -> str:  # a property so both ClassVar and per-instance names satisfy the protocol
        """Unique backend name, used by discovery, the CLI and log lines (e.g. ``"memory"``, ``"jsonl"``)."""
        ...

    async def load_stored(self, session_id: str) -> StoredPrefix | None:
        """Find the id in every storage scope; ``None`` if absent. Committed-region damage must raise."""
        ...

    async def read_stored_revision(self, session_id: str) -> str | None:
        """Cheap current revision of the stored log, ``None`` if absent."""
        ...

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        """Durably append a contiguous batch; header, cut and first batch commit atomically when not materialized."""
        ...

    async def commit_repair(
        self, storage: StorageMetadata, torn_marker: object | None, closers: Sequence[SessionEvent]
    ) -> None:
        """Truncate the torn tail (if ``torn_marker is not None``), then durably append ``closers``."""
        ...

    async def list(self) -> builtins.list[SessionHeader]:
        """Headers of every materialized session, without parsing logs."""
        ...

    async def list_snapshots(self) -> builtins.list[SessionSnapshot]:
        """Headers with revisions of every materialized session, without parsing logs."""
        ...


# ----------------------------------------------------------------------------------------------------------------
# Optional lifecycle primitives. The coordinator checks them with ``isinstance(backend, SupportsX)`` and raises
# UnsupportedOperationError when a backend has none; every one is independent of the others.


@runtime_checkable
class SupportsDelete(Protocol):
    """A backend that can durably remove one session's stored log."""

    async def delete(self, session_id: str, expected_revision: str | None = None) -> None:
        """Durably remove the stored log: once this returns no ``load``/``list`` sees it, even after a crash.

        Raises ``SessionNotFoundError`` if nothing is stored under the id, and ``SessionChangedError`` (deleting
        nothing) when ``expected_revision`` is given and the stored revision is another one. A backend with a
        writer lease takes it for the deletion and raises ``SessionLockedError`` (naming the holder, deleting
        nothing) while another writer holds it. A crash part-way leaves either the whole log or no log, never a
        readable fragment.
        """
        ...


@runtime_checkable
class SupportsCompact(Protocol):
    """A backend that can rewrite a closed session's log as one batch."""

    async def compact(self, storage: StorageMetadata, events: Sequence[SessionEvent], expected_revision: str) -> None:
        """Atomically replace the stored log with the header, cut and ``events`` written as one batch.

        ``events`` are exactly the stored events (the coordinator read and validated them at
        ``expected_revision``). If the stored revision is no longer ``expected_revision`` nothing is written and
        ``SessionChangedError`` is raised; a crash leaves the old log or the new one, never a mixture.
        """
        ...


@dataclass(frozen=True, slots=True)
class StoredArtifact:
    """One stored artifact that may hold a session, readable or not.

    ``session_id`` is ``None`` when the storage name does not decode to an id; ``location`` is where it is.
    """

    session_id: str | None
    location: str


@runtime_checkable
class SupportsArtifactScan(Protocol):
    """A backend that can enumerate what it stores without reading it (for integrity checks)."""

    async def list_artifacts(self) -> builtins.list[StoredArtifact]:
        """Every artifact that may hold a session, including empty, header-less and damaged ones, which ``list``
        leaves out. Reads names (and at most metadata), never content."""
        ...


@dataclass(frozen=True, slots=True)
class SalvagedLog:
    """The events stored before the first damage of a log, and what the damage was (``None``: none found).

    ``events`` are contiguous from seq 0 and each decoded completely; nothing after the first defect is kept,
    even if later bytes happen to decode (they cannot be trusted to follow what was lost).
    """

    meta: SessionHeader
    inherited_event_count: int
    events: builtins.list[SessionEvent]
    damage: str | None


@runtime_checkable
class SupportsSalvage(Protocol):
    """A backend that can read the intact prefix of a damaged log (never writes)."""

    async def load_salvage(self, session_id: str) -> SalvagedLog | None:
        """The longest decodable prefix; ``None`` if absent. A header that cannot be read still raises."""
        ...


# Optional primitives: each one a protocol, resolved once when the coordinator is built.


@runtime_checkable
class SupportsSeek(Protocol):
    """A seek read: header, cut and only the events with ``seq >= from_seq`` (``None`` if absent).

    Non-mutating, no torn marker; past the end it returns an empty ``events`` list, not ``None``.
    """

    async def load_stored_from(self, session_id: str, from_seq: int) -> StoredSuffix | None: ...


@runtime_checkable
class SupportsStreamingRead(Protocol):
    """A streaming read: the stored events with ``seq >= from_seq``, a run at a time, in memory independent of
    the log's length.

    ``iter_stored`` is an async generator. It raises ``SessionNotFoundError`` when the session is absent;
    otherwise it yields at least one :class:`StoredSuffix` (header, cut and the next run of events, in seq
    order, contiguous across runs, starting exactly at ``from_seq``; the first run may be empty). It reads the
    log as it was when the iteration started, stops at a torn tail (never acknowledged) and raises on damage
    when it reaches it. Non-mutating.
    """

    def iter_stored(self, session_id: str, from_seq: int) -> AsyncIterator[StoredSuffix]: ...


@runtime_checkable
class SupportsMaterializeHeader(Protocol):
    """Durably create a header-only artifact; must refuse (never clobber) when one already exists."""

    async def materialize_header(self, storage: StorageMetadata) -> None: ...


@runtime_checkable
class SupportsRewrite(Protocol):
    """Atomically replace the whole event log with a contiguous prefix (possibly empty), header and cut kept."""

    async def rewrite(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None: ...


@runtime_checkable
class SupportsLocate(Protocol):
    """Where the artifact of ``meta`` lives or would live (no I/O), ``None`` without one artifact per session."""

    def locate(self, meta: SessionHeader) -> SessionLocation | None: ...


@runtime_checkable
class SupportsRawArtifacts(Protocol):
    """The stored artifact verbatim (``None`` if absent); only used when ``supports_raw_artifacts`` is true."""

    supports_raw_artifacts: bool

    async def read_raw(self, session_id: str) -> RawArtifact | None: ...


@runtime_checkable
class SupportsSubmitAppend(Protocol):
    """``append_batch`` without an ``await``: start the durable append now, report its end through a callback.

    The coordinator's live path commits through this primitive when a backend has it, so a durable commit costs no
    task, cancel scope or worker-thread round trip on the event loop: the backend hands the step to a writer of its
    own (a long-lived thread, a connection's pipeline) and calls ``done(error)`` exactly once when the step has
    ended, from any thread (``None``: durable, with the same meaning as ``append_batch`` returning; otherwise what
    ``append_batch`` would have raised). ``submit_append_batch`` itself either raises before anything is started
    (then ``done`` is never called) or returns at once; it never blocks, and a started step runs to its end
    whatever happens to the caller. ``append_batch`` stays the primitive for every other caller.
    """

    def submit_append_batch(
        self,
        storage: StorageMetadata,
        events: Sequence[SessionEvent],
        is_materialized: bool,
        done: Callable[[BaseException | None], None],
    ) -> None: ...


@runtime_checkable
class SupportsAclose(Protocol):
    """Release the backend's handles; awaited once, after the coordinator's final drain."""

    async def aclose(self) -> None: ...


@runtime_checkable
class WriterLease(Protocol):
    """An exclusive right to write one session, held until :meth:`release` (idempotent).

    ``holder`` describes this writer as another one would see it (for example ``"pid 4242 on host-a"``).
    """

    @property
    def holder(self) -> str | None: ...

    async def release(self) -> None: ...


@runtime_checkable
class SupportsLeaseProbe(Protocol):
    """A backend that can tell, without taking it or writing anything, whether a session's writer lease is held.

    ``writer_lease_holder(meta)`` returns the holder's description (as :attr:`WriterLease.holder`, e.g.
    ``"pid 4242 on host-a"``; ``""`` when held by a writer that names none) while another process holds the lease,
    ``None`` while none does. It raises :class:`~dsh.session_persistence.UnsupportedOperationError` when it cannot
    tell on this platform. Read-only tools use it to show a session being written as live, not as interrupted.
    """

    async def writer_lease_holder(self, meta: SessionHeader) -> str | None: ...


@runtime_checkable
class SupportsWriterLease(Protocol):
    """One writer per session: take the session's exclusive writer lease, or refuse at once.

    ``acquire_writer_lease(meta)`` returns a :class:`WriterLease`, or raises
    :class:`~dsh.session_persistence.SessionLockedError` (naming the holder where known) if another writer, in
    this process or another one, holds it. It never waits for the other writer. ``meta`` is the header the
    session is (or will be) stored under, so a file backend can keep the lock next to the artifact. A lease
    must end when its holder dies (a kernel lock, a database session), so no stale lease needs cleaning. A
    backend without this primitive gives no cross-writer exclusion: two writers are then detected only by the
    backend's own checks (seq contiguity, an exclusive first publication).
    """

    async def acquire_writer_lease(self, meta: SessionHeader) -> WriterLease: ...


@runtime_checkable
class SupportsKeySources(Protocol):
    """A backend *class* whose stores may be encrypted: it turns a key source named by a tool into constructor
    options, so ``dsh-sessions --key-env NAME`` / ``--key-file PATH`` open encrypted stores without the core ever
    seeing a key or a cipher.

    ``key_options(kind, name)`` (``kind``: ``"env"``, an environment variable named ``name``; ``"file"``, a key
    file at path ``name``) returns keyword arguments for the constructor. A source that holds no usable key
    raises :class:`~dsh.session_persistence.SessionKeyError` naming the source, never the key bytes.
    """

    @classmethod
    def key_options(cls, kind: str, name: str) -> dict[str, object]: ...
