"""The backend conformance kit run against JsonlBackend, for both encodings."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import ClassVar

import pytest
from dsh.session_persistence.backend import SessionBackend
from dsh.session_persistence.testing import BackendConformance
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl._format.v1 import BufferSource, encode_declared_batch, walk_declared

# A batch whose write never finished: what a crash in the middle of an append leaves behind.
_TORN_LINE = b'{"type":"turn/end","seq":%d,"time":0,"data":{}}\n'


@pytest.fixture(params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


class TestJsonlConformance(BackendConformance):
    lease_holder_names_pid: ClassVar[bool] = True
    lifecycle_required = True

    @pytest.fixture
    def backend_factory(self, tmp_path: Path, compression: str) -> object:
        return lambda: JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]

    @pytest.fixture
    def process_backend_factory(self, tmp_path: Path, compression: str) -> object:
        return functools.partial(JsonlBackend, tmp_path / "root", compression=compression)

    @pytest.fixture
    def other_backend_factory(self, tmp_path: Path, compression: str) -> object:
        return lambda: JsonlBackend(tmp_path / "other-root", compression=compression)  # type: ignore[arg-type]

    async def set_activity(self, backend: SessionBackend, session_id: str, updated_at_ms: int) -> None:
        assert isinstance(backend, JsonlBackend)
        matches = [p for p in Path(backend.root).rglob("session.jsonl*") if p.parent.name == session_id]  # noqa: ASYNC240
        assert len(matches) == 1, matches
        os.utime(matches[0], ns=(updated_at_ms * 1_000_000, updated_at_ms * 1_000_000))

    async def inject_torn_tail(self, backend: SessionBackend, session_id: str) -> None:
        assert isinstance(backend, JsonlBackend)
        matches = [p for p in Path(backend.root).rglob("session.jsonl*") if p.parent.name == session_id]  # noqa: ASYNC240
        assert len(matches) == 1, matches
        path = matches[0]
        # Half of a real declared batch (declaration + data): exactly what an interrupted write leaves.
        compression = "zstd" if path.suffix == ".zstd" else "none"
        seq = len(walk_declared(BufferSource(path.read_bytes()), compression, str(path), 1 << 20).events)
        pair = encode_declared_batch(compression, seq, 1, _TORN_LINE % seq)
        fragment = pair[: len(pair) // 2]
        with path.open("ab") as fh:
            fh.write(fragment)
