"""``JsonlBackend``: one append-only ``.jsonl.zstd`` (or ``.jsonl``) transcript per session (spec/jsonl.md).

Each primitive runs its blocking work off the event loop in one call, one durable step per call. Mutating
primitives run on the backend's long-lived writer (``BlockingWriter``: one session's steps in order on one lane,
many sessions' steps sharing a wake), shielded so cancellation can never interrupt a write half-way (a cancelled
caller waits for the step, then sees the cancellation). Reads run in a worker thread
(``anyio.to_thread.run_sync``) and call ``anyio.from_thread.check_cancelled`` between frames and directory reads,
so a cancelled ``load`` or ``list`` stops at the next boundary.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import ClassVar

from dsh.session_persistence.backend import (
    ListQuery,
    RawArtifact,
    SalvagedLog,
    SessionEvent,
    SessionHeader,
    SessionListing,
    SessionLocation,
    SessionSnapshot,
    StorageMetadata,
    StoredArtifact,
    StoredPrefix,
    StoredSuffix,
)

from ._backend import JsonlWrites
from ._backend_core import JsonlCore, SessionLogExistsError
from ._backend_reads import JsonlReads
from ._files.discovery import Damaged
from ._files.lease import JsonlWriterLease
from ._format.bounded import DEFAULT_MAX_BATCH_BYTES
from ._format.frames import Compression
from ._format.v1_damage import DamagedTail
from .encryption import KeyProvider, StaticKeyProvider

__all__ = ["JsonlBackend", "SessionLogExistsError"]


class JsonlBackend:
    """Session logs as append-only JSONL files under ``root``, one directory per session.

    :param root: required storage root, made absolute once (lexically); created on first materialization.
    :param compression: ``"zstd"`` (default: one checksummed frame per durable batch) or ``"none"`` (plain
        JSONL). A root holds one encoding only.
    :param pack_chunks: pack runs of >= 3 streamed delta chunks into one storage row (write side only;
        reading always expands rows).
    :param max_batch_bytes: the largest batch this backend writes or reads, compressed and decompressed
        (default 256 MiB, far above any real batch). A stored batch or frame that declares more is reported as
        damage instead of being allocated; a batch that would need more is refused before anything is written.
    :param encryption: a key provider: every new session is sealed, and the store is marked sealed at its root
        (``.dsh-sealed``) before the first sealed bytes are written.
    :param allow_plaintext: without ``encryption``, a store marked sealed refuses every write of session data
        (:class:`~dsh.session_persistence_jsonl.SealedStoreError`, nothing written) unless this is ``True``: a
        forgotten key never writes plaintext sessions into a sealed store. Reads, listing and deletion need no key.

    Every storage failure surfaces as :class:`SessionStorageError` (errno and path kept, the ``OSError``
    chained); a write whose outcome is unknown as :class:`SessionWriteInDoubtError`.

    One class composed of three parts, each in its own module: the shared state and file/codec helpers
    (:class:`~._backend_core.JsonlCore`), the read primitives (:class:`~._backend_reads.JsonlReads`) and the write
    primitives (:class:`~._backend.JsonlWrites`); every primitive here hands its call to its part.
    """

    NAME: ClassVar[str] = "jsonl"
    supports_raw_artifacts: ClassVar[bool] = True

    @classmethod
    def key_options(cls, kind: str, name: str) -> dict[str, object]:
        """Constructor options for a key source a tool names (``dsh-sessions --key-env NAME`` / ``--key-file
        PATH``): ``{"encryption": StaticKeyProvider.from_source(kind, name)}``; a source without a usable key
        raises :class:`~dsh.session_persistence_jsonl.encryption.SessionKeyError`."""
        return {"encryption": StaticKeyProvider.from_source(kind, name)}

    def __init__(
        self,
        root: str | os.PathLike[str],
        compression: Compression = "zstd",
        pack_chunks: bool = True,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        encryption: KeyProvider | None = None,
        allow_plaintext: bool = False,
    ) -> None:
        self._core = JsonlCore(root, compression, pack_chunks, max_batch_bytes, encryption, allow_plaintext)
        self._reads = JsonlReads(self._core)
        self._writes = JsonlWrites(self._core)

    def __repr__(self) -> str:
        return repr(self._core)

    @property
    def root(self) -> str:
        """The storage root (absolute, made so lexically once)."""
        return self._core.root

    @property
    def compression(self) -> Compression:
        return self._core.compression

    @property
    def pack_chunks(self) -> bool:
        return self._core.pack_chunks

    @property
    def max_batch_bytes(self) -> int:
        return self._core.max_batch_bytes

    @property
    def encryption(self) -> KeyProvider | None:
        return self._core.encryption

    @property
    def allow_plaintext(self) -> bool:
        return self._core.allow_plaintext

    @property
    def name(self) -> str:
        """Label used in log lines and teardown errors."""
        return self._core.name

    def locate(self, meta: SessionHeader) -> SessionLocation:
        """Where this session's transcript lives (or would live). No I/O: works before the root exists."""
        return self._core.locate(meta)

    # --------------------------------------------------------------------------------------------------------
    # reads (JsonlReads)

    async def load_stored(self, session_id: str) -> StoredPrefix | None:
        """The longest valid contiguous prefix; a torn tail yields a :class:`TornTail` marker; damage raises."""
        return await self._reads.load_stored(session_id)

    async def load_stored_from(self, session_id: str, from_seq: int) -> StoredSuffix | None:
        """Events with ``seq >= from_seq``: a v1 log is walked by its declarations, reading only those batches."""
        return await self._reads.load_stored_from(session_id, from_seq)

    def iter_stored(self, session_id: str, from_seq: int) -> AsyncIterator[StoredSuffix]:
        """Stream the events with ``seq >= from_seq``: a v1 log is walked by its declarations, one bounded run
        (about 4,096 events) per worker-thread call, reading only the batches from ``from_seq`` on; a v0 log is
        read whole (its frames declare nothing to seek by). The log is read as it was when the stream opened."""
        return self._reads.iter_stored(session_id, from_seq)

    async def read_stored_revision(self, session_id: str) -> str | None:
        """The transcript's current stat revision, ``None`` if absent (also when it vanishes after lookup)."""
        return await self._reads.read_stored_revision(session_id)

    async def read_raw(self, session_id: str) -> RawArtifact | None:
        """The stored JSONL text (decoded, declarations left out), torn tail omitted; ``None`` if absent."""
        return await self._reads.read_raw(session_id)

    async def list(self) -> builtins.list[SessionHeader]:
        """Headers of every listable session (header pair / line / frame 0 only), sorted by path.

        A session whose header is damaged or oversized is left out here and reported by :meth:`list_damaged`;
        it never fails the listing of the others.
        """
        return await self._reads.list()

    async def list_damaged(self) -> builtins.list[Damaged]:
        """Session directories whose header cannot be listed (damaged, oversized, not a header, a symlink)."""
        return await self._reads.list_damaged()

    async def list_snapshots(self) -> builtins.list[SessionSnapshot]:
        """Headers with stat revisions; an artifact deleted between discovery and stat is omitted."""
        return await self._reads.list_snapshots()

    # --------------------------------------------------------------------------------------------------------
    # writes (JsonlWrites)

    async def materialize_header(self, storage: StorageMetadata) -> None:
        """Durably create a header-only transcript; fails if one already exists (never clobbers)."""
        await self._writes.materialize_header(storage)

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        """Durably append one declared batch, in one write. The first batch publishes header + batch atomically.

        An empty batch is a no-op (it never materializes). A failed append is rolled back to the prior length.
        The first write to a v0 transcript upgrades the whole file to v1 (atomically, see ``docs/operations.md``).
        """
        await self._writes.append_batch(storage, events, is_materialized)

    def submit_append_batch(
        self,
        storage: StorageMetadata,
        events: Sequence[SessionEvent],
        is_materialized: bool,
        done: Callable[[BaseException | None], None],
    ) -> None:
        self._writes.submit_append_batch(storage, events, is_materialized, done)

    async def commit_repair(
        self, storage: StorageMetadata, torn_marker: object | None, closers: Sequence[SessionEvent]
    ) -> None:
        """Cut the torn tail (if any), then append ``closers`` (and a v0 tail's recovered events) as one batch.

        Two durable steps, not atomic: a crash between them loses only never-acknowledged torn data, and the
        next load repairs again. On a v0 transcript both happen in its upgrade to v1 (one atomic replace).
        """
        await self._writes.commit_repair(storage, torn_marker, closers)

    async def rewrite(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        """Atomically replace the log with ``events`` (a contiguous prefix, possibly empty); header kept."""
        await self._writes.rewrite(storage, events)

    async def find_damaged_tail(self, session_id: str) -> DamagedTail | None:
        """The damaged final batch of a session's v1 log (``None`` if none); never writes.

        Raises ``SessionPersistenceCorruptionError`` when the damage is not confined to the final batch.
        """
        return await self._writes.find_damaged_tail(session_id)

    async def discard_damaged_tail(self, session_id: str, tail: DamagedTail) -> None:
        """Cut the file at ``tail.start``, only if it still holds exactly that damaged final batch.

        The operator's explicit step (``dsh-sessions repair --discard-damaged-tail``), taken under the session's
        writer lease (refused while a writer holds it): load and crash repair never cut damage.
        """
        await self._writes.discard_damaged_tail(session_id, tail)

    @property
    def cursor_scope(self) -> str:
        """Listing cursors belong to this root (and encoding); a cursor from another root is refused."""
        return self._writes.cursor_scope

    async def list_page(self, query: ListQuery) -> builtins.list[SessionListing]:
        """A page by transcript modification time ("recent") or header creation time; see ``_lifecycle``.

        The root preflight (a root holding the other encoding is refused) runs once per backend instance, as for
        every other read. A "recent" page with a limit goes through the activity index (a cache in the root that
        writers keep and listings prove; see ``_files/activity``): it costs the ``stat`` of the sessions written
        since the last listing, of the page's rows, and of the project directories, plus the page's headers. A
        missing or unprovable index costs one ``stat`` per session, once, and is rebuilt.
        """
        return await self._writes.list_page(query)

    async def index_state(self) -> str:
        """The activity index's state: ``"ok (N sessions)"``, ``"missing ..."``, or why listings do not trust it
        (damaged, stale: a full scan answers them until the next listing rewrites it). ``verify`` reports it."""
        return await self._writes.index_state()

    async def list_artifacts(self) -> builtins.list[StoredArtifact]:
        """Every transcript file by name, readable or not (``verify`` reports the ones ``list`` leaves out)."""
        return await self._writes.list_artifacts()

    async def load_salvage(self, session_id: str) -> SalvagedLog | None:
        """The events before the first damage of the transcript (read-only); ``None`` if absent."""
        return await self._writes.load_salvage(session_id)

    async def delete(self, session_id: str, expected_revision: str | None = None) -> None:
        """Durably unlink the session's transcript (then its empty directory); unknown ids raise."""
        await self._writes.delete(session_id, expected_revision)

    async def compact(self, storage: StorageMetadata, events: Sequence[SessionEvent], expected_revision: str) -> None:
        """Atomically replace the transcript with the header and one declared batch, keeping its mtime.

        The result is log format v1 from a backend without a key provider and v2 (sealed under the current key)
        from one with it: a sealed log stays v2 (it cannot be read without the keys anyway), and a plaintext or v0
        log compacted by a keyed backend is sealed. A session larger than ``max_batch_bytes`` is refused
        (``BatchTooLargeError``) with nothing written.
        """
        await self._writes.compact(storage, events, expected_revision)

    async def writer_lease_holder(self, meta: SessionHeader) -> str | None:
        """Who holds the session's writer lease (``"pid 4242 on host-a"``), ``None`` when nobody does; reads the
        kernel's lock table (Linux), never takes, creates or writes the lock (``UnsupportedOperationError``
        elsewhere)."""
        return await self._writes.writer_lease_holder(meta)

    async def acquire_writer_lease(self, meta: SessionHeader) -> JsonlWriterLease:
        """Take the session's exclusive writer lease: a kernel lock on ``session.lock`` next to its transcript.

        Refused at once with ``SessionLockedError`` (naming the holder's pid and host) while another process, or
        another backend instance in this one, holds it; the kernel releases it when its holder dies.
        """
        return await self._writes.acquire_writer_lease(meta)

    async def aclose(self) -> None:
        """End the backend's writer threads once their queued steps are done, and close any kept append descriptor
        (normally closed already: each goes with its writer lease, which its holder, the coordinator, releases)."""
        await self._writes.aclose()
