"""``--reads-only``: issue #35's read figures alone (reload, load, sealed reads), for quick iteration on the read path.

A module of the ``tools/bench`` package (``python tools/bench`` runs ``__main__.py``). Each session is written once
(the writes are not what is measured here), then read over and over, the system and its baseline interleaved rep
by rep so noise hits both alike. The figures land under the same keys as a full run's, so the targets table reads
them unchanged:

* reload: the commit workload's session (section 2) reloaded cold through the coordinator vs a raw decode of the
  raw floor's file of the same events (``commit.ratio.reload_dsh_vs_raw``), and the resume after a preview;
* load: section 3 as it is (``load.<size>.ratio``);
* sealed JSONL reload: the commit workload's session written by a sealed and a plaintext backend, reloaded
  (``sealed.ratio.reload_sealed_vs_plaintext``);
* sealed PostgreSQL load: section 7's load session, sealed and plaintext (``postgres.sealed.load.ratio``), on a
  throwaway cluster (or ``--postgres-dsn``) unless ``--no-postgres``.

Reloads are cheap (tens of milliseconds), so they run :data:`RELOAD_REPS_FACTOR` times the run's repetitions.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
from typing import Any

from bench_commits import commit_workload
from bench_common import Config, Report, _fmt, _ratio, median
from bench_load import load_raw, load_section
from bench_pg_cluster import (
    _postgres,
    load_full_stack,
    open_server,
    pg_drop_schemas,
    write_pg_session,
)
from bench_sealed import KINDS, backend_for
from bench_workload import SESSION_ID
from bench_writes import _dsh_reload, _dsh_resume_after_preview, full_stack_write, run_raw

RELOAD_REPS_FACTOR = 4


async def reads_section(args: argparse.Namespace, cfg: Config, report: Report, scratch: str) -> None:
    """The read figures of issue #35 only: reload, load, sealed JSONL reload and sealed PostgreSQL load."""
    await reload_figures(cfg, report, scratch)
    await load_section(cfg, report, scratch)
    if not args.no_sealed:
        await sealed_reload_figures(cfg, report, scratch)
        if not args.no_postgres:
            await postgres_sealed_load_figures(args, cfg, report)


async def reload_figures(cfg: Config, report: Report, scratch: str, key: str = "commit") -> None:
    """The commit workload written once by dsh and by the raw floor, then reloaded: dsh/raw, and resume/reload.

    ``key``: where the figures go (a full run keeps section 2's own ``commit`` figures and puts these under
    ``reads``, which the targets table prefers: 4x the repetitions of section 2's single reload per rep)."""
    f = report.figures
    ops = commit_workload(cfg.turns)
    reps = cfg.reps * RELOAD_REPS_FACTOR
    print(f"\nreads: reload of the {cfg.turns}-turn commit workload, dsh vs raw decode; median of {reps}", flush=True)
    dsh_root = os.path.join(scratch, "reads-reload-dsh")
    raw_root = os.path.join(scratch, "reads-reload-raw")
    _seconds, events = await full_stack_write(ops, backend_for("plaintext", dsh_root))
    run_raw(ops, raw_root)
    raw_path = os.path.join(raw_root, "raw.jsonl.zstd")
    dsh_times: list[float] = []
    raw_times: list[float] = []
    resume_times: list[float] = []
    for _ in range(reps):
        gc.collect()
        dsh_times.append(await _dsh_reload(dsh_root, True, events))
        gc.collect()
        raw_times.append(load_raw(raw_path)[0])
        gc.collect()
        resume_times.append(await _dsh_resume_after_preview(dsh_root, True, events))
    shutil.rmtree(dsh_root, ignore_errors=True)
    shutil.rmtree(raw_root, ignore_errors=True)
    reload = {"dsh": median(dsh_times) * 1000, "raw": median(raw_times) * 1000}
    resume_ms = median(resume_times) * 1000
    ratios = {
        "reload_dsh_vs_raw": _ratio(reload["dsh"], reload["raw"]),
        "reload_dsh_vs_raw_paired_median": median([a / b for a, b in zip(dsh_times, raw_times, strict=True)]),
        "resume_after_preview_vs_reload": _ratio(resume_ms, reload["dsh"]),
    }
    f[key] = {"events": events, "reload_ms": reload, "resume_after_preview_ms": resume_ms, "ratio": ratios}
    for name in ("dsh", "raw"):
        report.row(f"reload ms [{name}]", _fmt(reload[name], ".2f"))
    report.row("reload dsh/raw (target <= 1.2)", _fmt(ratios["reload_dsh_vs_raw"], ".2f"))
    report.row("reload dsh/raw, paired (median)", _fmt(ratios["reload_dsh_vs_raw_paired_median"], ".2f"))
    report.row("resume after a preview ms [dsh]", _fmt(resume_ms, ".2f"))
    report.row(
        "resume after a preview / cold reload (target <= 0.2)", _fmt(ratios["resume_after_preview_vs_reload"], ".2f")
    )


