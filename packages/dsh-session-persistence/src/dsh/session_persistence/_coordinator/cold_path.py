"""The cold path: reading a stored session that no live Session owns, and committing its crash repair.

``prepare`` reads and validates the stored log and computes the closers of an interrupted turn (no write).
``cold_commit`` is what ``load`` and a storage-only ``append`` do: it takes the writer lease when it must write
(repair, or the caller is about to append), re-reads under it (a read made before the lease is never paired with
the log it guards), commits repair if needed, re-reads what storage then holds, and records ownerless state for
the id. A cold load that needs no repair is one backend read (one worker call), or one revision read when a
preview's read is reused. ``read_from`` is the storage-only suffix read: no closers, no repair, no lease.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from .._backends.protocol import StorageMetadata, StoredPrefix
from .._model.errors import SessionLiveError, SessionNotFoundError, SessionPersistenceError
from .._model.events import SessionEvent
from .._model.repair import interrupted_turn_closers
from .._model.stored_events import StoredEvents
from .._model.views import SessionEventSuffix, SessionInspection
from .._wire.stored_log import corruption, validate_stored
from .state import CoordinatorCore, SessionState

__all__ = ["MAX_COLD_ATTEMPTS", "Prepared", "cold_commit", "prepare", "read_from"]

#: How many times a cold load re-reads a log that keeps changing under it before giving up.
MAX_COLD_ATTEMPTS = 32


@dataclass(frozen=True)
class Prepared:
    """A validated cold read: the stored prefix, its closers and the inspection (stored + closers)."""

    stored: StoredPrefix
    closers: list[SessionEvent]
    inspection: SessionInspection


async def prepare(core: CoordinatorCore, session_id: str) -> Prepared:
    """Read and validate the stored log and compute its closers (no writes). Runs serialized.

    A read this coordinator prepared before (a preview) is reused when storage still reports its revision.
    """
    cache = core.preparations
    if cache.revision_of(session_id) is not None:
        cached = cache.take(session_id, await core.backend.read_stored_revision(session_id))
        if isinstance(cached, Prepared):
            return cached
    stored = await core.backend.load_stored(session_id)
    if stored is None:
        raise SessionNotFoundError(session_id)
    meta, cut, events = stored.meta, stored.inherited_event_count, stored.events
    validator = validate_stored(session_id, meta, cut, events, core.location(meta))
    assert validator is not None
    try:
        closers = interrupted_turn_closers(events)
        # One pass: the validator that checked the stored events continues over the closers, so the balanced
        # view is proven valid without re-validating (or re-building) the whole log.
        for closer in closers:
            validator.check(closer)
    except Exception as exc:
        raise corruption(session_id, exc) from exc
    # The stored events as read (packed chunk runs stay packed until a reader asks for them), then the closers.
    inspection = SessionInspection(meta=meta, inherited_event_count=cut, events=StoredEvents.concat((events, closers)))
    prepared = Prepared(stored=stored, closers=closers, inspection=inspection)
    cache.put(session_id, stored.revision, prepared)
    return prepared


async def cold_commit(core: CoordinatorCore, session_id: str, *, for_write: bool = False) -> SessionInspection:
    """Reserve and commit a cold session: repair, re-read, record ownerless state. Runs serialized.

    ``for_write``: the caller appends next, so the writer lease is taken even when nothing needs repair.
    """
    for _ in range(MAX_COLD_ATTEMPTS):
        prepared = await prepare(core, session_id)
        state = core.states.get(session_id)
        if state is not None and state.owner is not None:
            raise SessionLiveError(f'session "{session_id}" already has a live persistence owner')
        stored = prepared.stored
        needs_repair = stored.torn_marker is not None or bool(prepared.closers)
        if (needs_repair or for_write) and not core.leases.holds(session_id):
            await core.leases.acquire(stored.meta)
            continue  # re-read under the lease: the view read before it may already be stale
        # No second look at the revision here: ``prepare`` has just read it (with the log, or to validate a cached
        # read) in this very attempt, with nothing awaited since, and a write below happens under the lease.
        storage = StorageMetadata(stored.meta, stored.inherited_event_count)
        if needs_repair:
            await core.writes.repair(session_id, storage, stored.torn_marker, prepared.closers)
            continue  # re-read: the committed view is what storage now holds
        if state is None:
            core.states[session_id] = SessionState(storage, len(stored.events), True, None)
        else:
            state.storage = storage
            state.cursor = len(stored.events)
            state.materialized = True
            state.doubt = None
        core.preparations.drop(session_id)  # committed: from here on this coordinator writes the id
        return prepared.inspection
    raise SessionPersistenceError(
        f'stored session "{session_id}" kept changing while it was being loaded ({MAX_COLD_ATTEMPTS} attempts)'
    )


async def read_from(core: CoordinatorCore, session_id: str, from_seq: int) -> SessionEventSuffix:
    """The stored events with ``seq >= from_seq``, validated (storage only). Runs serialized."""
    seek = core.caps.seek
    if seek is not None:
        suffix = await seek(session_id, from_seq)
        if suffix is None:
            raise SessionNotFoundError(session_id)
        meta, cut = suffix.meta, suffix.inherited_event_count
        events: Sequence[SessionEvent] = suffix.events
        # A seek read starts exactly at ``from_seq`` (or is empty past the end).
        validate_stored(session_id, meta, cut, events, core.location(meta), start=from_seq, whole=False)
    else:
        stored = await core.backend.load_stored(session_id)
        if stored is None:
            raise SessionNotFoundError(session_id)
        meta, cut = stored.meta, stored.inherited_event_count
        validate_stored(session_id, meta, cut, stored.events, core.location(meta), whole=False)
        events = stored.events[from_seq:]
    return SessionEventSuffix(meta=meta, inherited_event_count=cut, from_seq=from_seq, events=tuple(events))


async def iter_from(core: CoordinatorCore, session_id: str, from_seq: int) -> AsyncGenerator[SessionEvent, None]:
    """The stored events with ``seq >= from_seq``, validated run by run (storage only), streamed.

    With a streaming backend memory stays bounded by one stored run; without one this is ``read_from``.
    """
    stream = core.caps.stream
    if stream is None:
        suffix = await core.chains.run(session_id, lambda: read_from(core, session_id, from_seq))
        for event in suffix.events:
            yield event
        return
    expected = from_seq
    runs = stream(session_id, from_seq)
    try:
        async for run in runs:
            events = run.events
            validate_stored(
                session_id,
                run.meta,
                run.inherited_event_count,
                events,
                core.location(run.meta),
                start=expected,
                whole=False,
            )
            expected += len(events)
            for event in events:
                yield event
    finally:
        aclose = getattr(runs, "aclose", None)
        if aclose is not None:
            await aclose()
