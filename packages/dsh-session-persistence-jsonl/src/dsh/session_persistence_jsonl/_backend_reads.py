"""The JSONL backend's read primitives: load, seek, stream, revision, raw artifact, listing."""

from __future__ import annotations

import builtins
import os
from collections.abc import AsyncIterator
from typing import TypeVar

from dsh.session_persistence.backend import (
    RawArtifact,
    SessionHeader,
    SessionNotFoundError,
    SessionSnapshot,
    StoredPrefix,
    StoredSuffix,
)

from ._backend_core import JsonlCore, _checkpoint
from ._files.discovery import Damaged, Listed, check_identity, list_transcripts
from ._files.fs import (
    open_read,
    revision_of,
    stable_read,
)
from ._files.stream import DeclaredStream, open_stream
from ._format.frames import FrameError, decode_frame, scan_frames
from ._format.records import NotAHeaderError, corrupt, parse_header_line
from ._format.v1 import (
    BufferSource,
    FdSource,
    is_declared,
    walk_declared,
)

__all__ = ["JsonlReads"]

_T = TypeVar("_T")
RAW_FILENAME = "session.jsonl"


class JsonlReads(JsonlCore):
    """The read side of ``JsonlBackend`` (never writes)."""

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
        self._settle_unsynced(session_id)
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
                    keys=self.encryption,
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
                stream = open_stream(
                    path, self.compression, self.max_batch_bytes, from_seq, _checkpoint, self.encryption
                )
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
                keys=self.encryption,
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