async def _reload_kind(kind: str, root: str, expected: int) -> float:
    seconds, loaded = await load_full_stack(backend_for(kind, root), SESSION_ID)
    if loaded != expected:
        raise AssertionError(f"{kind} reload returned {loaded} events, expected {expected}")
    return seconds


async def sealed_reload_figures(cfg: Config, report: Report, scratch: str, key: str = "sealed") -> None:
    """Section 11's reload ratio: the commit workload written once sealed and once plaintext, reloaded in turn.

    ``key``: as for :func:`reload_figures` (a full run: ``reads_sealed``, beside section 11's own figures)."""
    f = report.figures
    ops = commit_workload(cfg.turns)
    reps = cfg.reps * RELOAD_REPS_FACTOR
    print(f"\nreads: sealed JSONL reload vs plaintext (AES-256-GCM, zstd both); median of {reps}", flush=True)
    roots = {kind: os.path.join(scratch, f"reads-sealed-{kind}") for kind in KINDS}
    counts = {kind: (await full_stack_write(ops, backend_for(kind, roots[kind])))[1] for kind in KINDS}
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(reps):
        for kind in KINDS:
            gc.collect()
            times[kind].append(await _reload_kind(kind, roots[kind], counts[kind]))
    for root in roots.values():
        shutil.rmtree(root, ignore_errors=True)
    reload = {kind: median(times[kind]) * 1000 for kind in KINDS}
    ratio = _ratio(reload["sealed"], reload["plaintext"])
    paired = median([s / p for s, p in zip(times["sealed"], times["plaintext"], strict=True)])
    f[key] = {"reload_ms": reload, "ratio": {"reload_sealed_vs_plaintext": ratio, "reload_paired": paired}}
    for kind in KINDS:
        report.row(f"reload ms [{kind}]", _fmt(reload[kind], ".2f"))
    report.row("reload sealed/plaintext (target <= 1.15)", _fmt(ratio, ".2f"))
    report.row("reload sealed/plaintext, paired (median)", _fmt(paired, ".2f"))


async def postgres_sealed_load_figures(args: argparse.Namespace, cfg: Config, report: Report) -> None:
    """Section 7's sealed load ratio: the first load size written sealed and plaintext, loaded in turn (MB/s)."""
    f = report.figures
    pg: dict[str, Any] = {"status": "ok"}
    f["postgres"] = pg
    label, target = cfg.load_sizes[0]
    print(f"\nreads: sealed PostgreSQL load vs plaintext ({label}); median of {cfg.reps}", flush=True)
    dsn, cluster, reason = open_server(args.postgres_dsn)
    if reason is not None or dsn is None:
        pg["status"] = reason or "unavailable"
        report.row("load MB/s postgres sealed/plaintext", "unavailable", pg["status"])
        return
    tag = f"bench_reads_{os.getpid()}"
    schemas = {kind: f"{tag}_{kind}" for kind in KINDS}
    session_id = f"load-{label}"
    try:
        written = {
            kind: await write_pg_session(dsn, schemas[kind], session_id, target, sealed=kind == "sealed")
            for kind in KINDS
        }
        n_events, raw = written["plaintext"]
        times: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _ in range(cfg.reps):
            for kind in KINDS:
                gc.collect()
                backend = _postgres(dsn, schemas[kind], sealed=kind == "sealed")
                seconds, loaded = await load_full_stack(backend, session_id, warm=True)
                if loaded != n_events:
                    raise AssertionError(f"{kind} postgres load returned {loaded} events, expected {n_events}")
                times[kind].append(seconds)
    finally:
        if cluster is None:
            pg_drop_schemas(dsn, list(schemas.values()))
        else:
            cluster.close()
    mb_s = {kind: raw / 1e6 / median(times[kind]) for kind in KINDS}
    ratio = _ratio(mb_s["sealed"], mb_s["plaintext"])
    pg["sealed"] = {"load": {**mb_s, "ratio": ratio}}
    for kind in KINDS:
        report.row(f"load MB/s [postgres {kind}] ({label}: {raw / 1e6:.1f} MB JSON)", _fmt(mb_s[kind], ",.1f"))
    report.row("load MB/s postgres sealed/plaintext (target >= 0.7)", _fmt(ratio, ".2f"))
