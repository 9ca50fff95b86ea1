"""Session lifecycle on the coordinator: paged listing, deletion, retention (prune) and compaction.

The :class:`~dsh.session_persistence.PersistenceCoordinator` keeps one thin method per operation and delegates
here. Each operation that changes storage runs serialized on the session id (after any earlier call on it), is
refused for a session that is live in this process (:class:`SessionLiveError`) or whose writer lease another
writer holds (:class:`SessionLockedError`, naming the holder), and leaves storage untouched when it refuses.
Compaction takes the writer lease through the coordinator like every rewrite; a deletion hands the id to the
backend, which takes the lease itself for the unlink (so a damaged log whose header cannot be read can still
be deleted), after this coordinator gave back any lease it held for the cold id.

The backend primitives are optional (``SupportsDelete``, ``SupportsListPage``, ``SupportsCompact``); a backend
without one raises :class:`UnsupportedOperationError`.
"""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

import anyio

from .._backends.listing import (
    ListQuery,
    SessionListing,
    SessionPage,
    SupportsListPage,
    decode_list_cursor,
    encode_list_cursor,
    make_list_query,
)
from .._backends.protocol import StorageMetadata, SupportsCompact, SupportsDelete
from .._model.errors import (
    LifecycleArgumentError,
    SessionChangedError,
    SessionLiveError,
    SessionLockedError,
    SessionNeedsRepairError,
    SessionNotFoundError,
    UnsupportedOperationError,
)
from .._model.ids import check_session_id

if TYPE_CHECKING:
    from .._backends.protocol import StoredPrefix
    from .._model.events import SessionEvent
    from .state import CoordinatorCore


class PreparedRead(Protocol):
    """What compaction reads of a validated cold read (``cold_path.Prepared``)."""

    @property
    def stored(self) -> StoredPrefix: ...

    @property
    def closers(self) -> list[SessionEvent]: ...


#: The cold path's ``prepare``, handed in by the service: lifecycle stands beside the cold path, not above it.
Prepare = Callable[["CoordinatorCore", str], Awaitable[PreparedRead]]

__all__ = ["CompactResult", "PruneReport", "compact", "delete", "list_page", "prune"]

#: Called as ``progress(done, total)`` while a prune deletes (for a progress line on a terminal).
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class CompactResult:
    """What :meth:`PersistenceCoordinator.compact` did: the event count kept and the revisions around it."""

    session_id: str
    event_count: int
    revision_before: str
    revision_after: str | None


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What a prune selected and (unless ``dry_run``) deleted.

    ``selected`` are the sessions the policy chose, most recent first; ``deleted`` the ids actually removed
    (empty on a dry run); ``skipped`` pairs an id with why it was not removed (live, locked, changed since it
    was listed, already gone); ``kept`` counts the listed sessions the policy keeps.
    """

    dry_run: bool
    selected: tuple[SessionListing, ...]
    deleted: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]
    kept: int


def _require(core: CoordinatorCore, kind: type, what: str) -> object:
    backend = core.backend
    if not isinstance(backend, kind):
        raise UnsupportedOperationError(f'the "{core.name}" backend does not support {what}')
    return backend


def _refuse_live(core: CoordinatorCore, session_id: str, action: str) -> None:
    # A session owned by a live Session in this process (or being published) must not change underneath it.
    state = core.states.get(session_id)
    if core.live_session(session_id) is not None or (state is not None and state.owner is not None):
        raise SessionLiveError(f'cannot {action} session "{session_id}": it is live in this process')
    if core.reservations.get(session_id):
        raise SessionLiveError(f'cannot {action} session "{session_id}": it is being loaded')


async def list_page(
    core: CoordinatorCore,
    *,
    limit: int | None = None,
    cursor: str | None = None,
    order: str = "recent",
    cwd: str | os.PathLike[str] | None = None,
    parent: str | None = None,
    since: datetime | int | None = None,
) -> SessionPage:
    """One page of stored sessions; pass the page's ``next_cursor`` back to get the next one."""
    core.require_open()
    backend = _require(core, SupportsListPage, "paged listing")
    assert isinstance(backend, SupportsListPage)
    base = make_list_query(limit=limit, order=order, cwd=cwd, parent=parent, since=since)
    scope = backend.cursor_scope
    after = None if cursor is None else decode_list_cursor(cursor, scope, base)
    # One row more than asked tells whether a next page exists without a second call.
    probe = ListQuery(
        limit=None if limit is None else limit + 1,
        after=after,
        order=base.order,
        cwd=base.cwd,
        parent=base.parent,
        since=base.since,
    )
    await anyio.lowlevel.checkpoint_if_cancelled()
    rows = await backend.list_page(probe)
    if limit is not None and len(rows) > limit:
        rows = rows[:limit]
        return SessionPage(tuple(rows), encode_list_cursor(scope, base, rows[-1]))
    return SessionPage(tuple(rows), None)


