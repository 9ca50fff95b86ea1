"""Which optional primitives a backend has, decided once when the coordinator is built.

Each optional primitive is a ``runtime_checkable`` protocol in :mod:`._backend`; a backend has it when it
satisfies the protocol. The bound methods are kept here, so the coordinator never probes with ``getattr`` per
call, and a primitive that is missing is ``None``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from .._model.events import SessionEvent
from .._model.header import SessionHeader
from .protocol import (
    RawArtifact,
    SessionBackend,
    SessionLocation,
    StorageMetadata,
    StoredSuffix,
    SupportsAclose,
    SupportsLocate,
    SupportsMaterializeHeader,
    SupportsRawArtifacts,
    SupportsRewrite,
    SupportsSeek,
    SupportsStreamingRead,
    SupportsWriterLease,
    WriterLease,
)

__all__ = ["Capabilities"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The optional primitives of one backend (``None`` where it has none)."""

    seek: Callable[[str, int], Awaitable[StoredSuffix | None]] | None
    stream: Callable[[str, int], AsyncIterator[StoredSuffix]] | None
    materialize_header: Callable[[StorageMetadata], Awaitable[None]] | None
    rewrite: Callable[[StorageMetadata, Sequence[SessionEvent]], Awaitable[None]] | None
    locate: Callable[[SessionHeader], SessionLocation | None] | None
    read_raw: Callable[[str], Awaitable[RawArtifact | None]] | None
    aclose: Callable[[], Awaitable[None]] | None
    acquire_writer_lease: Callable[[SessionHeader], Awaitable[WriterLease]] | None

    @classmethod
    def of(cls, backend: SessionBackend) -> Capabilities:
        """Resolve every optional primitive of ``backend`` now."""
        raw = backend.read_raw if isinstance(backend, SupportsRawArtifacts) and backend.supports_raw_artifacts else None
        return cls(
            seek=backend.load_stored_from if isinstance(backend, SupportsSeek) else None,
            stream=backend.iter_stored if isinstance(backend, SupportsStreamingRead) else None,
            materialize_header=backend.materialize_header if isinstance(backend, SupportsMaterializeHeader) else None,
            rewrite=backend.rewrite if isinstance(backend, SupportsRewrite) else None,
            locate=backend.locate if isinstance(backend, SupportsLocate) else None,
            read_raw=raw,
            aclose=backend.aclose if isinstance(backend, SupportsAclose) else None,
            acquire_writer_lease=(backend.acquire_writer_lease if isinstance(backend, SupportsWriterLease) else None),
        )
