"""Finding transcripts under a root: preflight, lookup by id, header-only listing, identity (spec §1.5-§1.6, §3.6-§3.7).

Blocking code for worker threads. Directory walks never follow symlinks (``is_dir(follow_symlinks=False)``),
so an aliased project directory is not listed twice. ``checkpoint`` is called between I/O calls so a
cancelled caller stops the walk at the next boundary (``anyio.from_thread.check_cancelled``).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

import zstandard
from dsh.session_persistence.backend import (
    SessionFormatUnsupportedError,
    SessionHeader,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
)

from .._format.bounded import decompress_frame_bounded
from .._format.frames import Compression, FrameError, scan_frames
from .._format.records import NotAHeaderError, corrupt, parse_header_line
from .._format.v1 import DECLARED_FORMAT_VERSION, HEADER_CAP, FdSource, is_declared, walk_declared
from .fs import is_file, open_read, real_dir
from .layout import (
    MAX_SEGMENT,
    RAW_SUFFIX,
    TRANSCRIPT_STEM,
    ZSTD_SUFFIX,
    decode_segment,
    session_segment,
    transcript_path,
)
from .layout import opposite_suffix as _opposite_suffix
from .layout import suffix_for as _suffix_for

__all__ = ["Damaged", "Listed", "check_identity", "find_transcript", "list_transcripts", "preflight"]

Checkpoint = Callable[[], None]
LIST_READ_CHUNK = 8192
_FLAT_SUFFIXES = (RAW_SUFFIX, ZSTD_SUFFIX)


def _noop() -> None:
    pass


@dataclass(frozen=True, slots=True)
class Listed:
    """One listed session: header, inherited cut and transcript path."""

    header: SessionHeader
    inherited_event_count: int
    path: str


@dataclass(frozen=True, slots=True)
class Damaged:
    """A session directory whose header cannot be listed: reported on its own, never failing the listing."""

    #: The session id decoded from the directory name, ``None`` when the name is hashed or not ours.
    session_id: str | None
    path: str
    message: str


def _flat_layout(path: str) -> SessionFormatUnsupportedError:
    return SessionFormatUnsupportedError(
        f'session artifact "{path}" uses the unsupported flat-file layout; use a separate root or move it into a '
        "project/session directory before loading"
    )


def _mismatch(path: str, compression: Compression) -> SessionFormatUnsupportedError:
    return SessionFormatUnsupportedError(
        f'session artifact "{path}" uses {_opposite_suffix(compression)}, but this backend is configured for '
        f'compression "{compression}"; use a separate root or select the matching compression mode'
    )


def _subdirs(path: str, *, missing_ok: bool) -> list[str]:
    """Real (non-symlink) subdirectories, sorted; flat-layout transcripts directly inside are fatal."""
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        if missing_ok:
            return []
        raise
    out: list[str] = []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            out.append(entry.path)
        elif entry.is_symlink():
            continue  # never followed: a symlinked project or session directory is not part of the layout
        elif not missing_ok and entry.name.endswith(_FLAT_SUFFIXES) and entry.is_file(follow_symlinks=False):
            raise _flat_layout(entry.path)
    out.sort()
    return out


def _project_dirs(root: str) -> list[str]:
    # Only ENOENT of the root itself means "no sessions"; ENOTDIR, EACCES... propagate.
    return _subdirs(root, missing_ok=True)


def _check_opposite(session_dir: str, compression: Compression) -> None:
    other = os.path.join(session_dir, TRANSCRIPT_STEM + _opposite_suffix(compression))
    if is_file(other):
        raise _mismatch(other, compression)


def preflight(root: str, compression: Compression, checkpoint: Checkpoint = _noop) -> None:
    """Refuse a root holding flat-layout transcripts or transcripts of the other encoding (spec §1.5)."""
    for project in _project_dirs(root):
        checkpoint()
        for session_dir in _subdirs(project, missing_ok=False):
            _check_opposite(session_dir, compression)


def check_target_dir(session_dir: str, compression: Compression) -> None:
    """Materialization's own mismatch check: artifacts may appear after an empty preflight."""
    _check_opposite(session_dir, compression)


def find_transcript(root: str, session_id: str, compression: Compression, checkpoint: Checkpoint = _noop) -> str | None:
    """The transcript path of ``session_id`` in any project directory, or ``None`` (spec §1.6).

    Cost is O(project directories), independent of the number of sessions.
    """
    segment = session_segment(session_id)
    suffix = _suffix_for(compression)
    hits: list[str] = []
    for project in _project_dirs(root):
        checkpoint()
        for flat_suffix in (RAW_SUFFIX, ZSTD_SUFFIX):
            if len(segment) + len(flat_suffix) > MAX_SEGMENT:
                continue  # no such name can exist (and probing it would fail with ENAMETOOLONG)
            flat = os.path.join(project, segment + flat_suffix)
            if is_file(flat):
                raise _flat_layout(flat)
        session_dir = os.path.join(project, segment)
        if not real_dir(session_dir):  # a symlinked session directory raises ELOOP here
            continue
        _check_opposite(session_dir, compression)
        own = os.path.join(session_dir, TRANSCRIPT_STEM + suffix)
        if is_file(own):
            hits.append(own)
    if len(hits) > 1:
        raise SessionPersistenceCorruptionError(
            f'duplicate JSONL session id "{session_id}" appears in multiple project directories: {", ".join(hits)}'
        )
    return hits[0] if hits else None


