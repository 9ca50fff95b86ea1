"""``JsonlBackend``: one append-only ``.jsonl.zstd`` (or ``.jsonl``) transcript per session (spec/jsonl.md).

Each primitive runs its blocking work in one worker thread (``anyio.to_thread.run_sync``), one durable step per
call; mutating primitives are shielded so cancellation can never interrupt a write half-way (a cancelled caller
waits for the step, then sees the cancellation). Reads call ``anyio.from_thread.check_cancelled`` between frames
and directory reads, so a cancelled ``load`` or ``list`` stops at the next boundary.
"""

from __future__ import annotations

import builtins
import errno
import functools
import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import ClassVar, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from dsh.session_persistence.backend import (
    ListQuery,
    RawArtifact,
    SalvagedLog,
    SeqMismatchError,
    SessionAlreadyExistsError,
    SessionEvent,
    SessionHeader,
    SessionListing,
    SessionLocation,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionSnapshot,
    SessionStorageError,
    StorageMetadata,
    StoredArtifact,
    StoredPrefix,
    StoredSuffix,
    encode_storage_lines,
)

from ._batches import (
    DECLARED_FORMAT_VERSION,
    HEADER_CAP,
    BatchTooLargeError,
    BufferSource,
    FdSource,
    encode_declared_batch,
    encode_declared_header,
    is_declared,
    walk_declared,
)
from ._bounded import DEFAULT_MAX_BATCH_BYTES
from ._damage import DamagedTail, find_damaged_tail
from ._declarations import MAX_DECLARED_BYTES
from ._discovery import Damaged, Listed, check_identity, check_target_dir, find_transcript, list_transcripts, preflight
from ._frames import FrameError, decode_frame, scan_frames
from ._fs import (
    append_durable,
    ensure_dir_chain,
    is_file,
    open_read,
    publish_exclusive,
    read_head,
    replace_durable,
    revision_of,
    stable_read,
    truncate_durable,
)
from ._held_append import HeldAppender
from ._layout import Compression, project_dir_name, session_segment, transcript_path
from ._lease import JsonlWriterLease, acquire_lease
from ._lifecycle import compact_transcript, delete_transcript, list_artifacts, list_rows
from ._records import NotAHeaderError, corrupt, encode_header_line, parse_header_line
from ._salvage import salvage_declared, salvage_raw, salvage_zstd
from ._scan import DecodedLog, TornTail, decode_raw_log, decode_zstd_log
from ._seq_guard import NextSeqCache, check_continues
from ._stream import DeclaredStream, open_stream
from ._upgrade import current_header, declared_log

__all__ = ["JsonlBackend", "SessionLogExistsError"]

_T = TypeVar("_T")
RAW_FILENAME = "session.jsonl"


class SessionLogExistsError(SessionAlreadyExistsError, FileExistsError):
    """First materialization found a transcript already on disk (or lost a same-id publication race).

    Both a :class:`SessionAlreadyExistsError` and a ``FileExistsError`` (``errno.EEXIST``, ``filename`` = the
    transcript): the existing log is never overwritten.
    """

    def __str__(self) -> str:
        return self.strerror or super().__str__()


@functools.lru_cache(maxsize=1024)
def _transcript_path(root: str, cwd: str | None, session_id: str, compression: Compression) -> str:
    # Pure string work, but escaping the cwd and id costs tens of microseconds, and every append needs the path.
    return transcript_path(root, cwd, session_id, compression)


def _checkpoint() -> None:
    anyio.from_thread.check_cancelled()


