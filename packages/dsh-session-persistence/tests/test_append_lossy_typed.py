"""A non-JSON payload is refused with the same typed error on the coordinator's ``append`` path as on the live
path (``NotLosslessJsonError``, a ``TypeError``), before anything is written."""

from __future__ import annotations

import pytest
from dsh.session_persistence import Host, MemoryBackend, NotLosslessJsonError, PersistenceCoordinator, SessionStore
from dsh.session_persistence.testing import WORK, meta, turn_start

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("payload", [{"x": {1, 2}}, {"x": object()}, {"x": float("nan")}])
async def test_coordinator_append_refuses_a_lossy_payload_typed_like_the_live_path(payload: dict[str, object]) -> None:
    backend = MemoryBackend()
    async with PersistenceCoordinator(Host(), backend) as persistence:
        await persistence.create(meta("cold", WORK))
        await persistence.append("cold", [turn_start(0, 1)])
        lossy = {"type": "user/message", "seq": 1, "time": 1, "data": payload}
        with pytest.raises(NotLosslessJsonError, match=r"at \$"):
            await persistence.append("cold", [lossy])
        assert len((await persistence.read_from("cold", 0)).events) == 1  # nothing was written

    host = Host()
    store = SessionStore(host)
    async with PersistenceCoordinator(host, MemoryBackend()):
        session = store.create("live", meta=meta("live", WORK))
        with pytest.raises(NotLosslessJsonError):
            session.append("user/message", payload)
        store.dispose(session)