def check_identity(
    root: str, compression: Compression, path: str, header: SessionHeader, requested_id: str | None
) -> None:
    """The stored header must name the file it lives in (spec §3.7); a mismatched file is never modified."""
    if requested_id is not None and header.id != requested_id:
        raise corrupt(
            f'corrupt session log "{path}": requested id "{requested_id}" does not match header id "{header.id}"'
        )
    cwd = header.cwd if isinstance(header.cwd, str) else None
    try:
        expected = transcript_path(root, cwd, header.id, compression)
    except ValueError as exc:
        raise corrupt(f'corrupt session log "{path}": header id cannot name a storage path') from exc
    if path == expected:
        return
    # Case-insensitive file systems name one file two ways; a symlinked alias is never accepted (appends go to
    # the path the header names, and that path must not leave the layout).
    mismatch = f'corrupt session log "{path}": header id "{header.id}" and cwd identify "{expected}"'
    try:
        aliased = any(
            stat.S_ISLNK(os.lstat(p).st_mode)
            for p in (os.path.dirname(os.path.dirname(expected)), os.path.dirname(expected))
        )
    except OSError:
        raise corrupt(mismatch) from None
    if aliased or os.path.realpath(path) != os.path.realpath(expected):
        raise corrupt(mismatch)


def _read_raw_header(fd: int, checkpoint: Checkpoint) -> bytes | None:
    buf = b""
    while len(buf) <= HEADER_CAP:
        checkpoint()
        chunk = os.read(fd, LIST_READ_CHUNK)
        if not chunk:
            return None
        start = len(buf)
        buf += chunk
        end = buf.find(b"\n", start)
        if end >= 0:
            return buf[:end]
    raise corrupt(f"corrupt session log: header line is longer than {HEADER_CAP} bytes")


def _read_zstd_header(fd: int, checkpoint: Checkpoint) -> bytes | None:
    buf = b""
    while len(buf) <= HEADER_CAP:
        checkpoint()
        chunk = os.read(fd, LIST_READ_CHUNK)
        if not chunk:
            return None
        buf += chunk
        scan = scan_frames(buf, max_frames=1)
        if scan.frames:
            start, end = scan.frames[0]
            try:
                plaintext = decompress_frame_bounded(
                    memoryview(buf)[start:end], start, HEADER_CAP, zstandard.ZstdDecompressor()
                )
            except FrameError as exc:
                raise corrupt("corrupt Zstandard session log: header frame failed validation") from exc
            if not plaintext.endswith(b"\n") or plaintext.count(b"\n") != 1:
                raise corrupt("corrupt Zstandard session log: first frame is not exactly one header line")
            return plaintext[:-1]
    raise corrupt(f"corrupt Zstandard session log: header frame is longer than {HEADER_CAP} bytes")


def read_listed(path: str, compression: Compression, cap: int, checkpoint: Checkpoint = _noop) -> Listed | None:
    """The header of one transcript, read alone (v1: its declared pair; v0: line or frame 0), bounded.

    ``None`` for a v0 transcript with no complete header yet; damage raises ``SessionPersistenceCorruptionError``.
    """
    fd = open_read(path)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 64, 0)
        if is_declared(head, compression):
            log = walk_declared(
                FdSource(fd, size),
                compression,
                path,
                cap,
                header_only=True,
                refuse_versions=False,
                checkpoint=checkpoint,
            )
            return Listed(log.header, log.inherited_event_count, path)
        try:
            line = (_read_zstd_header if compression == "zstd" else _read_raw_header)(fd, checkpoint)
        except FrameError as exc:
            raise corrupt(str(exc), path) from exc
        except SessionPersistenceCorruptionError as exc:
            raise corrupt(str(exc), path) from exc.__cause__
    finally:
        os.close(fd)
    if line is None:
        return None
    header, cut = parse_header_line(line, path, refuse_versions=False)
    if header.version == DECLARED_FORMAT_VERSION:
        raise corrupt("corrupt session log: a v1 header in a log without batch declarations", path)
    return Listed(header, cut, path)


def _damaged(session_dir: str, path: str, message: str) -> Damaged:
    try:
        session_id: str | None = decode_segment(os.path.basename(session_dir))
    except ValueError:
        session_id = None
    return Damaged(session_id, path, message)


def list_transcripts(
    root: str, compression: Compression, cap: int, checkpoint: Checkpoint = _noop
) -> tuple[list[Listed], list[Damaged]]:
    """Header-only discovery, sorted by path: event batches are never read (spec §3.6).

    A session whose header is damaged, oversized, not a header, or whose directory is a symlink is reported in
    the second list and left out of the first; it never fails the listing of the other sessions.
    """
    suffix = _suffix_for(compression)
    found: dict[str, Listed] = {}
    damaged: list[Damaged] = []
    for project in _project_dirs(root):
        checkpoint()
        for session_dir in _subdirs(project, missing_ok=False):
            _check_opposite(session_dir, compression)
            path = os.path.join(session_dir, TRANSCRIPT_STEM + suffix)
            try:
                listed = read_listed(path, compression, cap, checkpoint)
                if listed is None:
                    damaged.append(_damaged(session_dir, path, "empty or header-less session log"))
                    continue
                check_identity(root, compression, path, listed.header, None)
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                damaged.append(_damaged(session_dir, path, f"symbolic link refused: {exc.strerror}"))
                continue
            except NotAHeaderError as exc:
                damaged.append(_damaged(session_dir, path, str(exc)))
                continue
            except SessionFormatUnsupportedError:
                raise
            except SessionPersistenceError as exc:
                damaged.append(_damaged(session_dir, path, str(exc)))
                continue
            header = listed.header
            if header.id in found:
                raise SessionPersistenceCorruptionError(
                    f'duplicate JSONL session id "{header.id}" appears in multiple project directories: '
                    f"{found[header.id].path}, {path}"
                )
            found[header.id] = listed
    return list(found.values()), damaged
