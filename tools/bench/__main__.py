"""dsh sessions benchmarks: durable write throughput, peers, load, flush barrier, list and size (docs/benchmarks.md).

One process run measures everything, each figure several times (interleaved, so noise hits every system alike),
and reports medians and ratios of medians::

    hatch run bench:run            # full run, peers included (the `bench` env installs them)
    hatch run bench:run --quick    # smoke-sized run, under a minute
    python tools/bench --quick --no-peers --json out.json   # any Python with the workspace packages

Figures: see ``docs/benchmarks.md``. A package run as a directory (``python tools/bench``): this ``__main__`` parses
the options and runs the sections, one module each (``bench_writes``: 1 and 6, ``bench_commits``: 2 and 8,
``bench_load``: 3, ``bench_barrier``: 4 and 5, ``bench_pg``: 7, ``bench_big``: 9, ``bench_loop``: 10,
``bench_sealed``: 11, ``bench_fleet``: 12, ``bench_reads``: ``--reads-only``; ``bench_targets``: the table of
issue #24's targets a full run ends with); Python puts this directory first on ``sys.path`` when it runs it, which
is how they import each other.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from typing import Any

import anyio
from bench_barrier import flush_section, list_section
from bench_big import big_child, big_session_section
from bench_commits import _many_child, commit_section, many_sessions_section
from bench_common import FULL, QUICK, Report, machine
from bench_fleet import fleet_child, fleet_section
from bench_fleet_pg import fleet_pg_child, fleet_pg_section
from bench_load import _load_child, load_section
from bench_loop import loop_section
from bench_peers import peer_status
from bench_pg import _pg_writer_child, postgres_section
from bench_reads import reads_section, reload_figures, sealed_reload_figures
from bench_sealed import sealed_section
from bench_targets import print_targets, target_rows
from bench_writes import size_section, write_section


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    cfg = QUICK if args.quick else FULL
    if args.reps:
        cfg.reps = args.reps
    scratch = tempfile.mkdtemp(prefix="dsh-bench-", dir=args.dir)
    report = Report()
    f = report.figures
    f["machine"] = machine()
    f["mode"] = "quick" if args.quick else "full"
    print(f"dsh sessions bench ({f['mode']}): {f['machine']}", flush=True)
    try:
        if args.fleet_only:
            run_fleet(args, report, scratch)
            f["table"] = [list(r) for r in report.rows]
            return f
        if args.fleet_pg_only:
            run_fleet_pg(args, report)
            f["table"] = [list(r) for r in report.rows]
            return f
        if args.reads_only:
            await reads_section(args, cfg, report, scratch)
            f["table"] = [list(r) for r in report.rows]
            print_targets([r for r in target_rows(f) if r.figure.startswith("#35") and r.value is not None])
            return f
        if args.commits_only:
            f["peers"] = (
                peer_status() if not args.no_peers else dict.fromkeys(("sqlitesession", "langgraph"), "skipped")
            )
            await commit_section(args, cfg, report, scratch)
            await loop_section(cfg, report, scratch)
            f["table"] = [list(r) for r in report.rows]
            return f
        written = await write_section(args, cfg, report, scratch)
        # Section 1's peers leave hundreds of MB of dirty pages (LangGraph alone ~0.5 GB); their writeback should not
        # overlap the timed sections that follow. (Session 11's full run trailed its section runs: reload 1.42 vs
        # 1.15, 10 MB load 0.72 vs 0.84. This writeback is one suspect, not a proven cause.)
        settle_disk()
        await commit_section(args, cfg, report, scratch)
        await loop_section(cfg, report, scratch)
        size_section(report, written)
        settle_disk()
        await load_section(cfg, report, scratch)
        # Issue #35's reload rows again with the reads section's repetitions (section 2 reloads once per rep).
        print("\nreads (issue #35's reload figures, beside section 2's)", flush=True)
        await reload_figures(cfg, report, scratch, key="reads")
        if not args.no_sealed:
            await sealed_section(cfg, report, scratch)
            await sealed_reload_figures(cfg, report, scratch, key="reads_sealed")
        await flush_section(cfg, report, scratch)
        await list_section(cfg, report, scratch)

        # 7. PostgreSQL backend
        await postgres_section(args, cfg, written.ops, report, scratch)

        if not args.no_many:
            many_sessions_section(cfg, report, scratch)

        if args.big:
            big_session_section(report, scratch)

        if not args.no_fleet:
            run_fleet(args, report, scratch)
            if not args.no_postgres:
                run_fleet_pg(args, report)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    f["table"] = [list(r) for r in report.rows]
    if not args.quick:
        rows = target_rows(f)
        print_targets(rows)
        f["targets"] = [{"figure": r.figure, "target": r.target, "value": r.value, "verdict": r.verdict} for r in rows]
    return f


def settle_disk() -> None:
    """Write back every dirty page now (``sync``), so a section's own writes are not paid for by the next one."""
    os.sync()


