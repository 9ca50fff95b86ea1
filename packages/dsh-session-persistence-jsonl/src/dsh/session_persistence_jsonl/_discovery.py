"""Finding transcripts under a root: preflight, lookup by id, header-only listing, identity (spec §1.5-§1.6, §3.6-§3.7).

Blocking code for worker threads. Directory walks never follow symlinks (``is_dir(follow_symlinks=False)``),
so an aliased project directory is not listed twice. ``checkpoint`` is called between I/O calls so a
cancelled caller stops the walk at the next boundary (``anyio.from_thread.check_cancelled``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from dsh.session_persistence.backend import (
    SessionFormatUnsupportedError,
    SessionHeader,
    SessionPersistenceCorruptionError,
)

from ._frames import FrameError, decode_frame, scan_frames
from ._fs import is_file
from ._layout import RAW_SUFFIX, TRANSCRIPT_STEM, ZSTD_SUFFIX, Compression, encode_segment, transcript_path
from ._layout import opposite_suffix as _opposite_suffix
from ._layout import suffix_for as _suffix_for
from ._records import NotAHeaderError, corrupt, parse_header_line

__all__ = ["Listed", "check_identity", "find_transcript", "list_transcripts", "preflight"]

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
    segment = encode_segment(session_id)
    suffix = _suffix_for(compression)
    hits: list[str] = []
    for project in _project_dirs(root):
        checkpoint()
        for flat_suffix in (RAW_SUFFIX, ZSTD_SUFFIX):
            flat = os.path.join(project, segment + flat_suffix)
            if is_file(flat):
                raise _flat_layout(flat)
        session_dir = os.path.join(project, segment)
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
    # Case-insensitive file systems and symlinked project aliases name one file two ways.
    if os.path.realpath(path) != os.path.realpath(expected):
        raise corrupt(f'corrupt session log "{path}": header id "{header.id}" and cwd identify "{expected}"')


def _read_raw_header(path: str, checkpoint: Checkpoint) -> bytes | None:
    buf = b""
    with open(path, "rb", buffering=0) as fh:
        while True:
            checkpoint()
            chunk = fh.read(LIST_READ_CHUNK)
            if not chunk:
                return None
            start = len(buf)
            buf += chunk
            end = buf.find(b"\n", start)
            if end >= 0:
                return buf[:end]


def _read_zstd_header(path: str, checkpoint: Checkpoint) -> bytes | None:
    buf = b""
    with open(path, "rb", buffering=0) as fh:
        while True:
            checkpoint()
            chunk = fh.read(LIST_READ_CHUNK)
            if not chunk:
                return None
            buf += chunk
            try:
                scan = scan_frames(buf, max_frames=1)
            except FrameError as exc:
                raise corrupt(str(exc), path) from exc
            if scan.frames:
                start, end = scan.frames[0]
                try:
                    plaintext = decode_frame(memoryview(buf)[start:end], start)
                except FrameError as exc:
                    raise corrupt("corrupt Zstandard session log: header frame failed validation", path) from exc
                if not plaintext.endswith(b"\n") or plaintext.count(b"\n") != 1:
                    raise corrupt("corrupt Zstandard session log: first frame is not exactly one header line", path)
                return plaintext[:-1]


def list_transcripts(root: str, compression: Compression, checkpoint: Checkpoint = _noop) -> list[Listed]:
    """Header-only discovery: event lines and frames are never read (spec §3.6). Sorted by path."""
    suffix = _suffix_for(compression)
    read_header = _read_zstd_header if compression == "zstd" else _read_raw_header
    found: dict[str, Listed] = {}
    for project in _project_dirs(root):
        checkpoint()
        for session_dir in _subdirs(project, missing_ok=False):
            _check_opposite(session_dir, compression)
            path = os.path.join(session_dir, TRANSCRIPT_STEM + suffix)
            try:
                line = read_header(path, checkpoint)
            except FileNotFoundError:
                continue
            if line is None:
                continue
            try:
                header, cut = parse_header_line(line, path, refuse_versions=False)
            except NotAHeaderError:
                continue
            check_identity(root, compression, path, header, None)
            if header.id in found:
                raise SessionPersistenceCorruptionError(
                    f'duplicate JSONL session id "{header.id}" appears in multiple project directories: '
                    f"{found[header.id].path}, {path}"
                )
            found[header.id] = Listed(header, cut, path)
    return list(found.values())
