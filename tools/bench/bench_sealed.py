"""Section 11 of ``tools/bench``: encrypted sessions (issue #28), as ratios to the plaintext backend of the same run.

A module of the ``tools/bench`` package (``python tools/bench`` runs ``__main__.py``). Both backends are
``JsonlBackend(compression="zstd")``; the sealed one has ``encryption=StaticKeyProvider(...)`` (AES-256-GCM, a fixed
bench key). Plaintext and sealed runs alternate, rep by rep, so noise hits both alike:

* commit: the commit workload of section 2 (three durable points per turn) through Host + SessionStore +
  coordinator, ms per durable commit, and the cold reload of the written session;
* load: the smaller load file of section 3 (10 MB of JSON; ``--quick``: 1 MB), re-written through each backend's
  own ``append_batch`` in batches of :data:`LOAD_BATCH_EVENTS` events (the same batches for both), loaded through
  the coordinator: MB/s of raw JSON.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from typing import Any

from bench_commits import commit_count, commit_workload
from bench_common import Config, Report, WriteRun, _fmt, _ratio, _tree_size, median
from bench_load import write_session_file
from bench_workload import SESSION_ID
from bench_writes import full_stack_write
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
from dsh.session_persistence.backend import StorageMetadata
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl.encryption import StaticKeyProvider

#: A fixed bench key (32 bytes), never used for anything but this measurement.
BENCH_KEYS = StaticKeyProvider("bench", {"bench": bytes(range(32))})
LOAD_BATCH_EVENTS = 64
KINDS = ("plaintext", "sealed")


def backend_for(kind: str, root: str) -> Any:
    """A zstd ``JsonlBackend`` over ``root``; sealed with the bench key when ``kind`` is ``"sealed"``."""
    return JsonlBackend(root, compression="zstd", encryption=BENCH_KEYS if kind == "sealed" else None)


async def _load(kind: str, root: str, session_id: str) -> tuple[float, int]:
    host = Host()
    SessionStore(host)
    async with PersistenceCoordinator(host, backend_for(kind, root)) as coordinator:
        start = time.perf_counter()
        view = await coordinator.load(session_id)
        seconds = time.perf_counter() - start
    return seconds, len(view.events)


async def _commit_run(kind: str, ops: list[Any], where: str) -> WriteRun:
    seconds, events = await full_stack_write(ops, backend_for(kind, where))
    reload_s, loaded = await _load(kind, where, SESSION_ID)
    if loaded != events:
        raise AssertionError(f"{kind} reload returned {loaded} events, expected {events}")
    return WriteRun(seconds, events, _tree_size(where), reload_s)


async def _copy(source: str, session_id: str, kind: str, root: str) -> int:
    """The session at ``source`` re-written under ``root`` by a ``kind`` backend, in equal batches; its event count."""
    stored = await backend_for("plaintext", source).load_stored(session_id)
    assert stored is not None
    storage = StorageMetadata(stored.meta, stored.inherited_event_count)
    target = backend_for(kind, root)
    events = stored.events
    for first in range(0, len(events), LOAD_BATCH_EVENTS):
        await target.append_batch(storage, events[first : first + LOAD_BATCH_EVENTS], first > 0)
    return len(events)


async def sealed_section(cfg: Config, report: Report, scratch: str) -> None:
    """11. Encrypted sessions: commit, reload and load on a sealed backend, each as a ratio to plaintext."""
    f = report.figures
    ops = commit_workload(cfg.turns)
    commits = commit_count(ops)
    print(f"\n11. encrypted sessions (AES-256-GCM) vs plaintext, zstd both; median of {cfg.reps}", flush=True)
    runs: dict[str, list[WriteRun]] = {kind: [] for kind in KINDS}
    for rep in range(cfg.reps):
        for kind in KINDS:
            where = os.path.join(scratch, f"sealed-commit-{kind}-{rep}")
            gc.collect()
            runs[kind].append(await _commit_run(kind, ops, where))
            shutil.rmtree(where, ignore_errors=True)
    per_commit = {kind: median([r.seconds / commits for r in runs[kind]]) * 1000 for kind in KINDS}
    reload = {kind: median([r.reload_s or 0.0 for r in runs[kind]]) * 1000 for kind in KINDS}
    label, target = cfg.load_sizes[0]  # the smaller size: the copy pays one fsync per batch
    source = os.path.join(scratch, "sealed-load-source")
    session_id = f"sealed-load-{label}"
    _path, n_events, raw = write_session_file(source, session_id, target)
    roots = {kind: os.path.join(scratch, f"sealed-load-{kind}") for kind in KINDS}
    for kind in KINDS:
        copied = await _copy(source, session_id, kind, roots[kind])
        if copied != n_events:
            raise AssertionError(f"{kind} copy holds {copied} events, expected {n_events}")
    shutil.rmtree(source, ignore_errors=True)
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(cfg.reps):
        for kind in KINDS:
            gc.collect()
            seconds, loaded = await _load(kind, roots[kind], session_id)
            if loaded != n_events:
                raise AssertionError(f"{kind} load returned {loaded} events, expected {n_events}")
            times[kind].append(seconds)
    load_mb_s = {kind: raw / 1e6 / median(times[kind]) for kind in KINDS}
    file_bytes = {kind: _tree_size(roots[kind]) for kind in KINDS}
    for root in roots.values():
        shutil.rmtree(root, ignore_errors=True)
    ratio = {
        "commit_sealed_vs_plaintext": _ratio(per_commit["sealed"], per_commit["plaintext"]),
        "reload_sealed_vs_plaintext": _ratio(reload["sealed"], reload["plaintext"]),
        "load_mb_per_s_sealed_vs_plaintext": _ratio(load_mb_s["sealed"], load_mb_s["plaintext"]),
        "bytes_sealed_vs_plaintext": _ratio(file_bytes["sealed"], file_bytes["plaintext"]),
    }
    f["sealed"] = {
        "commits": commits,
        "ms_per_commit": per_commit,
        "reload_ms": reload,
        "load": {"label": label, "events": n_events, "raw_json_bytes": raw, "mb_per_s": load_mb_s},
        "bytes": file_bytes,
        "ratio": ratio,
    }
    for kind in KINDS:
        report.row(f"ms per durable commit [{kind}]", _fmt(per_commit[kind], ".3f"))
    report.row("commit sealed/plaintext", _fmt(ratio["commit_sealed_vs_plaintext"], ".2f"))
    for kind in KINDS:
        report.row(f"reload ms [{kind}]", _fmt(reload[kind], ".2f"))
    report.row("reload sealed/plaintext (target <= 1.15)", _fmt(ratio["reload_sealed_vs_plaintext"], ".2f"))
    tag = f"{label}: {raw / 1e6:.1f} MB JSON"
    for kind in KINDS:
        report.row(f"load MB/s [{kind}] ({tag})", _fmt(load_mb_s[kind], ".1f"))
    report.row("load MB/s sealed/plaintext", _fmt(ratio["load_mb_per_s_sealed_vs_plaintext"], ".2f"))
    report.row("bytes on disk sealed/plaintext", _fmt(ratio["bytes_sealed_vs_plaintext"], ".3f"))