async def delete(core: CoordinatorCore, session_id: str, expected_revision: str | None = None) -> None:
    """Durably delete a stored session that is not live; unknown ids raise :class:`SessionNotFoundError`."""
    core.require_open()
    backend = _require(core, SupportsDelete, "deletion")
    assert isinstance(backend, SupportsDelete)
    check_session_id(session_id)
    _refuse_live(core, session_id, "delete")
    await core.wait_retired(session_id)

    async def run() -> None:
        _refuse_live(core, session_id, "delete")
        # A cold id may still hold this coordinator's lease (a load that repaired it); the backend takes the
        # lease itself for the unlink, and a lease held here would refuse it.
        await core.leases.release(session_id)
        with anyio.CancelScope(shield=True):
            await backend.delete(session_id, expected_revision)
        # An ownerless cold state would otherwise let a later append continue a log that no longer exists.
        state = core.states.get(session_id)
        if state is not None and state.owner is None:
            del core.states[session_id]

    await core.chains.run(session_id, run)


async def compact(core: CoordinatorCore, session_id: str, prepare: Prepare) -> CompactResult:
    """Rewrite a closed, cold session's log as one batch (same events, same header), atomically.

    Refused, with nothing written, for a live session (:class:`SessionLiveError`), a log that needs repair
    (:class:`SessionNeedsRepairError`) and a log that changed while it was read (:class:`SessionChangedError`).
    """
    core.require_open()
    backend = _require(core, SupportsCompact, "compaction")
    assert isinstance(backend, SupportsCompact)
    check_session_id(session_id)
    _refuse_live(core, session_id, "compact")
    await core.wait_retired(session_id)

    async def run() -> CompactResult:
        _refuse_live(core, session_id, "compact")
        first = await prepare(core, session_id)
        # The lease first: a log with an open turn may simply be live in another process, and then the
        # honest refusal names that writer (SessionLockedError), not a repair it does not need.
        taken = await core.leases.acquire(first.stored.meta)
        try:
            # Re-read under the lease: the view read before it may already be stale.
            prepared = await prepare(core, session_id) if taken else first
            stored = prepared.stored
            if stored.torn_marker is not None or prepared.closers:
                raise SessionNeedsRepairError(session_id)
            storage = StorageMetadata(stored.meta, stored.inherited_event_count)
            with anyio.CancelScope(shield=True):
                await backend.compact(storage, stored.events, stored.revision)
            after = await core.backend.read_stored_revision(session_id)
        finally:
            if taken:
                await core.leases.release(session_id)
        state = core.states.get(session_id)
        if state is not None:
            state.storage = storage
        return CompactResult(session_id, len(stored.events), stored.revision, after)

    return await core.chains.run(session_id, run)


def _now_ms(now: datetime | int | None) -> int:
    if now is None:
        return time.time_ns() // 1_000_000
    if isinstance(now, datetime):
        if now.tzinfo is None:
            raise LifecycleArgumentError("now must be a timezone-aware datetime")
        return int(now.timestamp() * 1000)
    return int(now)


def select_for_prune(
    rows: builtins.list[SessionListing], *, older_than: timedelta | None, keep_last: int | None, now_ms: int
) -> tuple[builtins.list[SessionListing], int]:
    """The rows (most recent first) a retention policy removes, and how many it keeps."""
    if older_than is None and keep_last is None:
        raise LifecycleArgumentError("prune needs older_than, keep_last or both (refusing to delete everything)")
    if older_than is not None and (not isinstance(older_than, timedelta) or older_than <= timedelta(0)):
        raise LifecycleArgumentError(f"older_than must be a positive timedelta, got {older_than!r}")
    if keep_last is not None and (type(keep_last) is not int or keep_last < 0):
        raise LifecycleArgumentError(f"keep_last must be a non-negative integer, got {keep_last!r}")
    protected = 0 if keep_last is None else keep_last
    cutoff = None if older_than is None else now_ms - older_than // timedelta(milliseconds=1)
    chosen = [row for row in rows[protected:] if cutoff is None or row.updated_at < cutoff]
    return chosen, len(rows) - len(chosen)


async def prune(
    core: CoordinatorCore,
    *,
    older_than: timedelta | None = None,
    keep_last: int | None = None,
    dry_run: bool = True,
    now: datetime | int | None = None,
    progress: Progress | None = None,
) -> PruneReport:
    """Retention: delete sessions idle for longer than ``older_than``, always keeping the ``keep_last`` most recent.

    ``dry_run`` (the default) only reports. Each deletion checks the revision seen while listing, so a session
    written to after the listing is skipped (``"changed"``), never deleted; live and locked sessions are skipped.
    """
    core.require_open()
    now_ms = _now_ms(now)
    # Validate the policy before touching storage, so bad input changes nothing even on a large root.
    select_for_prune([], older_than=older_than, keep_last=keep_last, now_ms=now_ms)
    page = await list_page(core, order="recent")
    rows = builtins.list(page.entries)
    chosen, kept = select_for_prune(rows, older_than=older_than, keep_last=keep_last, now_ms=now_ms)
    if dry_run:
        return PruneReport(True, tuple(chosen), (), (), kept)
    _require(core, SupportsDelete, "deletion")
    deleted: builtins.list[str] = []
    skipped: builtins.list[tuple[str, str]] = []
    for index, row in enumerate(chosen):
        try:
            await delete(core, row.id, row.revision)
        except SessionChangedError:
            skipped.append((row.id, "changed since it was listed"))
        except SessionNotFoundError:
            skipped.append((row.id, "already gone"))
        except (SessionLiveError, SessionLockedError) as exc:
            skipped.append((row.id, str(exc)))
        else:
            deleted.append(row.id)
        if progress is not None:
            progress(index + 1, len(chosen))
    return PruneReport(False, tuple(chosen), tuple(deleted), tuple(skipped), kept)
