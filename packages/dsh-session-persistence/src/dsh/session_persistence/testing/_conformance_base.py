"""The conformance kit's shared base: the fixtures and hooks a backend's test class overrides, and the
small helpers every group of cases uses."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from .._backends.protocol import SessionBackend, StorageMetadata, SupportsRewrite
from .._host.session import Session
from .._model.events import SessionEvent
from .._model.header import SessionHeader, header_to_builtins
from ._rig import BackendFactory, ConformanceRig
from .fixtures import ANYIO_BACKENDS

__all__ = ["_KitBase"]

_ids = itertools.count()


def _seqs(events: Sequence[SessionEvent]) -> list[int]:
    return [e.seq for e in events]


def _append_live(session: Session, events: Sequence[SessionEvent]) -> None:
    for e in events:
        session.append_event(e)


def _header_key(header: SessionHeader) -> dict[str, Any]:
    # Absent and 0 both mean "top level"; a backend may always write the depth (JSONL does, spec/jsonl.md).
    key = header_to_builtins(header)
    key.setdefault("delegationDepth", 0)
    return key


def _same_header(left: SessionHeader, right: SessionHeader) -> bool:
    """Header equality modulo ``delegationDepth`` absent == 0."""
    return _header_key(left) == _header_key(right)


def _same_headers(left: Sequence[SessionHeader], right: Sequence[SessionHeader]) -> bool:
    return [_header_key(h) for h in left] == [_header_key(h) for h in right]


def _ids_of(headers: Sequence[Any]) -> list[str]:
    return [h.id for h in headers]


class _KitBase:
    """Fixtures and hooks of :class:`~dsh.session_persistence.testing.BackendConformance` (see its doc)."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    #: ``None`` detects the optional ``rewrite`` primitive; set ``False`` to assert the unsupported error.
    supports_truncate: ClassVar[bool | None] = None
    #: Examples the hypothesis property test runs per async backend.
    property_max_examples: ClassVar[int] = 25

    # ------------------------------------------------------------------------------------------------------
    # Fixtures and hooks a subclass provides or overrides

    @pytest.fixture(scope="class", params=ANYIO_BACKENDS)
    @classmethod
    def anyio_backend(cls, request: pytest.FixtureRequest) -> Any:
        """Every async test runs on asyncio (debug mode) and trio."""
        return request.param

    @pytest.fixture
    def backend_factory(self) -> BackendFactory:
        """Override: return a zero-argument callable building a new backend instance over one empty storage."""
        pytest.fail(f"{type(self).__name__} must override the backend_factory fixture")

    @pytest.fixture
    def conformance(self, backend_factory: BackendFactory) -> ConformanceRig:
        """The rig every kit test uses (built from ``backend_factory`` and ``plant_raw``)."""
        return ConformanceRig(backend_factory, self.plant_raw)

    async def inject_torn_tail(self, backend: SessionBackend, session_id: str) -> None:
        """Override: append a never-committed fragment after the stored log of ``session_id``."""
        pytest.skip("backend cannot inject torn tails")

    async def plant_raw(
        self, backend: SessionBackend, storage: StorageMetadata, events: Sequence[SessionEvent]
    ) -> None:
        """Store ``storage`` and ``events`` verbatim (headers and events a reader must refuse).

        The default uses the backend's own first-batch ``append_batch``; override it if the backend validates
        what it writes, or skip.
        """
        await backend.append_batch(storage, list(events), False)

    def _truncate_supported(self, backend: SessionBackend) -> bool:
        if self.supports_truncate is None:
            return isinstance(backend, SupportsRewrite)
        return self.supports_truncate
