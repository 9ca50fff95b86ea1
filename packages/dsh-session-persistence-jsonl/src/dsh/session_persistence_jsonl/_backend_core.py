"""The JSONL backend's base: construction, the runners (reads on worker threads, durable steps on the backend's
writer), paths and encoding (no primitives)."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from dsh.session_persistence.backend import (
    SessionAlreadyExistsError,
    SessionEvent,
    SessionHeader,
    SessionLocation,
    SessionPersistenceError,
    SessionStorageError,
    SessionWriteInDoubtError,
    StorageMetadata,
    encode_storage_lines,
)

from ._files.activity_journal import ActivityJournal
from ._files.discovery import check_identity, find_transcript, preflight
from ._files.fs import (
    UnsyncedBytes,
    UnsyncedError,
    UnsyncedName,
    open_read,
    read_head,
    stable_read,
)
from ._files.held_append import HeldAppender
from ._files.layout import transcript_path
from ._files.lease import JsonlWriterLease
from ._files.sealed_store import MARKER_NAME, mark_sealed, marker_exists
from ._files.sealed_store import refusal as sealed_store_refusal
from ._files.seq_guard import NextSeqCache
from ._format.bounded import DEFAULT_MAX_BATCH_BYTES
from ._format.frames import Compression
from ._format.records import corrupt, encode_header_line
from ._format.sealed import BatchSeal, check_cipher_available, seal_header_line
from ._format.upgrade import current_header
from ._format.v0 import DecodedLog, decode_raw_log, decode_zstd_log
from ._format.v1 import (
    DECLARED_FORMAT_VERSION,
    HEADER_CAP,
    BatchTooLargeError,
    BufferSource,
    FdSource,
    encode_declared_batch,
    encode_declared_header,
    is_declared,
    read_seal,
    walk_declared,
)
from ._format.v1_declarations import MAX_DECLARED_BYTES
from ._writer import BlockingWriter
from .encryption import KeyProvider

__all__ = ["JsonlCore", "SessionLogExistsError"]

_T = TypeVar("_T")
RAW_FILENAME = "session.jsonl"
#: Writer threads per backend at most: one session's steps run in order, different sessions' syncs overlap, and a
#: stalled step holds its own session and one thread only.
WRITER_LANES = 16


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
    # RuntimeError: not an anyio worker thread but the backend's writer, whose steps are shielded (nothing to see).
    with contextlib.suppress(RuntimeError):
        anyio.from_thread.check_cancelled()


def _cwd_of(header: SessionHeader) -> str | None:
    return header.cwd if isinstance(header.cwd, str) else None


def _exists_error(message: str, path: str) -> SessionLogExistsError:
    exc = SessionLogExistsError(errno.EEXIST, message)
    exc.filename = path
    return exc


class JsonlCore:
    """What every JSONL primitive builds on (``JsonlBackend`` documents the parameters)."""

    NAME: ClassVar[str] = "jsonl"

    def __init__(
        self,
        root: str | os.PathLike[str],
        compression: Compression = "zstd",
        pack_chunks: bool = True,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        encryption: KeyProvider | None = None,
        allow_plaintext: bool = False,
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
        if encryption is not None:
            if not isinstance(encryption, KeyProvider):
                raise TypeError(f"encryption must be a KeyProvider, got {type(encryption).__name__}")
            check_cipher_available()
        self.encryption = encryption
        if type(allow_plaintext) is not bool:
            raise TypeError(f"allow_plaintext must be a bool, got {type(allow_plaintext).__name__}")
        self.allow_plaintext = allow_plaintext
        # Whether the root is known to carry the sealed-store marker (it is never taken away by this package).
        self._store_sealed = False
        self._marker = os.path.join(self.root, MARKER_NAME)  # asked before every write of session data
        # Transcript path -> ((dev, ino), its seal): a replace (compact, rewrite) makes a new inode and a new header.
        self._seals: dict[str, tuple[tuple[int, int], BatchSeal | None]] = {}
        self._preflight_done = False
        # Transcripts this instance knows to be declared (v1): written, upgraded or read as such.
        self._declared: set[str] = set()
        # The next seq of each transcript as this instance last saw it, so an append at a wrong seq is refused.
        self._next_seqs = NextSeqCache()
        # Session id -> a write of it whose sync failed and was not made good yet: until it settles, the stored
        # state (the page cache) is no evidence, so every read or write of the session settles it first.
        self._unsynced: dict[str, UnsyncedBytes | UnsyncedName] = {}
        # Transcript path -> its kept append descriptor, while this instance holds that session's writer lease.
        self._appenders: dict[str, HeldAppender] = {}
        # Every durable step runs here, keyed by session id: one session's steps in order, many share a wake.
        self._writer = BlockingWriter(WRITER_LANES, name="dsh-jsonl-writer")
        # Announces each session to the activity index's journal before this instance first writes it.
        self._activity = ActivityJournal(self.root)
        # Session id -> the writer lease this instance holds for it (every write under it keeps its lock file).
        self._leases: dict[str, JsonlWriterLease] = {}
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

    async def _write(self, header: SessionHeader, action: str, func: Callable[..., _T], *args: Any) -> _T:
        """Run the durable step ``func(*args)`` of session ``header`` on the backend's writer, shielded: it runs to
        its end (a cancelled caller sees its cancellation afterwards); the session is announced to the activity
        index first, a write of the session whose sync failed is made good first, and one this step leaves
        unsynced is remembered (see :meth:`_settle_unsynced`)."""
        session_id = header.id
        path = self._path_for(header)
        return await self._write_plain(session_id, action, self._durable_step, session_id, path, func, args)

    async def _write_plain(self, session_id: str, action: str, func: Callable[..., _T], *args: Any) -> _T:
        """:meth:`_write` without the unsynced bookkeeping (steps that store no session data: lease, delete)."""
        try:
            return await self._writer.run(session_id, func, *args)
        except SessionPersistenceError:
            raise  # some are OSErrors too (e.g. the log already exists): already typed
        except (OSError, MemoryError) as exc:
            raise _storage_error(action, exc) from exc

    def _submit_write(
        self,
        header: SessionHeader,
        path: str,
        action: str,
        func: Callable[..., object],
        args: tuple[Any, ...],
        done: Callable[[BaseException | None], None],
    ) -> None:
        """:meth:`_write` without an await: queue the same durable step on the writer and return; ``done(error)`` is
        called on the writer thread once it has run (``None``: durable; else the error :meth:`_write` raises).
        ``path``: the session's transcript (``_path_for(header)``, which the caller has computed already)."""
        session_id = header.id
        self._writer.submit(session_id, self._durable_step, (session_id, path, func, args), _Finished(action, done))

    def _durable_step(self, session_id: str, path: str, func: Callable[..., _T], args: tuple[Any, ...]) -> _T:
        """On the writer: :meth:`_write`'s step between the settlement of an earlier unsynced write and the
        record of one this step leaves; first the transcript at ``path`` is announced to the activity index and,
        under a held lease, its lock file is checked (the one place every write passes, whichever thread runs
        it)."""
        self._guard_sealed_store(session_id)
        self._activity.announce(path)  # before any write, so a listing's index never misses this session
        lease = self._leases.get(session_id)
        if lease is not None:
            lease.keep()  # a lock file deleted under the lease is put back before anything is written
        if self._unsynced:
            self._settle_unsynced(session_id)
        try:
            return func(*args)
        except UnsyncedError as exc:
            self._unsynced[session_id] = exc.pending
            raise

    def _guard_sealed_store(self, session_id: str) -> None:
        """Before a write of session data: a keyless backend refuses a sealed store (unless it opted out); a keyed
        one marks the store sealed first (a missing root is marked by the materialize that creates it)."""
        if self.encryption is None:
            if not self.allow_plaintext and (self._store_sealed or marker_exists(self._marker)):
                self._store_sealed = True
                raise sealed_store_refusal(self.root, session_id)
        elif not self._store_sealed and os.path.isdir(self.root):
            self._mark_sealed()

    def _mark_sealed(self) -> None:
        if self.encryption is not None and not self._store_sealed:
            mark_sealed(self.root)
            self._store_sealed = True

    def _settle_unsynced(self, session_id: str) -> None:
        """Make good a write of ``session_id`` whose sync failed (write its bytes again and sync, or sync its
        directory again), or raise :class:`SessionWriteInDoubtError`: a read-back must never acknowledge it."""
        pending = self._unsynced.get(session_id)
        if pending is None:
            return
        try:
            pending.settle()
        except OSError as exc:
            where = pending.path if isinstance(pending, UnsyncedBytes) else pending.directory
            raise SessionWriteInDoubtError(
                f'session "{session_id}": a write whose sync failed is still not durable, and syncing it again '
                f"failed ({exc.strerror or exc}); nothing it stored is acknowledged until a sync succeeds",
                errno=exc.errno,
                path=where,
            ) from exc
        self._unsynced.pop(session_id, None)

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
                BufferSource(data),
                self.compression,
                path,
                self.max_batch_bytes,
                checkpoint=_checkpoint,
                keys=self.encryption,
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
        self._settle_unsynced(session_id)
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

    def _encode_batch(self, events: Sequence[SessionEvent], seal: BatchSeal | None) -> bytes:
        plaintext = encode_storage_lines(events, pack_chunks=self.pack_chunks)
        pair = encode_declared_batch(self.compression, events[0].seq, len(events), plaintext, seal)
        if len(plaintext) > self.max_batch_bytes or len(pair) - len(plaintext) > self.max_batch_bytes:
            raise BatchTooLargeError(
                f"a batch of {len(events)} event(s) from seq {events[0].seq} needs {len(plaintext)} bytes, above "
                f"max_batch_bytes={self.max_batch_bytes}; nothing was written"
            )
        return pair

    def _encode_log(self, storage: StorageMetadata, events: Sequence[SessionEvent]) -> tuple[bytes, BatchSeal | None]:
        """A whole new transcript (header, then ``events`` as one batch, if any) and its seal (``None``: plaintext).

        With a key provider every new header is sealed, so every batch written under it is too.
        """
        line = encode_header_line(current_header(storage))
        seal = None
        if self.encryption is not None:
            line, sealed = seal_header_line(line)
            seal = BatchSeal(sealed, self.encryption, self.compression, self._path_for(storage.meta))
        if len(line) > min(HEADER_CAP, self.max_batch_bytes):
            raise BatchTooLargeError(f"the session header needs {len(line)} bytes, above {HEADER_CAP}")
        data = encode_declared_header(self.compression, line)
        return data + (self._encode_batch(events, seal) if events else b""), seal

    def _remember_seal(self, path: str, st: os.stat_result, seal: BatchSeal | None) -> None:
        self._seals[path] = ((st.st_dev, st.st_ino), seal)

    def _seal_for(self, path: str, st: os.stat_result | None = None) -> BatchSeal | None:
        """The seal of the declared transcript at ``path`` (``None``: plaintext), from its header pair.

        ``st``: the path's stat the caller has just taken; the seal remembered for that very file is used without
        opening it (an append takes that stat anyway, for its seq check).
        """
        if st is not None:
            known = self._seals.get(path)
            if known is not None and known[0] == (st.st_dev, st.st_ino):
                return known[1]
        fd = open_read(path)
        try:
            st = os.fstat(fd)
            known = self._seals.get(path)
            if known is not None and known[0] == (st.st_dev, st.st_ino):
                return known[1]
            seal = read_seal(FdSource(fd, st.st_size), self.compression, path, self.max_batch_bytes, self.encryption)
        finally:
            os.close(fd)
        self._seals[path] = ((st.st_dev, st.st_ino), seal)
        return seal

    def _is_declared_file(self, path: str) -> bool:
        """Whether ``path`` is a v1 file now (read from its first bytes: neither the header this writer holds
        nor what this instance wrote earlier proves it, as a v0 log may have been restored over it)."""
        if is_declared(read_head(path, 64), self.compression):
            self._declared.add(path)
            return True
        self._declared.discard(path)
        return False

    # --------------------------------------------------------------------------------------------------------
    # pure

    def locate(self, meta: SessionHeader) -> SessionLocation:
        """Where this session's transcript lives (or would live). No I/O: works before the root exists."""
        return SessionLocation(kind="jsonl", path=self._path_for(meta))


class _Finished:
    """:meth:`JsonlCore._submit_write`'s writer callback: the step's error typed as :meth:`JsonlCore._write` types it,
    then ``done``. One tracked object per write (a closure would be four: an in-flight write at 1,000 sessions
    outlives several young-generation collections)."""

    __slots__ = ("action", "done")

    def __init__(self, action: str, done: Callable[[BaseException | None], None]) -> None:
        self.action = action
        self.done = done

    def __call__(self, _result: object, error: BaseException | None) -> None:
        if isinstance(error, (OSError, MemoryError)) and not isinstance(error, SessionPersistenceError):
            converted = _storage_error(self.action, error)
            converted.__cause__ = error
            error = converted
        self.done(error)


def _storage_error(action: str, exc: OSError | MemoryError) -> SessionStorageError:
    """The one translation of a writer step's low-level failure into the storage error callers see."""
    if isinstance(exc, MemoryError):
        return SessionStorageError(f"{action} failed: out of memory")
    return SessionStorageError.from_os_error(action, exc)
