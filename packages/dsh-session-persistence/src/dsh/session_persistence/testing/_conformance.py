"""``BackendConformance``: the storage-contract and host scenarios every backend must pass.

A backend package subclasses it and overrides one fixture::

    from dsh.session_persistence.testing import BackendConformance

    class TestJsonlConformance(BackendConformance):
        @pytest.fixture
        def backend_factory(self, tmp_path):
            return lambda: JsonlBackend(tmp_path)

``backend_factory`` returns a zero-argument callable; every call must build a **new backend instance over the
same, initially empty storage** (the kit treats a new instance as a process restart). Optional hooks, each a
method a subclass may override:

* ``inject_torn_tail(backend, session_id)``: leave a never-committed fragment after the last committed batch
  (default: skip the torn-tail tests);
* ``plant_raw(backend, storage, events)``: store a header and events verbatim, bypassing the coordinator's
  checks (default: the backend's own ``append_batch``; override if it validates, or skip);
* ``supports_truncate``: ``None`` (default) detects the optional ``rewrite`` primitive;
* ``process_backend_factory`` (a fixture): a picklable factory building the backend over the same storage in
  another process, for the cross-process writer cases (default ``None``: skipped);
* ``lease_holder_names_pid``: set ``True`` when ``SessionLockedError.holder`` names the holding process.

Write failures are injected by :class:`~dsh.session_persistence.testing.FaultInjectingBackend`, a wrapper that
works for every backend. Every async test runs on asyncio and trio: the class provides its own
``anyio_backend`` fixture (override it to narrow the set). The hypothesis property test imports hypothesis
lazily and is skipped when it is not installed.
"""

from __future__ import annotations

from ._conformance_faults import _FaultAndRaceCases
from ._conformance_live import _LiveCases
from ._conformance_storage import _StorageCases
from ._conformance_writers import _WriterCases
from ._lifecycle_conformance import LifecycleConformance

__all__ = ["BackendConformance"]


class BackendConformance(_StorageCases, _LiveCases, _FaultAndRaceCases, _WriterCases, LifecycleConformance):
    """Base class of a backend's conformance tests (not collected by itself: its name does not start with Test).

    Its cases come in groups, one module each: the storage contract and read validation, live sessions and torn
    tails, injected failures and races, one writer per session with in-doubt writes and storage-level cases, and
    (from :class:`LifecycleConformance`) deletion, paged listing, retention and compaction; the fixtures and hooks
    a backend overrides are listed in this module's doc.
    """
