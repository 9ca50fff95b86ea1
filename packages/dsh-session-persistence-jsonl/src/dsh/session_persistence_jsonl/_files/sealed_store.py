"""A sealed store stays sealed: the marker a store's first sealed write leaves at its root (DESIGN §12.3).

``<root>/.dsh-sealed`` says "this store holds sealed sessions". It is published before the first sealed bytes
(staging file, fsync, ``link``, directory fsync: the same steps as a new transcript), so no crash leaves a sealed
session in a store without it. Once it exists, a backend opened without ``encryption=`` refuses every write of
session data (it could only write plaintext) unless it was opened with ``allow_plaintext=True``; reads, listing,
deletion and leases need no key and are never refused. A 0.3 store (sealed sessions, no marker) gets the marker at
its next sealed write.

Blocking code for worker threads.
"""

from __future__ import annotations

import os

from dsh.session_persistence.backend import SessionKeyError

from .fs import fsync_dir, publish_exclusive

__all__ = ["MARKER_NAME", "SealedStoreError", "is_sealed", "mark_sealed", "marker_exists", "refusal"]

MARKER_NAME = ".dsh-sealed"
_MARKER_TEXT = b'{"dsh":"sealed-store","v":1}\n'


class SealedStoreError(SessionKeyError):
    """A backend without keys was asked to write plaintext into a store that holds sealed sessions.

    Give the store's keys (``encryption=``, ``--key-env``/``--key-file``), or opt out on purpose with
    ``allow_plaintext=True`` (``dsh-sessions -o allow_plaintext=true``). Nothing was written.
    """


def is_sealed(root: str) -> bool:
    """Whether ``root`` carries the marker (in any form: a name there is the store's word, never ignored)."""
    return marker_exists(os.path.join(root, MARKER_NAME))


def marker_exists(marker: str) -> bool:
    """Whether the name ``marker`` (the path of a root's marker) exists, whatever it names (a dangling symlink
    too): one ``faccessat`` (``F_OK``, not following a symlink), no ``stat`` result or exception made, since every
    write of session data asks. A root that cannot be searched answers no here, and the write it guards then fails
    at its own look-up of the transcript under that root."""
    return os.access(marker, os.F_OK, follow_symlinks=False)


def mark_sealed(root: str) -> None:
    """Publish the marker durably (idempotent); the root must exist."""
    try:
        publish_exclusive(os.path.join(root, MARKER_NAME), _MARKER_TEXT)
    except FileExistsError:
        fsync_dir(root)  # another writer published it: its directory entry may not be durable yet


def refusal(root: str, session_id: str) -> SealedStoreError:
    return SealedStoreError(
        f'refusing to write session "{session_id}" as plaintext: the store at "{root}" holds sealed sessions '
        f'(its "{MARKER_NAME}" marker) and this backend has no key provider (encryption=); give the store\'s keys, or '
        "opt out on purpose with allow_plaintext=True (dsh-sessions: -o allow_plaintext=true). Nothing was written"
    )
