"""Finding a damaged *final* batch, the one piece of damage an operator may explicitly discard.

Damage is never cut by ``load`` or crash repair. ``dsh-sessions repair --discard-damaged-tail`` asks this module
whether the damage is confined to the last batch of a v1 log (nothing that verifies follows it); only then can
the file be cut at that batch's declaration, after the operator has been told what is lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsh.session_persistence.backend import SessionPersistenceCorruptionError

from ..encryption import KeyProvider
from .frames import Compression
from .v1 import BatchDamage, BufferSource, Source, is_declared, walk_declared
from .v1_declarations import (
    LINE_DECLARATION_MAX,
    LINE_DECLARATION_PREFIX,
    ZSTD_DECLARATION_MAGIC,
    ZSTD_DECLARATION_SIZE,
    DeclarationError,
    parse_line_declaration,
    parse_zstd_declaration,
)
from .v1_torn import rest_is_torn

__all__ = ["DamagedTail", "find_damaged_tail"]


@dataclass(frozen=True, slots=True)
class DamagedTail:
    """A damaged final batch: the file would be cut at ``start``; ``size`` is the file size it was found in."""

    path: str
    start: int
    size: int
    #: Events the log keeps (all before the damaged batch).
    kept_events: int
    #: The damaged batch's declared first seq and event count, ``None`` when its declaration is damaged too.
    first_seq: int | None
    count: int | None
    #: Why the batch does not verify.
    reason: str

    @property
    def lost_bytes(self) -> int:
        """Bytes the cut removes."""
        return self.size - self.start

    def describe(self) -> str:
        """One line saying what discarding this batch loses."""
        what = (
            f"{self.count} event(s), seqs {self.first_seq}..{self.first_seq + self.count - 1}"
            if self.first_seq is not None and self.count is not None
            else "an unknown number of events (its declaration is damaged too)"
        )
        return (
            f"the final batch at bytes {self.start}..{self.size} of {self.path} ({self.lost_bytes} bytes, {what}); "
            f"the {self.kept_events} event(s) before it are kept. Damage: {self.reason}"
        )


def _verifies_at(data: bytes, pos: int, compression: Compression) -> bool:
    try:
        if compression == "zstd":
            parse_zstd_declaration(data[pos : pos + ZSTD_DECLARATION_SIZE])
        else:
            lf = data.find(b"\n", pos, pos + LINE_DECLARATION_MAX + 1)
            parse_line_declaration(data[pos : lf if lf >= 0 else pos])
    except DeclarationError:
        return False
    return True


def _later_declaration(src: Source, start: int, compression: Compression) -> int | None:
    """Offset of a declaration that verifies anywhere after ``start``, if any (then the damage is not final)."""
    data = bytes(src.read(start, src.size))
    marker = ZSTD_DECLARATION_MAGIC if compression == "zstd" else LINE_DECLARATION_PREFIX
    pos = data.find(marker, 1)
    while pos != -1:
        if _verifies_at(data, pos, compression):
            return start + pos
        pos = data.find(marker, pos + 1)
    return None


def find_damaged_tail(
    data: bytes, compression: Compression, path: str, cap: int, keys: KeyProvider | None = None
) -> DamagedTail | None:
    """The damaged final batch of a v1 log, ``None`` when the log verifies (or ends in a mere torn tail).

    Raises ``SessionPersistenceCorruptionError`` when the damage is not confined to one final batch (the header,
    or a batch followed by data that verifies), and for a v0 log (which has no declarations to bound a batch).
    """
    if not is_declared(data[:64], compression):
        raise SessionPersistenceCorruptionError(
            f'"{path}" is a v0 log: without batch declarations its damage cannot be bounded to one batch'
        )
    src = BufferSource(data)
    try:
        walk_declared(src, compression, path, cap, keys=keys)
    except BatchDamage as exc:
        damage = exc
    else:
        return None
    if damage.end is not None:
        final = damage.end >= src.size or rest_is_torn(src, damage.end, compression)
    else:
        final = _later_declaration(src, damage.offset, compression) is None
    if not final:
        raise SessionPersistenceCorruptionError(
            f"the damage at byte {damage.offset} of {path} is followed by data that verifies: it is not confined "
            "to the final batch, so nothing is discarded"
        ) from damage
    kept = walk_declared(BufferSource(data[: damage.offset]), compression, path, cap, keys=keys)
    decl = damage.declaration
    return DamagedTail(
        path=path,
        start=damage.offset,
        size=len(data),
        kept_events=len(kept.events),
        first_seq=None if decl is None else decl.first_seq,
        count=None if decl is None else decl.count,
        reason=str(damage),
    )
