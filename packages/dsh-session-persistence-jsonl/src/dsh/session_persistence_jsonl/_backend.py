"""The JSONL backend's write primitives: materialize, append (upgrading a v0 log first), crash repair, rewrite,
damaged-tail discard, lifecycle (list page, artifacts, salvage, delete, compact), writer leases and close. Each
mutating one is one durable step on the backend's long-lived writer (``JsonlCore._write``: one session's steps in
order on one lane, many sessions' steps sharing a wake), shielded (see ``_facade``)."""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Sequence
from typing import TypeVar

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

from ._backend_core import JsonlCore, _checkpoint, _cwd_of, _exists_error
from ._files.activity_check import index_state
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

__all__ = ["JsonlWrites"]

_T = TypeVar("_T")
RAW_FILENAME = "session.jsonl"


class JsonlWrites:
    """The write side of ``JsonlBackend`` (materialize, append, repair, rewrite, lifecycle, leases, close), over its
    :class:`JsonlCore`."""

    def __init__(self, core: JsonlCore) -> None:
        self._core = core

    # --------------------------------------------------------------------------------------------------------
    # writes

    def _materialize_sync(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        header = storage.meta
        check_contiguous(header.id, 0, events)
        # Encode everything before touching the disk: an encoding error must leave no trace.
        data, seal = self._core._encode_log(storage, events)
        self._core._ensure_preflight()
        project = project_dir_name(_cwd_of(header))
        segment = session_segment(header.id)
        # The other encoding's transcript may have appeared after an empty preflight (spec §1.5, place 4).
        check_target_dir(os.path.join(self._core.root, project, segment), self._core.compression)
        ensure_dir_chain(self._core.root, project, segment)
        self._core._mark_sealed()  # a keyed backend's first write may have just created the root
        path = self._core._path_for(header)
        refusal = f'refusing to materialize "{header.id}": a log already exists on disk (load/resume it instead)'
        if is_file(path):
            raise _exists_error(refusal, path)
        try:
            publish_exclusive(path, data)
        except FileExistsError as exc:
            raise _exists_error(refusal, path) from exc
        self._core._declared.add(path)
        st = os.stat(path)
        self._core._remember_seal(path, st, seal)
        self._core._next_seqs.remember(path, st, len(events))

    def _next_seq_sync(self, path: str, session_id: str) -> tuple[int, os.stat_result] | None:
        """The next seq of the v1 transcript at ``path`` (remembered, or decoded once) and its current stat;
        ``None`` when the file is a v0 log (which must be upgraded before anything is appended to it).

        What is remembered holds only while the file is exactly as this instance last saw it (same inode and
        size): a log replaced behind the backend (a 0.1 backup restored over it) is read again, so a v1 batch is
        never appended to a v0 file.
        """
        st = os.stat(path)
        known = self._core._next_seqs.lookup(path, st)
        if known is not None and path in self._core._declared:
            return known, st
        data, _revision = stable_read(path)
        if not is_declared(data[:64], self._core.compression):
            self._core._declared.discard(path)
            return None
        log = self._core._decode(data, path)
        if log.torn is not None:
            # Appending after a torn fragment would bury it mid-log; the coordinator repairs before appending.
            raise SessionPersistenceCorruptionError(f'session "{session_id}" has an unrepaired torn tail ("{path}")')
        return len(log.events), os.stat(path)

    async def materialize_header(self, storage: StorageMetadata) -> None:
        await self._core._write(storage.meta, "materializing the session log", self._materialize_sync, storage, ())

    def _upgrade_sync(
        self, storage: StorageMetadata, path: str, batch: Sequence[SessionEvent], marker: TornTail | None
    ) -> None:
        """Rewrite a v0 transcript as v1 with ``batch`` appended (after cutting ``marker``'s torn tail, if any)."""
        data, revision = stable_read(path)
        if is_declared(data[:64], self._core.compression):
            # Upgraded meanwhile (another instance): only a torn tail read from the v0 file is now meaningless.
            if marker is not None:
                raise SessionStorageError(f'refusing to repair "{path}": it was rewritten since it was read', path=path)
            if batch:
                append_durable(path, self._core._encode_batch(batch, self._core._seal_for(path)))
            return
        log = self._core._decode(data, path)
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
        content = declared_log(
            stored, committed, batch, self._core.compression, self._core.pack_chunks, self._core.max_batch_bytes, path
        )
        replace_durable(path, content, expected_revision=revision)
        self._core._declared.add(path)

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        if not events:
            return
        batch = list(events)
        if not is_materialized:
            await self._core._write(
                storage.meta, "materializing the session log", self._materialize_sync, storage, batch
            )
            return
        path = self._core._path_for(storage.meta)
        await self._core._write(storage.meta, "appending to the session log", self._append_sync, storage, path, batch)

    def submit_append_batch(
        self,
        storage: StorageMetadata,
        events: Sequence[SessionEvent],
        is_materialized: bool,
        done: Callable[[BaseException | None], None],
    ) -> None:
        """:meth:`append_batch` without an await (the core's ``SupportsSubmitAppend``): the same durable step, queued
        on the writer now; ``done`` hears how it ended, from the writer thread."""
        if not events:
            done(None)
            return
        core = self._core
        path = core._path_for(storage.meta)  # once per barrier: the step's own path is the transcript's
        # The step reads the events later, on the writer: a tuple (the coordinator's) cannot change meanwhile, so it
        # is handed on as it is; anything else is copied now.
        batch = events if type(events) is tuple else tuple(events)
        if not is_materialized:
            core._submit_write(
                storage.meta, path, "materializing the session log", self._materialize_sync, (storage, batch), done
            )
            return
        core._submit_write(
            storage.meta, path, "appending to the session log", self._append_sync, (storage, path, batch), done
        )

    def _append_sync(self, storage: StorageMetadata, path: str, batch: Sequence[SessionEvent]) -> None:
        """The worker-thread half of :meth:`append_batch`: check the seq, encode, one durable write."""
        found = self._next_seq_sync(path, storage.meta.id)
        if found is None:
            self._core._next_seqs.forget(path)
            self._upgrade_sync(storage, path, batch, None)
            return
        next_seq, st = found
        check_contiguous(storage.meta.id, next_seq, batch)
        data = self._core._encode_batch(batch, self._core._seal_for(path, st))
        self._core._next_seqs.forget(path)
        appender = self._core._appenders.get(path)
        if appender is None:
            append_durable(path, data)
        else:
            appender.append(path, st, data)
        self._core._next_seqs.remember(path, (st.st_dev, st.st_ino, st.st_size + len(data)), next_seq + len(batch))

    async def commit_repair(
        self, storage: StorageMetadata, torn_marker: object | None, closers: Sequence[SessionEvent]
    ) -> None:
        if torn_marker is not None and not isinstance(torn_marker, TornTail):
            raise TypeError(f"torn_marker must come from this backend's load_stored, got {type(torn_marker).__name__}")
        path = self._core._path_for(storage.meta)
        marker = torn_marker
        batch = [*(marker.recovered_events if marker is not None else ()), *closers]

        def work() -> None:
            self._core._next_seqs.forget(path)
            if not self._core._is_declared_file(path):
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
                append_durable(path, self._core._encode_batch(batch, self._core._seal_for(path)))

        await self._core._write(storage.meta, "repairing the session log", work)

    async def rewrite(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        path = self._core._path_for(storage.meta)
        batch = list(events)

        def work() -> None:
            data, _seal = self._core._encode_log(storage, batch)
            try:
                os.lstat(path)
            except FileNotFoundError:
                raise SessionNotFoundError(storage.meta.id) from None
            self._core._next_seqs.forget(path)
            replace_durable(path, data)
            self._core._declared.add(path)

        await self._core._write(storage.meta, "rewriting the session log", work)

    # --------------------------------------------------------------------------------------------------------
    # the operator's explicit step for a damaged final batch

    def _damaged_tail_sync(self, session_id: str) -> DamagedTail | None:
        path = self._core._find(session_id)
        if path is None:
            raise SessionNotFoundError(session_id)
        data, _revision = stable_read(path)
        return find_damaged_tail(data, self._core.compression, path, self._core.max_batch_bytes, self._core.encryption)

    async def find_damaged_tail(self, session_id: str) -> DamagedTail | None:
        return await self._core._run(lambda: self._damaged_tail_sync(session_id), "reading the session log")

    async def discard_damaged_tail(self, session_id: str, tail: DamagedTail) -> None:

        def work() -> None:
            # Under the session's writer lease: refused (SessionLockedError) while any writer holds the session.
            lease = acquire_lease(self._core.root, os.path.dirname(tail.path), session_id)
            self._core._activity.announce(tail.path, lease.inode)
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
                self._core._activity.retire(tail.path)

        await self._core._write_plain(session_id, "discarding the damaged final batch", work)

    # --------------------------------------------------------------------------------------------------------
    # lifecycle (the work lives in _lifecycle)

    @property
    def cursor_scope(self) -> str:
        return f"jsonl:{self._core.compression}:{os.path.realpath(self._core.root)}"

    async def list_page(self, query: ListQuery) -> builtins.list[SessionListing]:

        def work() -> builtins.list[SessionListing]:
            self._core._ensure_preflight()
            core = self._core
            return list_rows(core.root, core.compression, query, core.max_batch_bytes, _checkpoint, core.encryption)

        return await self._core._run(work, "listing sessions")

    async def index_state(self) -> str:
        """The activity index's state, as ``verify`` reports it (a cache: never an error of the store)."""
        return await self._core._run(
            lambda: index_state(self._core.root, self._core.compression), "checking the activity index"
        )

    async def list_artifacts(self) -> builtins.list[StoredArtifact]:
        return await self._core._run(
            lambda: list_artifacts(self._core.root, self._core.compression, _checkpoint), "listing transcripts"
        )

    async def load_salvage(self, session_id: str) -> SalvagedLog | None:

        def work() -> SalvagedLog | None:
            self._core._ensure_preflight()
            path = find_transcript(self._core.root, session_id, self._core.compression, _checkpoint)
            if path is None:
                return None
            try:
                data, _revision = stable_read(path)
            except FileNotFoundError:
                return None
            if is_declared(data[:64], self._core.compression):
                salvaged = salvage_declared(
                    data, self._core.compression, path, self._core.max_batch_bytes, self._core.encryption
                )
            else:
                salvaged = (salvage_zstd if self._core.compression == "zstd" else salvage_raw)(data, path)
            check_identity(self._core.root, self._core.compression, path, salvaged.meta, session_id)
            return salvaged

        return await self._core._run(work, "salvaging the session log")

    async def delete(self, session_id: str, expected_revision: str | None = None) -> None:

        def work() -> None:
            self._core._ensure_preflight()
            delete_transcript(self._core.root, self._core.compression, session_id, expected_revision, _checkpoint)

        await self._core._write_plain(session_id, "deleting the session log", work)

    async def compact(self, storage: StorageMetadata, events: Sequence[SessionEvent], expected_revision: str) -> None:
        path = self._core._path_for(storage.meta)
        batch = list(events)

        def work() -> None:
            # Encoded before anything is touched: an encoding error leaves no trace.
            data, _seal = self._core._encode_log(storage, batch)
            compact_transcript(path, storage.meta.id, data, expected_revision)
            self._core._declared.add(path)

        await self._core._write(storage.meta, "compacting the session log", work)

    async def writer_lease_holder(self, meta: SessionHeader) -> str | None:
        session_dir = os.path.dirname(self._core._path_for(meta))
        return await self._core._run(lambda: probe_holder(session_dir), "reading the writer lease")

    async def acquire_writer_lease(self, meta: SessionHeader) -> JsonlWriterLease:
        path = self._core._path_for(meta)
        session_dir = os.path.dirname(path)

        def take() -> JsonlWriterLease:
            lease = acquire_lease(self._core.root, session_dir, meta.id)
            self._core._activity.announce(path, lease.inode)  # before any write under it; retired on release
            return lease

        lease = await self._core._write_plain(meta.id, "taking the writer lease", take)
        # While the lease is held, appends reuse one descriptor; it is closed when the lease is released.
        appender = HeldAppender()
        self._core._appenders[path] = appender
        self._core._leases[meta.id] = lease
        lease.on_release(_Forget(self._core, path, meta.id, appender, lease))
        return lease

    async def aclose(self) -> None:
        # The writer's threads end once their queued steps are done (a later step starts one again).
        await self._core._writer.aclose()
        for appender in list(self._core._appenders.values()):
            appender.close()
        self._core._appenders.clear()
        self._core._activity.retire_all()


class _Forget:
    """A writer lease's release callback: close its held appender and drop what the core keeps for it.

    One tracked object for the lease's whole life (a closure over five names would be six: at 1,000 live sessions
    they sit in the oldest generation, and every full collection traverses them).
    """

    __slots__ = ("appender", "core", "lease", "path", "session_id")

    def __init__(self, core: JsonlCore, path: str, session_id: str, appender: HeldAppender, lease: JsonlWriterLease):
        self.core = core
        self.path = path
        self.session_id = session_id
        self.appender = appender
        self.lease = lease

    def __call__(self) -> None:
        core = self.core
        self.appender.close()
        if core._appenders.get(self.path) is self.appender:
            del core._appenders[self.path]
        if core._leases.get(self.session_id) is self.lease:
            del core._leases[self.session_id]
        core._activity.retire(self.path)
