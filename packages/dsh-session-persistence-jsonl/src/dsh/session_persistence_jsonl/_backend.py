"""``JsonlBackend``: one append-only ``.jsonl.zstd`` (or ``.jsonl``) transcript per session (spec/jsonl.md).

Each primitive runs its blocking work in one worker thread (``anyio.to_thread.run_sync``), one durable step per
call; mutating primitives are shielded so cancellation can never interrupt a write half-way (a cancelled caller
waits for the step, then sees the cancellation). Reads call ``anyio.from_thread.check_cancelled`` between frames
and directory reads, so a cancelled ``load`` or ``list`` stops at the next boundary.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Sequence
from functools import partial
from typing import ClassVar, TypeVar

from dsh.session_persistence.backend import (
    ListQuery,
    SalvagedLog,
    SessionEvent,
    SessionHeader,
    SessionListing,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionStorageError,
    StorageMetadata,
    StoredArtifact,
    check_contiguous,
)

from ._backend_core import SessionLogExistsError, _checkpoint, _cwd_of, _exists_error
from ._backend_reads import JsonlReads
from ._files.discovery import check_identity, check_target_dir, find_transcript
from ._files.fs import (
    append_durable,
    ensure_dir_chain,
    is_file,
    publish_exclusive,
    replace_durable,
    stable_read,
    truncate_durable,
)
from ._files.held_append import HeldAppender
from ._files.layout import project_dir_name, session_segment
from ._files.lease import JsonlWriterLease, acquire_lease, probe_holder
from ._files.lifecycle import compact_transcript, delete_transcript, list_artifacts, list_rows
from ._format.salvage import salvage_declared, salvage_raw, salvage_zstd
from ._format.upgrade import declared_log
from ._format.v0 import TornTail
from ._format.v1 import (
    is_declared,
)
from ._format.v1_damage import DamagedTail, find_damaged_tail

__all__ = ["JsonlBackend", "SessionLogExistsError"]

_T = TypeVar("_T")
RAW_FILENAME = "session.jsonl"


class JsonlBackend(JsonlReads):
    """Session logs as append-only JSONL files under ``root``, one directory per session.

    :param root: required storage root, made absolute once (lexically); created on first materialization.
    :param compression: ``"zstd"`` (default: one checksummed frame per durable batch) or ``"none"`` (plain
        JSONL). A root holds one encoding only.
    :param pack_chunks: pack runs of >= 3 streamed delta chunks into one storage row (write side only;
        reading always expands rows).
    :param max_batch_bytes: the largest batch this backend writes or reads, compressed and decompressed
        (default 256 MiB, far above any real batch). A stored batch or frame that declares more is reported as
        damage instead of being allocated; a batch that would need more is refused before anything is written.

    Every storage failure surfaces as :class:`SessionStorageError` (errno and path kept, the ``OSError``
    chained); a write whose outcome is unknown as :class:`SessionWriteInDoubtError`.
    """

    NAME: ClassVar[str] = "jsonl"
    supports_raw_artifacts: ClassVar[bool] = True

    # --------------------------------------------------------------------------------------------------------
    # writes

    def _materialize_sync(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        header = storage.meta
        check_contiguous(header.id, 0, events)
        # Encode everything before touching the disk: an encoding error must leave no trace.
        data, seal = self._encode_log(storage, events)
        self._ensure_preflight()
        project = project_dir_name(_cwd_of(header))
        segment = session_segment(header.id)
        # The other encoding's transcript may have appeared after an empty preflight (spec §1.5, place 4).
        check_target_dir(os.path.join(self.root, project, segment), self.compression)
        ensure_dir_chain(self.root, project, segment)
        path = self._path_for(header)
        refusal = f'refusing to materialize "{header.id}": a log already exists on disk (load/resume it instead)'
        if is_file(path):
            raise _exists_error(refusal, path)
        try:
            publish_exclusive(path, data)
        except FileExistsError as exc:
            raise _exists_error(refusal, path) from exc
        self._declared.add(path)
        self._remember_seal(path, seal)
        self._next_seqs.remember(path, os.stat(path), len(events))

    def _next_seq_sync(self, path: str, session_id: str) -> tuple[int, os.stat_result] | None:
        """The next seq of the v1 transcript at ``path`` (remembered, or decoded once) and its current stat;
        ``None`` when the file is a v0 log (which must be upgraded before anything is appended to it).

        What is remembered holds only while the file is exactly as this instance last saw it (same inode and
        size): a log replaced behind the backend (a 0.1 backup restored over it) is read again, so a v1 batch is
        never appended to a v0 file.
        """
        st = os.stat(path)
        known = self._next_seqs.lookup(path, st)
        if known is not None and path in self._declared:
            return known, st
        data, _revision = stable_read(path)
        if not is_declared(data[:64], self.compression):
            self._declared.discard(path)
            return None
        log = self._decode(data, path)
        if log.torn is not None:
            # Appending after a torn fragment would bury it mid-log; the coordinator repairs before appending.
            raise SessionPersistenceCorruptionError(f'session "{session_id}" has an unrepaired torn tail ("{path}")')
        return len(log.events), os.stat(path)

    async def materialize_header(self, storage: StorageMetadata) -> None:
        """Durably create a header-only transcript; fails if one already exists (never clobbers)."""
        work = self._noting_unsynced(storage.meta.id, lambda: self._materialize_sync(storage, ()))
        await self._run_shielded(self._announcing(storage.meta, work), "materializing the session log")

    def _upgrade_sync(
        self, storage: StorageMetadata, path: str, batch: builtins.list[SessionEvent], marker: TornTail | None
    ) -> None:
        """Rewrite a v0 transcript as v1 with ``batch`` appended (after cutting ``marker``'s torn tail, if any)."""
        data, revision = stable_read(path)
        if is_declared(data[:64], self.compression):
            # Upgraded meanwhile (another instance): only a torn tail read from the v0 file is now meaningless.
            if marker is not None:
                raise SessionStorageError(f'refusing to repair "{path}": it was rewritten since it was read', path=path)
            if batch:
                append_durable(path, self._encode_batch(batch, self._seal_for(path)))
            return
        log = self._decode(data, path)
        if marker is not None:
            if len(data) != marker.expected_size:
                raise SessionStorageError(
                    f'refusing to repair "{path}": its size changed from {marker.expected_size} to {len(data)} '
                    "since the torn tail was read",
                    path=path,
                )
            assert log.torn is not None
            committed = log.events[: len(log.events) - len(log.torn.recovered_events)]
        elif log.torn is not None:
            raise SessionStorageError(
                f'refusing to upgrade "{path}" to log format v1: it has a torn tail (load the session first)',
                path=path,
            )
        else:
            committed = log.events
        check_contiguous(storage.meta.id, len(committed), batch)
        stored = StorageMetadata(log.header, log.inherited_event_count)
        content = declared_log(stored, committed, batch, self.compression, self.pack_chunks, self.max_batch_bytes, path)
        replace_durable(path, content, expected_revision=revision)
        self._declared.add(path)

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        """Durably append one declared batch, in one write. The first batch publishes header + batch atomically.

        An empty batch is a no-op (it never materializes). A failed append is rolled back to the prior length.
        The first write to a v0 transcript upgrades the whole file to v1 (atomically, see ``docs/operations.md``).
        """
        if not events:
            return
        batch = list(events)
        if not is_materialized:
            first = self._noting_unsynced(storage.meta.id, lambda: self._materialize_sync(storage, batch))
            await self._run_shielded(self._announcing(storage.meta, first), "materializing the session log")
            return
        path = self._path_for(storage.meta)

        append = self._noting_unsynced(storage.meta.id, partial(self._append_sync, storage, path, batch))
        await self._run_shielded(self._announcing(storage.meta, append), "appending to the session log")

    def _append_sync(self, storage: StorageMetadata, path: str, batch: list[SessionEvent]) -> None:
        """The worker-thread half of :meth:`append_batch`: check the seq, encode, one durable write."""
        found = self._next_seq_sync(path, storage.meta.id)
        if found is None:
            self._next_seqs.forget(path)
            self._upgrade_sync(storage, path, batch, None)
            return
        next_seq, st = found
        check_contiguous(storage.meta.id, next_seq, batch)
        data = self._encode_batch(batch, self._seal_for(path))
        self._next_seqs.forget(path)
        appender = self._appenders.get(path)
        if appender is None:
            append_durable(path, data)
        else:
            appender.append(path, st, data)
        self._next_seqs.remember(path, (st.st_dev, st.st_ino, st.st_size + len(data)), next_seq + len(batch))

    async def commit_repair(
        self, storage: StorageMetadata, torn_marker: object | None, closers: Sequence[SessionEvent]
    ) -> None:
        """Cut the torn tail (if any), then append ``closers`` (and a v0 tail's recovered events) as one batch.

        Two durable steps, not atomic: a crash between them loses only never-acknowledged torn data, and the
        next load repairs again. On a v0 transcript both happen in its upgrade to v1 (one atomic replace).
        """
        if torn_marker is not None and not isinstance(torn_marker, TornTail):
            raise TypeError(f"torn_marker must come from this backend's load_stored, got {type(torn_marker).__name__}")
        path = self._path_for(storage.meta)
        marker = torn_marker
        batch = [*(marker.recovered_events if marker is not None else ()), *closers]

        def work() -> None:
            self._next_seqs.forget(path)
            if not self._is_declared_file(path):
                self._upgrade_sync(storage, path, batch, marker)
                return
            if marker is not None:
                truncate_durable(path, marker.truncate_to, marker.expected_size)
            if batch:
                # Closers computed from a stale read must not land after another writer's batch.
                found = self._next_seq_sync(path, storage.meta.id)
                if found is None:  # replaced by a v0 log since the check above: upgrade it as usual
                    self._upgrade_sync(storage, path, batch, None)
                    return
                check_contiguous(storage.meta.id, found[0], batch)
                append_durable(path, self._encode_batch(batch, self._seal_for(path)))

        repair = self._announcing(storage.meta, self._noting_unsynced(storage.meta.id, work))
        await self._run_shielded(repair, "repairing the session log")

    async def rewrite(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        """Atomically replace the log with ``events`` (a contiguous prefix, possibly empty); header kept."""
        path = self._path_for(storage.meta)
        batch = list(events)

        def work() -> None:
            data, _seal = self._encode_log(storage, batch)
            try:
                os.lstat(path)
            except FileNotFoundError:
                raise SessionNotFoundError(storage.meta.id) from None
            self._next_seqs.forget(path)
            replace_durable(path, data)
            self._declared.add(path)

        rewrite = self._announcing(storage.meta, self._noting_unsynced(storage.meta.id, work))
        await self._run_shielded(rewrite, "rewriting the session log")

    # --------------------------------------------------------------------------------------------------------
    # the operator's explicit step for a damaged final batch

    def _damaged_tail_sync(self, session_id: str) -> DamagedTail | None:
        path = self._find(session_id)
        if path is None:
            raise SessionNotFoundError(session_id)
        data, _revision = stable_read(path)
        return find_damaged_tail(data, self.compression, path, self.max_batch_bytes, self.encryption)

    async def find_damaged_tail(self, session_id: str) -> DamagedTail | None:
        """The damaged final batch of a session's v1 log (``None`` if none); never writes.

        Raises ``SessionPersistenceCorruptionError`` when the damage is not confined to the final batch.
        """
        return await self._run(lambda: self._damaged_tail_sync(session_id), "reading the session log")

    async def discard_damaged_tail(self, session_id: str, tail: DamagedTail) -> None:
        """Cut the file at ``tail.start``, only if it still holds exactly that damaged final batch.

        The operator's explicit step (``dsh-sessions repair --discard-damaged-tail``), taken under the session's
        writer lease (refused while a writer holds it): load and crash repair never cut damage.
        """

        def work() -> None:
            # Under the session's writer lease: refused (SessionLockedError) while any writer holds the session.
            lease = acquire_lease(self.root, os.path.dirname(tail.path), session_id)
            self._activity.announce(tail.path, lease.inode)
            try:
                current = self._damaged_tail_sync(session_id)
                if current != tail:
                    raise SessionStorageError(
                        f'refusing to discard the damaged tail of "{tail.path}": the log changed since it was examined',
                        path=tail.path,
                    )
                truncate_durable(tail.path, tail.start, tail.size)
            finally:
                lease.release_sync()
                self._activity.retire(tail.path)

        await self._run_shielded(work, "discarding the damaged final batch")

    # --------------------------------------------------------------------------------------------------------
    # lifecycle (the work lives in _lifecycle)

    @property
    def cursor_scope(self) -> str:
        """Listing cursors belong to this root (and encoding); a cursor from another root is refused."""
        return f"jsonl:{self.compression}:{os.path.realpath(self.root)}"

    async def list_page(self, query: ListQuery) -> builtins.list[SessionListing]:
        """A page by transcript modification time ("recent") or header creation time; see ``_lifecycle``.

        The root preflight (a root holding the other encoding is refused) runs once per backend instance, as for
        every other read. A "recent" page with a limit goes through the activity index (a cache in the root that
        writers keep and listings prove; see ``_files/activity``): it costs the ``stat`` of the sessions written
        since the last listing, of the page's rows, and of the project directories, plus the page's headers. A
        missing or unprovable index costs one ``stat`` per session, once, and is rebuilt.
        """

        def work() -> builtins.list[SessionListing]:
            self._ensure_preflight()
            return list_rows(self.root, self.compression, query, self.max_batch_bytes, _checkpoint)

        return await self._run(work, "listing sessions")

    async def list_artifacts(self) -> builtins.list[StoredArtifact]:
        """Every transcript file by name, readable or not (``verify`` reports the ones ``list`` leaves out)."""
        return await self._run(lambda: list_artifacts(self.root, self.compression, _checkpoint), "listing transcripts")

    async def load_salvage(self, session_id: str) -> SalvagedLog | None:
        """The events before the first damage of the transcript (read-only); ``None`` if absent."""

        def work() -> SalvagedLog | None:
            self._ensure_preflight()
            path = find_transcript(self.root, session_id, self.compression, _checkpoint)
            if path is None:
                return None
            try:
                data, _revision = stable_read(path)
            except FileNotFoundError:
                return None
            if is_declared(data[:64], self.compression):
                salvaged = salvage_declared(data, self.compression, path, self.max_batch_bytes, self.encryption)
            else:
                salvaged = (salvage_zstd if self.compression == "zstd" else salvage_raw)(data, path)
            check_identity(self.root, self.compression, path, salvaged.meta, session_id)
            return salvaged

        return await self._run(work, "salvaging the session log")

    async def delete(self, session_id: str, expected_revision: str | None = None) -> None:
        """Durably unlink the session's transcript (then its empty directory); unknown ids raise."""

        def work() -> None:
            self._ensure_preflight()
            delete_transcript(self.root, self.compression, session_id, expected_revision, _checkpoint)

        await self._run_shielded(work, "deleting the session log")

    async def compact(self, storage: StorageMetadata, events: Sequence[SessionEvent], expected_revision: str) -> None:
        """Atomically replace the transcript with the header and one declared batch, keeping its mtime.

        The result is always the current (v1) format; a session larger than ``max_batch_bytes`` is refused
        (``BatchTooLargeError``) with nothing written.
        """
        path = self._path_for(storage.meta)
        batch = list(events)

        def work() -> None:
            # Encoded before anything is touched: an encoding error leaves no trace.
            data, _seal = self._encode_log(storage, batch)
            compact_transcript(path, storage.meta.id, data, expected_revision)
            self._declared.add(path)

        compact = self._announcing(storage.meta, self._noting_unsynced(storage.meta.id, work))
        await self._run_shielded(compact, "compacting the session log")

    async def writer_lease_holder(self, meta: SessionHeader) -> str | None:
        """Who holds the session's writer lease (``"pid 4242 on host-a"``), ``None`` when nobody does; reads the
        kernel's lock table (Linux), never takes, creates or writes the lock (``UnsupportedOperationError``
        elsewhere)."""
        session_dir = os.path.dirname(self._path_for(meta))
        return await self._run(lambda: probe_holder(session_dir), "reading the writer lease")

    async def acquire_writer_lease(self, meta: SessionHeader) -> JsonlWriterLease:
        """Take the session's exclusive writer lease: a kernel lock on ``session.lock`` next to its transcript.

        Refused at once with ``SessionLockedError`` (naming the holder's pid and host) while another process, or
        another backend instance in this one, holds it; the kernel releases it when its holder dies.
        """
        path = self._path_for(meta)
        session_dir = os.path.dirname(path)

        def take() -> JsonlWriterLease:
            lease = acquire_lease(self.root, session_dir, meta.id)
            self._activity.announce(path, lease.inode)  # before any write under it; retired on release
            return lease

        lease = await self._run_shielded(take, "taking the writer lease")
        # While the lease is held, appends reuse one descriptor; it is closed when the lease is released.
        appender = HeldAppender()
        self._appenders[path] = appender

        def forget() -> None:
            appender.close()
            if self._appenders.get(path) is appender:
                del self._appenders[path]
            self._activity.retire(path)

        lease.on_release(forget)
        return lease

    async def aclose(self) -> None:
        """Close any kept append descriptor (normally closed already: each goes with its writer lease, which its
        holder, the coordinator, releases)."""
        for appender in list(self._appenders.values()):
            appender.close()
        self._appenders.clear()
        self._activity.retire_all()