def run_fleet(args: argparse.Namespace, report: Report, scratch: str) -> None:
    """Section 12 with this run's sizes: quick is a smoke (N = 3, times scaled by 0.1, one process per loop)."""
    peers = not args.no_peers and peer_status()["sqlitesession"] == "ok"
    if args.quick and not args.fleet_sessions:
        fleet_section(report, scratch, sessions=(3,), seconds=0.25, scale=0.1, one_process=True, peers=peers)
        return
    sessions = tuple(int(n) for n in (args.fleet_sessions or "1,100,1000").split(","))
    fleet_section(
        report,
        scratch,
        sessions=sessions,
        seconds=args.fleet_seconds,
        peers=peers,
        window_probe=args.fleet_window_probe,
    )


def run_fleet_pg(args: argparse.Namespace, report: Report) -> None:
    """Section 12b (fleet on PostgreSQL) with this run's sizes: quick is a smoke (N = 3, times scaled by 0.1)."""
    if args.quick and not args.fleet_sessions:
        fleet_pg_section(report, sessions=(3,), seconds=0.25, scale=0.1)
        return
    sessions = tuple(int(n) for n in (args.fleet_sessions or "10,100,1000").split(","))
    fleet_pg_section(report, sessions=sessions, seconds=args.fleet_seconds, rounds=args.fleet_pg_rounds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/bench", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="smoke-sized run (well under a minute)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON to FILE")
    parser.add_argument("--no-peers", action="store_true", help="skip SQLiteSession and LangGraph")
    parser.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL backend (section 7)")
    parser.add_argument(
        "--postgres-dsn",
        metavar="DSN",
        help="PostgreSQL server to measure (default: a throwaway cluster when initdb/pg_ctl are found)",
    )
    parser.add_argument("--reps", type=int, default=0, help="repetitions per measurement (default: 5, quick: 2)")
    parser.add_argument("--dir", default=None, help="scratch directory parent (default: the system temp dir)")
    parser.add_argument("--no-sealed", action="store_true", help="skip the encrypted-session ratios (section 11)")
    parser.add_argument("--no-many", action="store_true", help="skip the many-sessions load (section 8)")
    parser.add_argument(
        "--commits-only",
        action="store_true",
        help="only the commit workload and the agent loop (sections 2 and 10)",
    )
    parser.add_argument(
        "--reads-only",
        action="store_true",
        help="only issue #35's reads: reload, load, sealed JSONL reload, sealed PostgreSQL load (bench_reads)",
    )
    parser.add_argument(
        "--big", action="store_true", help="also the 1,000,000-event session: bounded-memory reads (section 9)"
    )
    parser.add_argument("--no-fleet", action="store_true", help="skip the fleet of live sessions (section 12)")
    parser.add_argument("--fleet-only", action="store_true", help="only the fleet of live sessions (section 12)")
    parser.add_argument("--fleet-sessions", metavar="N,N", help="fleet sizes (default 1,100,1000)")
    parser.add_argument("--fleet-seconds", type=float, default=10.0, help="seconds per fleet cell (default 10)")
    parser.add_argument(
        "--fleet-window-probe",
        action="store_true",
        help="also dsh with its write-behind window pushed past the cell (only barriers write): what the window costs",
    )
    parser.add_argument(
        "--targets-from",
        metavar="FILE",
        help="print the issue #24 targets of an earlier --json FILE, then exit",
    )
    parser.add_argument(
        "--fleet-pg-only", action="store_true", help="only the fleet on PostgreSQL (section 12b; N default 10,100,1000)"
    )
    parser.add_argument("--fleet-pg-rounds", type=int, default=2, help="interleaved rounds of section 12b (default 2)")
    parser.add_argument("--_fleet-child", help=argparse.SUPPRESS)
    parser.add_argument("--_fleet-pg-child", help=argparse.SUPPRESS)
    parser.add_argument("--_big-child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--_load-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--_many-child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--_pg-writer-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.targets_from:
        with open(args.targets_from) as fh:
            print_targets(target_rows(json.load(fh)))
        return 0
    if args._pg_writer_child:
        _pg_writer_child(*args._pg_writer_child)
        return 0
    if args._load_child:
        _load_child(*args._load_child)
        return 0
    if args._many_child:
        _many_child(*args._many_child)
        return 0
    if args._fleet_child:
        fleet_child(args._fleet_child)
        return 0
    if args._fleet_pg_child:
        fleet_pg_child(args._fleet_pg_child)
        return 0
    if args._big_child:
        big_child(*args._big_child)
        return 0
    figures = anyio.run(main_async, args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
