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


class JsonlReads:
    """The read side of ``JsonlBackend`` (never writes), over its :class:`JsonlCore`."""

    def __init__(self, core: JsonlCore) -> None:
        self._core = core

    # --------------------------------------------------------------------------------------------------------
    # reads

    async def load_stored(self, session_id: str) -> StoredPrefix | None:
        result = await self._core._run(lambda: self._core._read_log(session_id), "reading the session log")
        if result is None:
            return None
        log, revision = result
        if log.torn is None:
            dev, ino, size = (int(part) for part in revision.split(":")[:3])
            self._core._next_seqs.remember(self._core._path_for(log.header), (dev, ino, size), len(log.events))
        return StoredPrefix(
            meta=log.header,
            inherited_event_count=log.inherited_event_count,
            events=log.events,
            revision=revision,
            torn_marker=log.torn,
        )

    def _read_suffix(self, session_id: str, from_seq: int) -> StoredSuffix | None:
        self._core._settle_unsynced(session_id)
        path = self._core._find(session_id)
        if path is None:
            return None
        while True:
            try:
                fd = open_read(path)
            except FileNotFoundError:
                return None
            try:
                st = os.fstat(fd)
                if not is_declared(os.pread(fd, 64, 0), self._core.compression):
                    break  # v0: no declarations to walk
                log = walk_declared(
                    FdSource(fd, st.st_size),
                    self._core.compression,
                    path,
                    self._core.max_batch_bytes,
                    from_seq=from_seq,
                    checkpoint=_checkpoint,
                    keys=self._core.encryption,
                )
                unchanged = revision_of(os.fstat(fd)) == revision_of(st)
            finally:
                os.close(fd)
            if unchanged:
                check_identity(self._core.root, self._core.compression, path, log.header, session_id)
                events = [e for e in log.events if e.seq >= from_seq]
                return StoredSuffix(log.header, log.inherited_event_count, events)
        result = self._core._read_log(session_id)
        if result is None:
            return None
        full, _revision = result
        return StoredSuffix(full.header, full.inherited_event_count, full.events[from_seq:])

    async def load_stored_from(self, session_id: str, from_seq: int) -> StoredSuffix | None:
        if from_seq < 0:
            raise ValueError(f"from_seq must be a non-negative integer, got {from_seq}")
        return await self._core._run(lambda: self._read_suffix(session_id, from_seq), "reading the session log")

    async def iter_stored(self, session_id: str, from_seq: int) -> AsyncIterator[StoredSuffix]:
        if from_seq < 0:
            raise ValueError(f"from_seq must be a non-negative integer, got {from_seq}")

        def start() -> DeclaredStream | StoredSuffix:
            path = self._core._find(session_id)
            if path is None:
                raise SessionNotFoundError(session_id)
            try:
                stream = open_stream(
                    path,
                    self._core.compression,
                    self._core.max_batch_bytes,
                    from_seq,
                    _checkpoint,
                    self._core.encryption,
                )
            except FileNotFoundError:
                raise SessionNotFoundError(session_id) from None
            if stream is None:
                suffix = self._read_suffix(session_id, from_seq)
                if suffix is None:
                    raise SessionNotFoundError(session_id)
                return suffix
            try:
                check_identity(self._core.root, self._core.compression, path, stream.header, session_id)
            except BaseException:
                stream.close()
                raise
            return stream

        opened = await self._core._run(start, "reading the session log")
        if isinstance(opened, StoredSuffix):
            yield opened
            return
        stream = opened
        try:
            meta, cut = stream.header, stream.inherited_event_count
            yield StoredSuffix(meta, cut, [])
            while (run := await self._core._run(stream.next_run, "reading the session log")) is not None:
                yield StoredSuffix(meta, cut, run)
        finally:
            stream.close()

    async def read_stored_revision(self, session_id: str) -> str | None:

        def work() -> str | None:
            path = self._core._find(session_id)
            if path is None:
                return None
            try:
                return revision_of(os.lstat(path))
            except FileNotFoundError:
                return None

        return await self._core._run(work, "reading the session revision")

    async def read_raw(self, session_id: str) -> RawArtifact | None:
        return await self._core._run(lambda: self._read_raw_sync(session_id), "reading the session log")

    def _plaintext(self, data: bytes, path: str) -> bytes:
        if is_declared(data[:64], self._core.compression):
            parts: list[bytes] = []
            walk_declared(
                BufferSource(data),
                self._core.compression,
                path,
                self._core.max_batch_bytes,
                plaintexts=parts,
                checkpoint=_checkpoint,
                keys=self._core.encryption,
            )
            return b"".join(parts)
        if self._core.compression == "none":
            # Symmetric with zstd: the torn fragment after the last LF is not part of the stored text.
            return data[: data.rfind(b"\n") + 1]
        try:
            scan = scan_frames(data)
            if not scan.frames:
                raise corrupt("corrupt Zstandard session log: empty or header-less Zstandard session log", path)
            out = []
            for start, end in scan.frames:
                _checkpoint()
                out.append(decode_frame(memoryview(data)[start:end], start, cap=self._core.max_batch_bytes))
        except FrameError as exc:
            raise corrupt(str(exc), path) from exc
        return b"".join(out)

    def _read_raw_sync(self, session_id: str) -> RawArtifact | None:
        path = self._core._find(session_id)
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
        self._core._ensure_preflight()
        return list_transcripts(self._core.root, self._core.compression, self._core.max_batch_bytes, _checkpoint)

    async def list(self) -> builtins.list[SessionHeader]:
        return await self._core._run(lambda: [entry.header for entry in self._listing()[0]], "listing sessions")

    async def list_damaged(self) -> builtins.list[Damaged]:
        return await self._core._run(lambda: self._listing()[1], "listing sessions")

    async def list_snapshots(self) -> builtins.list[SessionSnapshot]:

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

        return await self._core._run(work, "listing sessions")
