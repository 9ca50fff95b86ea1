"""The header cap is on decompressed bytes (issue 36 item 7): a v1 transcript whose CRC-valid header frame pledges
200 MiB (a few hundred KB on disk, under the default ``max_batch_bytes``) is damage for ``load``, ``list_page`` and
``verify``, and the reading process never holds the 200 MiB. Measured in a fresh process (``VmHWM``: its own peak
resident memory), never by time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import zstandard
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl._format.v1_declarations import zstd_declaration

from ._formats import pairs
from ._sessions import storage, turn_batches

BOMB_BYTES = 200 << 20
#: The interpreter and the packages take ~40 MB; decompressing the header would take 200 MiB more.
RSS_BOUND_MB = 100


def _header_bomb() -> bytes:
    """One zstd frame pledging 200 MiB: a header line's start, then spaces (never allocated whole here)."""
    cobj = zstandard.ZstdCompressor(level=3, write_checksum=True).compressobj(size=BOMB_BYTES)
    start = b'{"type":"session","version":2,"id":"bomb"'
    parts = [cobj.compress(start)]
    spaces = b" " * (1 << 20)
    left = BOMB_BYTES - len(start) - 1
    while left:
        chunk = spaces[: min(left, len(spaces))]
        parts.append(cobj.compress(chunk))
        left -= len(chunk)
    parts.append(cobj.compress(b"\n"))
    parts.append(cobj.flush())
    return b"".join(parts)


def _plant(root: Path) -> None:
    backend = JsonlBackend(root)
    st = storage("bomb")

    async def write() -> None:
        for i, batch in enumerate(turn_batches(2)):
            await backend.append_batch(st, batch, i > 0)
        await backend.append_batch(storage("ok"), turn_batches(1)[0], False)

    anyio.run(write)
    path = Path(backend.locate(st.meta).path)
    data = path.read_bytes()
    head = pairs(data, "zstd")[0]
    bomb = _header_bomb()
    path.write_bytes(zstd_declaration(0, 0, bomb) + bomb + data[head.end :])
    assert path.stat().st_size < 1 << 20  # small on disk: a cap on the compressed length passes it


def test_a_header_frame_that_expands_to_200_mib_is_damage_with_bounded_memory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _plant(root)
    cli = str(Path(sys.executable).with_name("dsh-sessions"))
    script = textwrap.dedent(
        f"""
        import json, resource, subprocess, anyio
        from dsh.session_persistence.backend import ListQuery, SessionPersistenceCorruptionError
        from dsh.session_persistence_jsonl import JsonlBackend

        async def main():
            backend = JsonlBackend({str(root)!r})
            out = {{}}
            try:
                await backend.load_stored("bomb")
                out["load"] = "ok"
            except SessionPersistenceCorruptionError:
                out["load"] = "damage"
            out["page"] = [r.id for r in await backend.list_page(ListQuery(limit=10))]
            out["page_all"] = [r.id for r in await backend.list_page(ListQuery())]
            out["damaged"] = [d.session_id for d in await backend.list_damaged()]
            return out

        out = anyio.run(main)
        hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
        out["rss_mb"] = int(hwm.split()[1]) / 1024
        # verify, the installed command, as this small process's only child: the children's peak is its peak (at
        # least this process's size at the fork).
        verify = subprocess.run([{cli!r}, "--root", {str(root)!r}, "verify"], capture_output=True, text=True)
        out["verify"], out["verify_text"] = verify.returncode, verify.stdout + verify.stderr
        out["verify_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(json.dumps(out))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["load"] == "damage", result
    assert result["page"] == ["ok"] and result["page_all"] == ["ok"], result  # left out, the rest still listed
    assert result["damaged"] == ["bomb"], result
    assert result["verify"] == 1 and "bomb" in result["verify_text"], result  # reported as damage
    assert result["rss_mb"] < RSS_BOUND_MB, result
    assert result["verify_rss_mb"] < RSS_BOUND_MB, result