def _cwd_of(header: SessionHeader) -> str | None:
    return header.cwd if isinstance(header.cwd, str) else None


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

    Every storage failure surfaces as :class:`SessionStorageError` (errno and path kept, the ``OSError``
    chained); a write whose outcome is unknown as :class:`SessionWriteInDoubtError`.
    """

    NAME: ClassVar[str] = "jsonl"
    supports_raw_artifacts: ClassVar[bool] = True

    def __init__(
        self,
        root: str | os.PathLike[str],
        compression: Compression = "zstd",
        pack_chunks: bool = True,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    ) -> None:
        if compression not in ("zstd", "none"):
            raise ValueError(f'compression must be "zstd" or "none", got {compression!r}')
        if type(max_batch_bytes) is not int or not 1024 <= max_batch_bytes <= MAX_DECLARED_BYTES:
            raise ValueError(f"max_batch_bytes must be an integer from 1024 to {MAX_DECLARED_BYTES}")
        root_text = os.fspath(root)
        if not isinstance(root_text, str) or not root_text:
            raise ValueError("JsonlBackend root must be a non-empty path string")
        # abspath, not resolve(): symlinks must stay as given so path strings compare as built (spec §1.1).
        self.root = os.path.abspath(root_text)
        self.compression: Compression = compression
        self.pack_chunks = bool(pack_chunks)
        self.max_batch_bytes = max_batch_bytes
        self._preflight_done = False
        # Transcripts this instance knows to be declared (v1): written, upgraded or read as such.
        self._declared: set[str] = set()
        # The next seq of each transcript as this instance last saw it, so an append at a wrong seq is refused.
        self._next_seqs = NextSeqCache()
        # Transcript path -> its kept append descriptor, while this instance holds that session's writer lease.
        self._appenders: dict[str, HeldAppender] = {}
        # Probe by listing: a missing root is fine (created lazily); a file or an unreadable root is not.
        try:
            with os.scandir(self.root):
                pass
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise SessionStorageError.from_os_error("opening the JSONL root", exc, self.root) from exc

    def __repr__(self) -> str:
        return f"JsonlBackend(root={self.root!r}, compression={self.compression!r}, pack_chunks={self.pack_chunks})"

    # --------------------------------------------------------------------------------------------------------
    # helpers

    @property
    def name(self) -> str:
        """Label used in log lines and teardown errors."""
        return self.NAME

    async def _run(self, func: Callable[[], _T], action: str) -> _T:
        try:
            return await anyio.to_thread.run_sync(func)
        except SessionPersistenceError:
            raise
        except OSError as exc:
            raise SessionStorageError.from_os_error(action, exc) from exc
        except MemoryError as exc:
            raise SessionStorageError(f"{action} failed: out of memory") from exc

    async def _run_shielded(self, func: Callable[[], _T], action: str) -> _T:
        with anyio.CancelScope(shield=True):
            result = await self._run(func, action)
        return result

    def _ensure_preflight(self) -> None:
        # Memoized on success only: a failed preflight is re-checked on the next call, so fixing the root
        # (removing the foreign artifact) does not require a new backend instance (spec §5 #88: port decision).
        if not self._preflight_done:
            preflight(self.root, self.compression, _checkpoint)
            self._preflight_done = True

    def _path_for(self, header: SessionHeader) -> str:
        return _transcript_path(self.root, _cwd_of(header), header.id, self.compression)

    def _decode(self, data: bytes, path: str) -> DecodedLog:
        """Either format: declared (v1) by its first bytes, else v0 (which must carry a v0 header)."""
        if is_declared(data[:64], self.compression):
            self._declared.add(path)
            return walk_declared(
                BufferSource(data), self.compression, path, self.max_batch_bytes, checkpoint=_checkpoint
            )
        if self.compression == "zstd":
            log = decode_zstd_log(data, path, _checkpoint, self.max_batch_bytes)
        else:
            log = decode_raw_log(data, path, _checkpoint)
        if log.header.version == DECLARED_FORMAT_VERSION:
            raise corrupt("corrupt session log: a v1 header in a log without batch declarations", path)
        return log

    def _find(self, session_id: str) -> str | None:
        self._ensure_preflight()
        return find_transcript(self.root, session_id, self.compression, _checkpoint)

    def _read_log(self, session_id: str) -> tuple[DecodedLog, str] | None:
        path = self._find(session_id)
        if path is None:
            return None
        try:
            data, revision = stable_read(path)
        except FileNotFoundError:
            return None
        _checkpoint()
        log = self._decode(data, path)
        check_identity(self.root, self.compression, path, log.header, session_id)
        return log, revision

    def _encode_batch(self, events: Sequence[SessionEvent]) -> bytes:
        plaintext = encode_storage_lines(events, pack_chunks=self.pack_chunks)
        pair = encode_declared_batch(self.compression, events[0].seq, len(events), plaintext)
        if len(plaintext) > self.max_batch_bytes or len(pair) - len(plaintext) > self.max_batch_bytes:
            raise BatchTooLargeError(
                f"a batch of {len(events)} event(s) from seq {events[0].seq} needs {len(plaintext)} bytes, above "
                f"max_batch_bytes={self.max_batch_bytes}; nothing was written"
            )
        return pair

    def _encode_header(self, storage: StorageMetadata) -> bytes:
        line = encode_header_line(current_header(storage))
        if len(line) > min(HEADER_CAP, self.max_batch_bytes):
            raise BatchTooLargeError(f"the session header needs {len(line)} bytes, above {HEADER_CAP}")
        return encode_declared_header(self.compression, line)

    def _is_declared_file(self, path: str, meta: SessionHeader) -> bool:
        """Whether appends can go straight to ``path`` (a v1 file) or must upgrade it first (a v0 file)."""
        if meta.version >= DECLARED_FORMAT_VERSION or path in self._declared:
            return True
        if is_declared(read_head(path, 64), self.compression):
            self._declared.add(path)
            return True
        return False

    # --------------------------------------------------------------------------------------------------------
    # pure

    def locate(self, meta: SessionHeader) -> SessionLocation:
        """Where this session's transcript lives (or would live). No I/O: works before the root exists."""
        return SessionLocation(kind="jsonl", path=self._path_for(meta))

    # --------------------------------------------------------------------------------------------------------
    # reads

    async def load_stored(self, session_id: str) -> StoredPrefix | None:
        """The longest valid contiguous prefix; a torn tail yields a :class:`TornTail` marker; damage raises."""
        result = await self._run(lambda: self._read_log(session_id), "reading the session log")
        if result is None:
            return None
        log, revision = result
        if log.torn is None:
            dev, ino, size = (int(part) for part in revision.split(":")[:3])
            self._next_seqs.remember(self._path_for(log.header), (dev, ino, size), len(log.events))
        return StoredPrefix(
            meta=log.header,
            inherited_event_count=log.inherited_event_count,
            events=log.events,
            revision=revision,
            torn_marker=log.torn,
        )

    def _read_suffix(self, session_id: str, from_seq: int) -> StoredSuffix | None:
        path = self._find(session_id)
        if path is None:
            return None
        while True:
            try:
                fd = open_read(path)
            except FileNotFoundError:
                return None
            try:
                st = os.fstat(fd)
                if not is_declared(os.pread(fd, 64, 0), self.compression):
                    break  # v0: no declarations to walk
                log = walk_declared(
                    FdSource(fd, st.st_size),
                    self.compression,
                    path,
                    self.max_batch_bytes,
                    from_seq=from_seq,
                    checkpoint=_checkpoint,
                )
                unchanged = revision_of(os.fstat(fd)) == revision_of(st)
            finally:
                os.close(fd)
            if unchanged:
                check_identity(self.root, self.compression, path, log.header, session_id)
                events = [e for e in log.events if e.seq >= from_seq]
                return StoredSuffix(log.header, log.inherited_event_count, events)
        result = self._read_log(session_id)
        if result is None:
            return None
        full, _revision = result
        return StoredSuffix(full.header, full.inherited_event_count, full.events[from_seq:])

    async def load_stored_from(self, session_id: str, from_seq: int) -> StoredSuffix | None:
        """Events with ``seq >= from_seq``: a v1 log is walked by its declarations, reading only those batches."""
        if from_seq < 0:
            raise ValueError(f"from_seq must be a non-negative integer, got {from_seq}")
        return await self._run(lambda: self._read_suffix(session_id, from_seq), "reading the session log")

    async def iter_stored(self, session_id: str, from_seq: int) -> AsyncIterator[StoredSuffix]:
        """Stream the events with ``seq >= from_seq``: a v1 log is walked by its declarations, one bounded run
        (about 4,096 events) per worker-thread call, reading only the batches from ``from_seq`` on; a v0 log is
        read whole (its frames declare nothing to seek by). The log is read as it was when the stream opened."""
        if from_seq < 0:
            raise ValueError(f"from_seq must be a non-negative integer, got {from_seq}")

        def start() -> DeclaredStream | StoredSuffix:
            path = self._find(session_id)
            if path is None:
                raise SessionNotFoundError(session_id)
            try:
                stream = open_stream(path, self.compression, self.max_batch_bytes, from_seq, _checkpoint)
            except FileNotFoundError:
                raise SessionNotFoundError(session_id) from None
            if stream is None:
                suffix = self._read_suffix(session_id, from_seq)
                if suffix is None:
                    raise SessionNotFoundError(session_id)
                return suffix
            try:
                check_identity(self.root, self.compression, path, stream.header, session_id)
            except BaseException:
                stream.close()
                raise
            return stream

        opened = await self._run(start, "reading the session log")
        if isinstance(opened, StoredSuffix):
            yield opened
            return
        stream = opened
        try:
            meta, cut = stream.header, stream.inherited_event_count
            yield StoredSuffix(meta, cut, [])
            while (run := await self._run(stream.next_run, "reading the session log")) is not None:
                yield StoredSuffix(meta, cut, run)
        finally:
            stream.close()

    async def read_stored_revision(self, session_id: str) -> str | None:
        """The transcript's current stat revision, ``None`` if absent (also when it vanishes after lookup)."""

        def work() -> str | None:
            path = self._find(session_id)
            if path is None:
                return None
            try:
                return revision_of(os.lstat(path))
            except FileNotFoundError:
                return None

        return await self._run(work, "reading the session revision")

    async def read_raw(self, session_id: str) -> RawArtifact | None:
        """The stored JSONL text (decoded, declarations left out), torn tail omitted; ``None`` if absent."""
        return await self._run(lambda: self._read_raw_sync(session_id), "reading the session log")

    def _plaintext(self, data: bytes, path: str) -> bytes:
        if is_declared(data[:64], self.compression):
            parts: list[bytes] = []
            walk_declared(
                BufferSource(data),
                self.compression,
                path,
                self.max_batch_bytes,
                plaintexts=parts,
                checkpoint=_checkpoint,
            )
            return b"".join(parts)
        if self.compression == "none":
            # Symmetric with zstd: the torn fragment after the last LF is not part of the stored text.
            return data[: data.rfind(b"\n") + 1]
        try:
            scan = scan_frames(data)
            if not scan.frames:
                raise corrupt("corrupt Zstandard session log: empty or header-less Zstandard session log", path)
            out = []
            for start, end in scan.frames:
                _checkpoint()
                out.append(decode_frame(memoryview(data)[start:end], start, cap=self.max_batch_bytes))
        except FrameError as exc:
            raise corrupt(str(exc), path) from exc
        return b"".join(out)

    def _read_raw_sync(self, session_id: str) -> RawArtifact | None:
        path = self._find(session_id)
        if path is None:
            return None
        try:
            data, _revision = stable_read(path)
        except FileNotFoundError:
            return None
        plaintext = self._plaintext(data, path)
        end = plaintext.find(b"\n")
        invalid = f'corrupt session log: invalid header line in "{path}"'
        if end < 0:
            raise corrupt(invalid)
        try:
            header, cut = parse_header_line(plaintext[:end], path)
        except NotAHeaderError as exc:
            raise corrupt(invalid) from exc
        if header.id != session_id:
            raise corrupt(invalid)
        return RawArtifact(header, cut, RAW_FILENAME, plaintext.decode("utf-8", "replace"))

    def _listing(self) -> tuple[builtins.list[Listed], builtins.list[Damaged]]:
        self._ensure_preflight()
        return list_transcripts(self.root, self.compression, self.max_batch_bytes, _checkpoint)

    async def list(self) -> builtins.list[SessionHeader]:
        """Headers of every listable session (header pair / line / frame 0 only), sorted by path.

        A session whose header is damaged or oversized is left out here and reported by :meth:`list_damaged`;
        it never fails the listing of the others.
        """
        return await self._run(lambda: [entry.header for entry in self._listing()[0]], "listing sessions")

    async def list_damaged(self) -> builtins.list[Damaged]:
        """Session directories whose header cannot be listed (damaged, oversized, not a header, a symlink)."""
        return await self._run(lambda: self._listing()[1], "listing sessions")

    async def list_snapshots(self) -> builtins.list[SessionSnapshot]:
        """Headers with stat revisions; an artifact deleted between discovery and stat is omitted."""

        def work() -> builtins.list[SessionSnapshot]:
            out: builtins.list[SessionSnapshot] = []
            for entry in self._listing()[0]:
                _checkpoint()
                try:
                    st = os.lstat(entry.path)
                except FileNotFoundError:
                    continue
                out.append(SessionSnapshot(entry.header, revision_of(st)))
            return out

        return await self._run(work, "listing sessions")

    # --------------------------------------------------------------------------------------------------------
    # writes

    def _materialize_sync(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        header = storage.meta
        check_continues(header.id, 0, events)
        # Encode everything before touching the disk: an encoding error must leave no trace.
        data = self._encode_header(storage) + (self._encode_batch(events) if events else b"")
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
        self._next_seqs.remember(path, os.stat(path), len(events))

    def _next_seq_sync(self, path: str, session_id: str) -> tuple[int, os.stat_result]:
        """The next seq of the transcript at ``path`` (remembered, or decoded once) and its current stat."""
        st = os.stat(path)
        known = self._next_seqs.lookup(path, st)
        if known is not None:
            return known, st
        data, _revision = stable_read(path)
        log = self._decode(data, path)
        if log.torn is not None:
            # Appending after a torn fragment would bury it mid-log; the coordinator repairs before appending.
            raise SessionPersistenceCorruptionError(f'session "{session_id}" has an unrepaired torn tail ("{path}")')
        return len(log.events), os.stat(path)

    async def materialize_header(self, storage: StorageMetadata) -> None:
        """Durably create a header-only transcript; fails if one already exists (never clobbers)."""
        await self._run_shielded(lambda: self._materialize_sync(storage, ()), "materializing the session log")

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
                append_durable(path, self._encode_batch(batch))
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
        if batch and batch[0].seq != len(committed):
            raise SeqMismatchError(
                f'append seq mismatch for "{storage.meta.id}": expected {len(committed)} at index 0, got {batch[0].seq}'
            )
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
            await self._run_shielded(lambda: self._materialize_sync(storage, batch), "materializing the session log")
            return
        path = self._path_for(storage.meta)

        def work() -> None:
            if self._is_declared_file(path, storage.meta):
                next_seq, st = self._next_seq_sync(path, storage.meta.id)
                check_continues(storage.meta.id, next_seq, batch)
                data = self._encode_batch(batch)
                self._next_seqs.forget(path)
                appender = self._appenders.get(path)
                if appender is None:
                    append_durable(path, data)
                else:
                    appender.append(path, st, data)
                self._next_seqs.remember(path, (st.st_dev, st.st_ino, st.st_size + len(data)), next_seq + len(batch))
            else:
                self._next_seqs.forget(path)
                self._upgrade_sync(storage, path, batch, None)

        await self._run_shielded(work, "appending to the session log")

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
            if not self._is_declared_file(path, storage.meta):
                self._upgrade_sync(storage, path, batch, marker)
                return
            if marker is not None:
                truncate_durable(path, marker.truncate_to, marker.expected_size)
            if batch:
                # Closers computed from a stale read must not land after another writer's batch.
                next_seq, _ = self._next_seq_sync(path, storage.meta.id)
                check_continues(storage.meta.id, next_seq, batch)
                append_durable(path, self._encode_batch(batch))

        await self._run_shielded(work, "repairing the session log")

    async def rewrite(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        """Atomically replace the log with ``events`` (a contiguous prefix, possibly empty); header kept."""
        path = self._path_for(storage.meta)
        batch = list(events)

        def work() -> None:
            data = self._encode_header(storage) + (self._encode_batch(batch) if batch else b"")
            try:
                os.lstat(path)
            except FileNotFoundError:
                raise SessionNotFoundError(storage.meta.id) from None
            self._next_seqs.forget(path)
            replace_durable(path, data)
            self._declared.add(path)

        await self._run_shielded(work, "rewriting the session log")

    # --------------------------------------------------------------------------------------------------------
    # the operator's explicit step for a damaged final batch

    def _damaged_tail_sync(self, session_id: str) -> DamagedTail | None:
        path = self._find(session_id)
        if path is None:
            raise SessionNotFoundError(session_id)
        data, _revision = stable_read(path)
        return find_damaged_tail(data, self.compression, path, self.max_batch_bytes)

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
        every other read; after it a page costs one ``stat`` per session and the page's headers.
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
                salvaged = salvage_declared(data, self.compression, path, self.max_batch_bytes)
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
            data = self._encode_header(storage) + (self._encode_batch(batch) if batch else b"")
            compact_transcript(path, storage.meta.id, data, expected_revision)
            self._declared.add(path)

        await self._run_shielded(work, "compacting the session log")

    async def acquire_writer_lease(self, meta: SessionHeader) -> JsonlWriterLease:
        """Take the session's exclusive writer lease: a kernel lock on ``session.lock`` next to its transcript.

        Refused at once with ``SessionLockedError`` (naming the holder's pid and host) while another process, or
        another backend instance in this one, holds it; the kernel releases it when its holder dies.
        """
        path = self._path_for(meta)
        session_dir = os.path.dirname(path)
        lease = await self._run_shielded(
            lambda: acquire_lease(self.root, session_dir, meta.id), "taking the writer lease"
        )
        # While the lease is held, appends reuse one descriptor; it is closed when the lease is released.
        appender = HeldAppender()
        self._appenders[path] = appender

        def forget() -> None:
            appender.close()
            if self._appenders.get(path) is appender:
                del self._appenders[path]

        lease.on_release(forget)
        return lease

    async def aclose(self) -> None:
        """Close any kept append descriptor (normally closed already: each goes with its writer lease, which its
        holder, the coordinator, releases)."""
        for appender in list(self._appenders.values()):
            appender.close()
        self._appenders.clear()


def _exists_error(message: str, path: str) -> SessionLogExistsError:
    exc = SessionLogExistsError(errno.EEXIST, message)
    exc.filename = path
    return exc
