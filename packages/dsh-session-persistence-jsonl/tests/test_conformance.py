"""The backend conformance kit run against JsonlBackend, for both encodings."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import ClassVar

import msgspec
import pytest
from dsh.session_persistence.backend import ListQuery, SessionBackend
from dsh.session_persistence.testing import WORK, BackendConformance, ConformanceRig, meta, one_turn_log, simple_turn
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl._files import activity, activity_list
from dsh.session_persistence_jsonl._files.activity import Entry
from dsh.session_persistence_jsonl._format.v1 import BufferSource, encode_declared_batch, walk_declared

#: The kit's fixed "now" (2026-01-31T00:00:00Z) and a day, in milliseconds.
NOW_MS = 1_769_817_600_000
DAY_MS = 86_400_000
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
        # The activity a listing reports is the log's own last event time, which the activity index caches while
        # the transcript's stat is unchanged: the cache is told the time (the events stay as the kit wrote them),
        # and the file's mtime is left alone (it plays no part).
        path = matches[0]
        await backend.list_page(ListQuery(limit=1))  # the index exists
        snap = activity.load(backend.root, backend.compression, None)
        assert snap is not None
        entries = {e.rel: e for e in snap.all_entries()}
        st, rel = path.stat(), f"{path.parent.parent.name}/{path.parent.name}"
        old = entries[rel]
        entries[rel] = Entry(st.st_mtime_ns, st.st_size, st.st_ino, updated_at_ms, old.dir_ino, old.project, old.name)
        activity.write(backend.root, snap.state, list(entries.values()), activity_list._sort_key, snap.lock_inodes())

    async def test_compact_does_not_count_as_activity(self, conformance: ConformanceRig) -> None:
        """The kit's case with the activity in the log itself: ``set_activity`` can only tell the index's cache,
        which a compaction's new file rightly drops; the compacted log keeps its last event, so its activity."""
        at = NOW_MS - DAY_MS
        events = [msgspec.structs.replace(e, time=at) for e in [*one_turn_log(), *simple_turn(6, 2)]]
        async with conformance.open() as p:
            await p.persistence.create(meta("old", WORK))
            await p.persistence.append("old", events)
        async with conformance.open() as p:
            await p.persistence.compact("old")
            (row,) = (await p.persistence.list_page()).entries
        assert row.updated_at == at

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
