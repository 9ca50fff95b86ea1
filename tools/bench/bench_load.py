"""Section 3: a session file in the backend's exact format, loaded through the coordinator vs raw decode."""

from __future__ import annotations

import gc
import io
import json
import os
import shutil
import subprocess
import sys
import time

import anyio
import anyio.lowlevel
import anyio.to_thread
import msgspec
import zstandard
from bench_common import ENTRY, Config, Report, _jsonl, _size_of, median
from bench_workload import CWD, batches, raw_json_bytes, workload
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
from dsh.session_persistence.backend import SessionHeader, StorageMetadata, pack_chunk_rows
from dsh.session_persistence_jsonl.format import encode_header_batch, encode_storage_batch, transcript_path

# --------------------------------------------------------------------------------------------------------------
# Load: a session file written in the backend's format, loaded through the coordinator vs raw decode


def write_session_file(
    root: str, session_id: str, target_raw: int, target_events: int | None = None
) -> tuple[str, int, int]:
    """Write a JSONL/zstd transcript (header frame + one frame per durable point, chunk rows packed) directly.

    Same bytes the backend writes (the JSONL format face, ``pack_chunk_rows``, declared batches of log format v1),
    without the per-batch fsync, so a 100 MB session is built in seconds. Returns (path, events, raw JSON bytes).
    With ``target_events`` it stops at the first batch boundary at or past that many events instead.
    """
    header = SessionHeader(id=session_id, created_at=1_700_000_000_000, cwd=CWD)
    path = transcript_path(root, CWD, session_id, "zstd")
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    encoder = msgspec.json.Encoder()
    raw = 0
    events = 0
    turn = 1
    with open(path, "wb") as fh:
        fh.write(encode_header_batch(StorageMetadata(header, 0), "zstd"))
        seq_offset = 0
        while (raw < target_raw) if target_events is None else (events < target_events):
            chunk_ops = workload(50, seed=turn, first_turn=turn)
            for batch in batches(chunk_ops):
                for event in batch:
                    event["seq"] += seq_offset
                    if "sourceEventSeqs" in event:
                        event["sourceEventSeqs"] = [s + seq_offset for s in event["sourceEventSeqs"]]
                raw += raw_json_bytes(batch)
                events += len(batch)
                rows = pack_chunk_rows(batch)
                plaintext = b"\n".join(encoder.encode(r) for r in rows) + b"\n"
                fh.write(encode_storage_batch(batch[0]["seq"], len(batch), plaintext, "zstd"))
            seq_offset = events
            turn += 50
    return path, events, raw


async def load_dsh(root: str, session_id: str) -> tuple[float, int]:
    host = Host()
    SessionStore(host)
    async with PersistenceCoordinator(host, _jsonl(root)) as coordinator:
        start = time.perf_counter()
        view = await coordinator.load(session_id)
        seconds = time.perf_counter() - start
    return seconds, len(view.events)


def load_raw(path: str) -> tuple[float, int]:
    """Read the file, decompress every frame, msgspec-decode every line (rows stay rows: no event semantics)."""
    start = time.perf_counter()
    with open(path, "rb") as fh:
        data = fh.read()
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    plaintext = reader.read()
    values = msgspec.json.Decoder().decode_lines(plaintext)
    seconds = time.perf_counter() - start
    return seconds, len(values)


def _load_child(root: str, session_id: str) -> None:
    """Subprocess entry: load once under tracemalloc and print the peak and the RSS growth as JSON."""
    import resource
    import tracemalloc

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    _seconds, events = anyio.run(load_dsh, root, session_id)
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"tracemalloc_peak": peak, "rss_growth": (rss_after - rss_before) * 1024, "events": events}))


def load_peak_memory(root: str, session_id: str) -> dict[str, int]:
    cmd = [sys.executable, ENTRY, "--_load-child", root, session_id]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    result: dict[str, int] = json.loads(out.strip().splitlines()[-1])
    return result


async def load_section(cfg: Config, report: Report, scratch: str) -> None:
    """3. Load: MB/s of ``PersistenceCoordinator.load`` vs raw decompress + decode, and peak memory."""
    f = report.figures
    # 3. load
    print(f"\n3. load (coordinator load vs raw decompress + msgspec decode); median of {cfg.reps}", flush=True)
    f["load"] = {}
    for label, target in cfg.load_sizes:
        root = os.path.join(scratch, f"load-{label}")
        session_id = f"load-{label}"
        path, n_events, raw = write_session_file(root, session_id, target)
        dsh_times: list[float] = []
        raw_times: list[float] = []
        for _ in range(cfg.reps):
            gc.collect()
            seconds, loaded = await load_dsh(root, session_id)
            if loaded != n_events:
                raise AssertionError(f"load returned {loaded} events, expected {n_events}")
            dsh_times.append(seconds)
            gc.collect()
            raw_times.append(load_raw(path)[0])
        memory = load_peak_memory(root, session_id)
        entry = {
            "raw_json_bytes": raw,
            "file_bytes": _size_of([path]),
            "events": n_events,
            "mb_per_s": {"dsh": raw / 1e6 / median(dsh_times), "raw": raw / 1e6 / median(raw_times)},
            "tracemalloc_peak_bytes": memory["tracemalloc_peak"],
            "rss_growth_bytes": memory["rss_growth"],
            "peak_vs_raw_json": memory["tracemalloc_peak"] / raw,
        }
        entry["ratio"] = entry["mb_per_s"]["dsh"] / entry["mb_per_s"]["raw"]  # type: ignore[index]
        f["load"][label] = entry
        shutil.rmtree(root, ignore_errors=True)
        tag = f"{label}: {raw / 1e6:.1f} MB JSON"
        report.row(f"load MB/s [dsh] ({tag})", f"{entry['mb_per_s']['dsh']:.1f}")  # type: ignore[index]
        report.row(f"load MB/s [raw] ({tag})", f"{entry['mb_per_s']['raw']:.1f}")  # type: ignore[index]
        report.row(f"load ratio dsh/raw ({label}, target >= 0.8)", f"{entry['ratio']:.2f}")
        report.row(
            f"load peak memory / raw JSON ({label}, target < 4)",
            f"{entry['peak_vs_raw_json']:.2f}",
            f"tracemalloc peak {memory['tracemalloc_peak'] / 1e6:.0f} MB, "
            f"RSS growth {memory['rss_growth'] / 1e6:.0f} MB",
        )
    largest = cfg.load_sizes[-1][0]
    f["load_mb_per_s"] = dict(f["load"][largest]["mb_per_s"])  # a copy: section 7 adds "postgres"
    f["load_ratio"] = f["load"][largest]["ratio"]
    f["load_peak_vs_raw_json"] = f["load"][largest]["peak_vs_raw_json"]
