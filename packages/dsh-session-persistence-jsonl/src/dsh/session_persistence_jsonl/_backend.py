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
from collections.abc import Callable, Sequence
from typing import ClassVar, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from dsh.session_persistence.backend import (
    ListQuery,
    RawArtifact,
    SalvagedLog,
    SessionAlreadyExistsError,
    SessionEvent,
    SessionHeader,
    SessionListing,
    SessionLocation,
    SessionNotFoundError,
    SessionSnapshot,
    StorageMetadata,
    StoredArtifact,
    StoredPrefix,
    StoredSuffix,
    encode_storage_lines,
)

from ._discovery import check_identity, check_target_dir, find_transcript, list_transcripts, preflight
from ._frames import FrameError, compress_frame, decode_frame, scan_frames
from ._fs import (
    append_durable,
    ensure_dir_chain,
    is_file,
    publish_exclusive,
    replace_durable,
    revision_of,
    stable_read,
    truncate_durable,
)
from ._layout import Compression, encode_segment, project_dir_name, transcript_path
from ._lease import JsonlWriterLease, acquire_lease
from ._lifecycle import compact_transcript, delete_transcript, list_artifacts, list_rows
from ._records import NotAHeaderError, corrupt, encode_header_line, parse_header_line
from ._salvage import salvage_raw, salvage_zstd
from ._scan import DecodedLog, TornTail, decode_raw_log, decode_zstd_log

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
    """

    NAME: ClassVar[str] = "jsonl"
    supports_raw_artifacts: ClassVar[bool] = True

    def __init__(
        self, root: str | os.PathLike[str], compression: Compression = "zstd", pack_chunks: bool = True
    ) -> None:
        if compression not in ("zstd", "none"):
            raise ValueError(f'compression must be "zstd" or "none", got {compression!r}')
        root_text = os.fspath(root)
        if not isinstance(root_text, str) or not root_text:
            raise ValueError("JsonlBackend root must be a non-empty path string")
        # abspath, not resolve(): symlinks must stay as given so path strings compare as built (spec §1.1).
        self.root = os.path.abspath(root_text)
        self.compression: Compression = compression
        self.pack_chunks = bool(pack_chunks)
        self._preflight_done = False
        # Probe by listing: a missing root is fine (created lazily); a file or an unreadable root is not.
        try:
            with os.scandir(self.root):
                pass
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return f"JsonlBackend(root={self.root!r}, compression={self.compression!r}, pack_chunks={self.pack_chunks})"

    # --------------------------------------------------------------------------------------------------------
    # helpers

    @property
    def name(self) -> str:
        """Label used in log lines and teardown errors."""
        return self.NAME

    async def _run(self, func: Callable[[], _T]) -> _T:
        return await anyio.to_thread.run_sync(func)

    async def _run_shielded(self, func: Callable[[], _T]) -> _T:
        with anyio.CancelScope(shield=True):
            result = await anyio.to_thread.run_sync(func)
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
        decode = decode_zstd_log if self.compression == "zstd" else decode_raw_log
        return decode(data, path, _checkpoint)

    def _read_log(self, session_id: str) -> tuple[DecodedLog, str] | None:
        self._ensure_preflight()
        path = find_transcript(self.root, session_id, self.compression, _checkpoint)
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
        if self.compression == "zstd" and plaintext:
            return compress_frame(plaintext)
        return plaintext

    def _encode_header(self, storage: StorageMetadata) -> bytes:
        line = encode_header_line(storage)
        return compress_frame(line) if self.compression == "zstd" else line

    # --------------------------------------------------------------------------------------------------------
    # pure

    def locate(self, meta: SessionHeader) -> SessionLocation:
        """Where this session's transcript lives (or would live). No I/O: works before the root exists."""
        return SessionLocation(kind="jsonl", path=self._path_for(meta))

    # --------------------------------------------------------------------------------------------------------
    # reads

    async def load_stored(self, session_id: str) -> StoredPrefix | None:
        """The longest valid contiguous prefix; a torn tail yields a :class:`TornTail` marker; damage raises."""
        result = await self._run(lambda: self._read_log(session_id))
        if result is None:
            return None
        log, revision = result
        return StoredPrefix(
            meta=log.header,
            inherited_event_count=log.inherited_event_count,
            events=log.events,
            revision=revision,
            torn_marker=log.torn,
        )

    async def load_stored_from(self, session_id: str, from_seq: int) -> StoredSuffix | None:
        """Events with ``seq >= from_seq`` (reads the whole file and slices; never mutates, no marker)."""
        if from_seq < 0:
            raise ValueError(f"from_seq must be a non-negative integer, got {from_seq}")
        result = await self._run(lambda: self._read_log(session_id))
        if result is None:
            return None
        log, _revision = result
        return StoredSuffix(log.header, log.inherited_event_count, log.events[from_seq:])

    async def read_stored_revision(self, session_id: str) -> str | None:
        """The transcript's current stat revision, ``None`` if absent (also when it vanishes after lookup)."""

        def work() -> str | None:
            self._ensure_preflight()
            path = find_transcript(self.root, session_id, self.compression, _checkpoint)
            if path is None:
                return None
            try:
                return revision_of(os.stat(path))
            except FileNotFoundError:
                return None

        return await self._run(work)

    async def read_raw(self, session_id: str) -> RawArtifact | None:
        """The stored JSONL text (decoded from zstd), torn tail omitted; ``None`` if absent. Never mutates."""
        return await self._run(lambda: self._read_raw_sync(session_id))

    def _read_raw_sync(self, session_id: str) -> RawArtifact | None:
        self._ensure_preflight()
        path = find_transcript(self.root, session_id, self.compression, _checkpoint)
        if path is None:
            return None
        try:
            data, _revision = stable_read(path)
        except FileNotFoundError:
            return None
        if self.compression == "zstd":
            try:
                scan = scan_frames(data)
                if not scan.frames:
                    raise corrupt("corrupt Zstandard session log: empty or header-less Zstandard session log", path)
                parts = []
                for start, end in scan.frames:
                    _checkpoint()
                    parts.append(decode_frame(memoryview(data)[start:end], start))
            except FrameError as exc:
                raise corrupt(str(exc), path) from exc
            plaintext = b"".join(parts)
        else:
            # Symmetric with zstd: the torn fragment after the last LF is not part of the stored text.
            plaintext = data[: data.rfind(b"\n") + 1]
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

    async def list(self) -> list[SessionHeader]:
        """Headers of every materialized session (header line / frame 0 only), sorted by path."""

        def work() -> builtins.list[SessionHeader]:
            self._ensure_preflight()
            return [entry.header for entry in list_transcripts(self.root, self.compression, _checkpoint)]

        return await self._run(work)

    async def list_snapshots(self) -> builtins.list[SessionSnapshot]:
        """Headers with stat revisions; an artifact deleted between discovery and stat is omitted."""

        def work() -> builtins.list[SessionSnapshot]:
            self._ensure_preflight()
            out: builtins.list[SessionSnapshot] = []
            for entry in list_transcripts(self.root, self.compression, _checkpoint):
                _checkpoint()
                try:
                    st = os.stat(entry.path)
                except FileNotFoundError:
                    continue
                out.append(SessionSnapshot(entry.header, revision_of(st)))
            return out

        return await self._run(work)

    # --------------------------------------------------------------------------------------------------------
    # writes

    def _materialize_sync(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        header = storage.meta
        # Encode everything before touching the disk: an encoding error must leave no trace.
        data = self._encode_header(storage) + self._encode_batch(events)
        self._ensure_preflight()
        project = project_dir_name(_cwd_of(header))
        segment = encode_segment(header.id)
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

    async def materialize_header(self, storage: StorageMetadata) -> None:
        """Durably create a header-only transcript; fails if one already exists (never clobbers)."""
        await self._run_shielded(lambda: self._materialize_sync(storage, ()))

    async def append_batch(
        self, storage: StorageMetadata, events: Sequence[SessionEvent], is_materialized: bool
    ) -> None:
        """Durably append one batch (one zstd frame). The first batch publishes header + batch atomically.

        An empty batch is a no-op (it never materializes). A failed append is rolled back to the prior length.
        """
        if not events:
            return
        batch = list(events)
        if not is_materialized:
            await self._run_shielded(lambda: self._materialize_sync(storage, batch))
            return
        path = self._path_for(storage.meta)

        def work() -> None:
            append_durable(path, self._encode_batch(batch))

        await self._run_shielded(work)

    async def commit_repair(
        self, storage: StorageMetadata, torn_marker: object | None, closers: Sequence[SessionEvent]
    ) -> None:
        """Cut the torn tail (if any), then append its recovered events plus ``closers`` as one batch.

        Two durable steps, not atomic: a crash between them loses only never-acknowledged torn data, and the
        next load repairs again.
        """
        if torn_marker is not None and not isinstance(torn_marker, TornTail):
            raise TypeError(f"torn_marker must come from this backend's load_stored, got {type(torn_marker).__name__}")
        path = self._path_for(storage.meta)
        batch: list[SessionEvent] = []
        if torn_marker is not None:
            marker = torn_marker
            await self._run_shielded(lambda: truncate_durable(path, marker.truncate_to, marker.expected_size))
            batch.extend(marker.recovered_events)
        batch.extend(closers)
        if batch:

            def work() -> None:
                append_durable(path, self._encode_batch(batch))

            await self._run_shielded(work)

    async def rewrite(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> None:
        """Atomically replace the log with ``events`` (a contiguous prefix, possibly empty); header kept."""
        path = self._path_for(storage.meta)
        batch = list(events)

        def work() -> None:
            data = self._encode_header(storage) + self._encode_batch(batch)
            try:
                os.stat(path)
            except FileNotFoundError:
                raise SessionNotFoundError(storage.meta.id) from None
            replace_durable(path, data)

        await self._run_shielded(work)

    # --------------------------------------------------------------------------------------------------------
    # lifecycle (the work lives in _lifecycle)

    @property
    def cursor_scope(self) -> str:
        """Listing cursors belong to this root (and encoding); a cursor from another root is refused."""
        return f"jsonl:{self.compression}:{os.path.realpath(self.root)}"

    async def list_page(self, query: ListQuery) -> builtins.list[SessionListing]:
        """A page by transcript modification time ("recent") or header creation time; see ``_lifecycle``.

        Read-only, so it skips the root preflight (a walk that stats every session again): transcripts of the
        other encoding are simply not this backend's and are not listed; loads and ``verify`` refuse them.
        """

        def work() -> builtins.list[SessionListing]:
            return list_rows(self.root, self.compression, query, _checkpoint)

        return await self._run(work)

    async def list_artifacts(self) -> builtins.list[StoredArtifact]:
        """Every transcript file by name, readable or not (``verify`` reports the ones ``list`` leaves out)."""
        return await self._run(lambda: list_artifacts(self.root, self.compression, _checkpoint))

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
            salvaged = (salvage_zstd if self.compression == "zstd" else salvage_raw)(data, path)
            check_identity(self.root, self.compression, path, salvaged.meta, session_id)
            return salvaged

        return await self._run(work)

    async def delete(self, session_id: str, expected_revision: str | None = None) -> None:
        """Durably unlink the session's transcript (then its empty directory); unknown ids raise."""

        def work() -> None:
            self._ensure_preflight()
            delete_transcript(self.root, self.compression, session_id, expected_revision, _checkpoint)

        await self._run_shielded(work)

    async def compact(self, storage: StorageMetadata, events: Sequence[SessionEvent], expected_revision: str) -> None:
        """Atomically replace the transcript with the header and one batch (one zstd frame), keeping its mtime."""
        path = self._path_for(storage.meta)
        batch = list(events)

        def work() -> None:
            data = self._encode_header(storage) + self._encode_batch(batch)
            compact_transcript(path, storage.meta.id, data, expected_revision)

        await self._run_shielded(work)

    async def acquire_writer_lease(self, meta: SessionHeader) -> JsonlWriterLease:
        """Take the session's exclusive writer lease: a kernel lock on ``session.lock`` next to its transcript.

        Refused at once with ``SessionLockedError`` (naming the holder's pid and host) while another process, or
        another backend instance in this one, holds it; the kernel releases it when its holder dies.
        """
        session_dir = os.path.dirname(self._path_for(meta))
        return await self._run_shielded(lambda: acquire_lease(self.root, session_dir, meta.id))

    async def aclose(self) -> None:
        """Nothing to release: no descriptor outlives a primitive call (writer leases are released by their
        holder, the coordinator)."""


def _exists_error(message: str, path: str) -> SessionLogExistsError:
    exc = SessionLogExistsError(errno.EEXIST, message)
    exc.filename = path
    return exc
