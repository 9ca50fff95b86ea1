"""On-disk layout: project keys, session-id escaping and transcript paths (spec/jsonl.md §1).

Everything here is pure string computation; no function touches the file system.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator

from .._format.frames import Compression

__all__ = [
    "NO_CWD_DIR",
    "RAW_SUFFIX",
    "ZSTD_SUFFIX",
    "child_dirs",
    "decode_segment",
    "encode_segment",
    "project_dir_name",
    "project_key",
    "session_segment",
    "suffix_for",
    "transcript_path",
]

#: Project directory of sessions whose header has no ``cwd``.
NO_CWD_DIR = "_no-cwd"
#: Transcript name suffixes; ``session`` + suffix is the fixed file name inside the session directory.
ZSTD_SUFFIX = ".jsonl.zstd"
RAW_SUFFIX = ".jsonl"
TRANSCRIPT_STEM = "session"

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_SEPARATORS = frozenset((ord("/"), ord("\\"), ord(":")))
_MAX_SLUG = 251
#: One path segment (NAME_MAX on every common file system).
MAX_SEGMENT = 255
_HASHED_PREFIX = 160
_HASH_MARK = "~~"
_ESCAPE = re.compile(r"~([0-9A-F]{4})")


def _reject_surrogates(text: str, what: str) -> None:
    # Over Python str the UTF-16 walk is not injective when lone surrogates are present ("\U0001F600" and
    # "\ud83d\ude00" would escape alike), and msgspec cannot write them anyway (spec §6.6).
    for ch in text:
        if 0xD800 <= ord(ch) <= 0xDFFF:
            raise ValueError(f"cannot encode {what} containing a lone surrogate code point")


def _units(text: str) -> list[int]:
    raw = text.encode("utf-16-le", "surrogatepass")
    return [raw[i] | (raw[i + 1] << 8) for i in range(0, len(raw), 2)]


def _escape_unit(unit: int) -> str:
    return chr(unit) if unit < 0x80 and unit in _SAFE else f"~{unit:04X}"


def encode_segment(session_id: str) -> str:
    """Escape a session id into one safe path segment over ``[A-Za-z0-9._~-]``, never ``.`` or ``..``.

    Each UTF-16 code unit outside the ASCII safe set (``~`` included) becomes ``~`` + 4 uppercase hex digits,
    which makes the mapping injective and decodable (:func:`decode_segment`).
    """
    if session_id == "":
        raise ValueError("cannot encode an empty path segment")
    _reject_surrogates(session_id, "a session id")
    if session_id == ".":
        return "~002E"
    if session_id == "..":
        return "~002E~002E"
    return "".join(_escape_unit(u) for u in _units(session_id))


def session_segment(session_id: str) -> str:
    """The directory name of a session: :func:`encode_segment`, or a hashed form when that is too long.

    An escaped id longer than one path segment (255 bytes; ids of 52+ non-ASCII or 256+ ASCII characters)
    becomes ``<first escaped characters>~~<SHA-256 of the id, hex>``. The mapping stays injective: an escaped
    segment never contains ``~~`` (each ``~`` starts a 4-hex-digit escape), and two hashed segments differ
    unless SHA-256 collides. Listing and loading read the id from the header, so a hashed segment needs no
    decoding.
    """
    encoded = encode_segment(session_id)
    if len(encoded) <= MAX_SEGMENT:
        return encoded
    cut = _HASHED_PREFIX
    escape = encoded.rfind("~", cut - 4, cut)
    if escape >= 0:
        cut = escape  # never keep half an escape
    digest = hashlib.sha256(session_id.encode("utf-8")).hexdigest()
    return f"{encoded[:cut]}{_HASH_MARK}{digest}"


def decode_segment(segment: str) -> str:
    """Invert :func:`encode_segment` (used by tests and diagnostics); a hashed segment cannot be inverted."""
    if _HASH_MARK in segment:
        raise ValueError(f"hashed path segment {segment!r} does not hold the whole id")
    units: list[int] = []
    pos = 0
    while pos < len(segment):
        ch = segment[pos]
        if ch == "~":
            match = _ESCAPE.match(segment, pos)
            if match is None:
                raise ValueError(f"invalid escape in path segment {segment!r}")
            units.append(int(match.group(1), 16))
            pos = match.end()
        else:
            units.append(ord(ch))
            pos += 1
    raw = b"".join(u.to_bytes(2, "little") for u in units)
    return raw.decode("utf-16-le", "surrogatepass")


def project_key(cwd: str) -> str:
    """The project directory name for a cwd: ``--<slug>--``, ASCII, at most 255 bytes (spec §1.2).

    Deliberately lossy (``/a/b-c`` and ``/a-b/c`` share a key): session ids keep sessions apart.
    """
    if cwd == "":
        raise ValueError("cannot encode an empty project path")
    _reject_surrogates(cwd, "a cwd")
    parts: list[str] = []
    in_separator = False
    for unit in _units(cwd):
        if unit in _SEPARATORS:
            if not in_separator:
                parts.append("-")
            in_separator = True
            continue
        in_separator = False
        parts.append(_escape_unit(unit))
    slug = "".join(parts).lstrip("-") or "root"
    return f"--{slug[:_MAX_SLUG]}--"


def project_dir_name(cwd: str | None) -> str:
    """``_no-cwd`` for a header without cwd, else :func:`project_key`."""
    return NO_CWD_DIR if cwd is None else project_key(cwd)


def suffix_for(compression: Compression) -> str:
    """Transcript suffix for a compression mode."""
    return ZSTD_SUFFIX if compression == "zstd" else RAW_SUFFIX


def opposite_suffix(compression: Compression) -> str:
    """The suffix of the other encoding (whose presence in this root is an error)."""
    return RAW_SUFFIX if compression == "zstd" else ZSTD_SUFFIX


def transcript_path(root: str, cwd: str | None, session_id: str, compression: Compression) -> str:
    """``<root>/<project dir>/<escaped id>/session<suffix>``, built by string joins only (no I/O)."""
    return os.path.join(
        root, project_dir_name(cwd), session_segment(session_id), TRANSCRIPT_STEM + suffix_for(compression)
    )


def child_dirs(path: str) -> Iterator[os.DirEntry[str]]:
    """The directories directly in ``path`` (none if it is missing or not a directory)."""
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                # d_type from the directory read: no stat, and symlinked aliases are never followed.
                if entry.is_dir(follow_symlinks=False):
                    yield entry
    except (FileNotFoundError, NotADirectoryError):
        return
