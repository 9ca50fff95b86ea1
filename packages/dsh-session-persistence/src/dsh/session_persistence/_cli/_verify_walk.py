"""The ``verify`` walk: every stored artifact, readable or not, so nothing damaged hides behind "no sessions".

``list`` (the backend's header listing) leaves out what it cannot read: a zero-length transcript, one without a
header, a file whose name is not a session id. ``verify`` must report exactly those, so with a backend that can
enumerate its artifacts (``SupportsArtifactScan``) it examines every artifact by name instead.
"""

from __future__ import annotations

import contextlib

from .._backends.protocol import SupportsArtifactScan
from .._model.errors import SessionNotFoundError
from ._context import Stack
from ._examine import SessionReport, examine, file_stat
from ._io import Io
from ._output import Progress
from ._walk import walk

__all__ = ["verify_walk"]


async def verify_walk(stack: Stack, io: Io) -> list[SessionReport]:
    """Examine every artifact (read-only), newest first by creation time, unreadable ones included."""
    backend = stack.backend
    if not isinstance(backend, SupportsArtifactScan):
        return await walk(stack, io, "verifying sessions")
    artifacts = await backend.list_artifacts()
    progress = Progress(io.err, "verifying sessions", len(artifacts))
    reports: list[SessionReport] = []
    try:
        for done, artifact in enumerate(artifacts, 1):
            report: SessionReport | None
            if artifact.session_id is None:
                report = SessionReport(
                    id=artifact.location,
                    status="corrupt",
                    message=f"cannot read {artifact.location}: its name does not name a session in this layout",
                )
            else:
                report = None
                with contextlib.suppress(SessionNotFoundError):  # deleted since the scan: not an error
                    report = await examine(stack, artifact.session_id)
            if report is None:
                progress.update(done)
                continue
            if report.location is None:
                report.location = artifact.location
                report.size, report.mtime_ms = file_stat(artifact.location)
            reports.append(report)
            progress.update(done)
    finally:
        progress.done()
    reports.sort(key=lambda r: (r.header.created_at if r.header is not None else 0, r.id), reverse=True)
    return reports
