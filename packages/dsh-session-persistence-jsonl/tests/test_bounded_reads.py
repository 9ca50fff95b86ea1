"""Bounded reads: decompression bombs and oversized declarations, in the header, a middle and the last batch.

Each damaged file is read by ``load_stored``, ``load_stored_from``, ``read_raw``, ``list`` and ``list_damaged`` in
a fresh subprocess that reports its peak RSS (``VmHWM`` of ``/proc/self/status``): every read is refused as damage of that
one session (never a ``MemoryError``, never the whole root) and the peak stays under a generous bound. That is a
memory bound, not a timing assertion.
"""
# ruff: noqa: ASYNC240

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
import zstandard
from dsh.session_persistence.backend import SessionPersistenceCorruptionError, StorageMetadata
from dsh.session_persistence_jsonl import BatchTooLargeError, JsonlBackend
from dsh.session_persistence_jsonl._format.frames import scan_frames
from dsh.session_persistence_jsonl._format.v1_declarations import zstd_declaration

from ._formats import Pair, pairs, write_v0
from ._sessions import storage, turn_batches

#: Peak RSS allowed for a reading process (the interpreter and the packages take ~40 MB).
RSS_BOUND_MB = 200
BOMB_BYTES = 1 << 30  # what each bomb expands to


def _bomb_unknown_size(plain_prefix: bytes) -> bytes:
    """One zstd frame, no pledged size, that expands to ~1 GiB (33 KB on disk)."""
    cobj = zstandard.ZstdCompressor(level=3, write_checksum=True).compressobj()
    parts = [cobj.compress(plain_prefix)]
    zeros = b"\0" * (1 << 20)
    for _ in range(BOMB_BYTES >> 20):
        parts.append(cobj.compress(zeros))
    parts.append(cobj.flush())
    return b"".join(parts)


def _pledging(size: int) -> bytes:
    """A small valid frame whose header is patched to pledge ``size`` bytes (never decoded: refused first)."""
    frame = bytearray(zstandard.ZstdCompressor(level=3, write_checksum=True).compress(b"x" * 70_000))
    fhd = frame[4]
    assert fhd >> 6 == 2 and fhd & 0x20  # a 4-byte content size right after the descriptor
    frame[5:9] = size.to_bytes(4, "little")
    return bytes(frame)


def _zstd_decl(first_seq: int, count: int, length: int, crc: int) -> bytes:
    body = b"\x5d\x2a\x4d\x18" + struct.pack("<I", 24) + struct.pack("<QIII", first_seq, count, length, crc)
    return body + struct.pack("<I", zlib.crc32(body))


def _line_decl(first_seq: int, count: int, length: int, crc: int) -> bytes:
    body = b'{"type":"dsh.batch","seq":%d,"count":%d,"bytes":%d,"crc32":%d' % (first_seq, count, length, crc)
    return body + b',"check":%d}\n' % zlib.crc32(body)


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {"unknown": _bomb_unknown_size(b'{"type":"session"'), "pledged": _pledging(0xF0000000)}


def _measure(root: Path, compression: str, session_id: str, cap: int | None = None) -> dict[str, object]:
    """Every read of ``session_id`` in a fresh process: the error type of each, and the peak RSS.

    The child's address space is limited to what it uses at start plus 1 GiB, so an attempt to allocate what a
    bomb pledges (3.75 GiB) fails loudly even where it would not touch resident memory.
    """
    script = textwrap.dedent(
        f"""
        import json, os, resource, anyio
        vsz = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (vsz + (1 << 30), resource.RLIM_INFINITY))
        from dsh.session_persistence.backend import SessionPersistenceCorruptionError
        from dsh.session_persistence_jsonl import JsonlBackend

        async def main():
            kw = {{}} if {cap!r} is None else {{"max_batch_bytes": {cap!r}}}
            backend = JsonlBackend({str(root)!r}, compression={compression!r}, **kw)
            out = {{}}
            for name, op in [
                ("load", lambda: backend.load_stored({session_id!r})),
                ("load_from", lambda: backend.load_stored_from({session_id!r}, 3)),
                ("raw", lambda: backend.read_raw({session_id!r})),
                ("list", backend.list),
                ("damaged", backend.list_damaged),
            ]:
                try:
                    result = await op()
                except SessionPersistenceCorruptionError:
                    out[name] = "damage"
                except Exception as exc:
                    out[name] = type(exc).__name__
                else:
                    out[name] = ([getattr(x, "id", getattr(x, "session_id", None)) for x in result]
                                 if isinstance(result, list) else "ok")
            # VmHWM is this address space's peak; ru_maxrss would also count the pytest process this child was
            # forked from (its RSS at the fork survives the exec).
            hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
            out["rss_mb"] = int(hwm.split()[1]) / 1024
            print(json.dumps(out))

        anyio.run(main)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _plant(root: Path, compression: str, position: str, payload: Callable[[Pair], bytes]) -> None:
    """Sessions ``bomb`` (a real v1 log whose header / middle / last pair is replaced) and ``ok`` (intact)."""
    backend = JsonlBackend(root, compression=compression)  # type: ignore[arg-type]
    st = storage("bomb")
    batches = turn_batches(3)

    async def write() -> None:
        for i, batch in enumerate(batches):
            await backend.append_batch(st, batch, i > 0)
        await backend.append_batch(storage("ok"), turn_batches(1)[0], False)

    anyio.run(write)
    path = Path(backend.locate(st.meta).path)
    data = path.read_bytes()
    target = pairs(data, compression)[{"header": 0, "middle": 2, "last": 3}[position]]
    path.write_bytes(data[: target.start] + payload(target) + data[target.end :])


def _expect_one_damaged_session(result: dict[str, object], position: str) -> None:
    assert result["load"] == "damage", result
    assert result["load_from"] == "damage", result
    assert result["raw"] == "damage", result
    if position == "header":
        assert result["list"] == ["ok"], result  # the other session is still listed
        assert result["damaged"] == ["bomb"], result
    else:
        assert result["list"] == ["bomb", "ok"], result
        assert result["damaged"] == [], result
    assert float(result["rss_mb"]) < RSS_BOUND_MB, result  # type: ignore[arg-type]


@pytest.mark.parametrize("position", ["header", "middle", "last"])
def test_v1_bombs_and_oversized_declarations_are_damage_without_allocation(
    tmp_path: Path, position: str, bombs: dict[str, bytes]
) -> None:
    """CRC-valid pairs whose frame pledges 3.75 GiB, or pledges nothing (1 GiB inside), or that declare 3 GiB."""
    cases: dict[str, Callable[[Pair], bytes]] = {
        "pledged": lambda t: zstd_declaration(t.first_seq, t.count, bombs["pledged"]) + bombs["pledged"],
        "unknown": lambda t: zstd_declaration(t.first_seq, t.count, bombs["unknown"]) + bombs["unknown"],
        "declared": lambda t: _zstd_decl(t.first_seq, t.count, 3 << 30, 0) + b"\0" * 64,
    }
    for name, payload in cases.items():
        root = tmp_path / name / "root"
        _plant(root, "zstd", position, payload)
        _expect_one_damaged_session(_measure(root, "zstd", "bomb"), position)


def test_raw_lines_oversized_declaration_is_damage(tmp_path: Path) -> None:
    for position in ("header", "middle", "last"):
        root = tmp_path / position / "root"
        _plant(root, "none", position, lambda t: _line_decl(t.first_seq, t.count, 3 << 30, 0) + b"{}\n")
        _expect_one_damaged_session(_measure(root, "none", "bomb"), position)


@pytest.mark.parametrize("position", ["header", "middle", "last"])
def test_v0_bombs_are_damage_within_the_cap(tmp_path: Path, position: str, bombs: dict[str, bytes]) -> None:
    """A v0 frame with no pledged size that expands to 1 GiB: streamed, and given up at the cap."""
    root = tmp_path / "root"
    path = write_v0(root, storage("bomb"), turn_batches(3), "zstd")
    data = path.read_bytes()
    start, end = scan_frames(data).frames[{"header": 0, "middle": 1, "last": 3}[position]]
    path.write_bytes(data[:start] + bombs["unknown"] + data[end:])

    async def other() -> None:
        await JsonlBackend(root).append_batch(storage("ok"), turn_batches(1)[0], False)

    anyio.run(other)
    _expect_one_damaged_session(_measure(root, "zstd", "bomb", cap=64 << 20), position)


@pytest.mark.anyio
async def test_a_batch_above_the_cap_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path / "root", max_batch_bytes=4096)
    st = storage()
    batches = turn_batches(2, tokens=400)
    with pytest.raises(BatchTooLargeError, match="above max_batch_bytes=4096"):
        await backend.append_batch(st, batches[0], False)
    assert not (tmp_path / "root").exists()
    small = JsonlBackend(tmp_path / "root")
    await small.append_batch(st, batches[0][:3], False)
    path = Path(small.locate(st.meta).path)
    before = path.read_bytes()
    with pytest.raises(BatchTooLargeError):
        await backend.append_batch(StorageMetadata(st.meta, 0), batches[0][3:], True)
    assert path.read_bytes() == before


@pytest.mark.anyio
@pytest.mark.parametrize("compression", ["zstd", "none"])
async def test_a_huge_declared_count_is_damage_not_an_allocation(tmp_path: Path, compression: str) -> None:
    """A CRC-valid declaration of 4 billion events over a real batch's data: refused, nothing sized by the count."""
    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    st = storage()
    for i, batch in enumerate(turn_batches(2)):
        await backend.append_batch(st, batch, i > 0)
    path = Path(backend.locate(st.meta).path)
    data = path.read_bytes()
    last = pairs(data, compression)[-1]
    body = data[last.data_start : last.end]
    crc = zlib.crc32(body)
    decl = (
        _zstd_decl(last.first_seq, (1 << 32) - 1, len(body), crc)
        if compression == "zstd"
        else _line_decl(last.first_seq, (1 << 32) - 1, len(body), crc)
    )
    path.write_bytes(data[: last.start] + decl + body)
    with pytest.raises(SessionPersistenceCorruptionError, match="declares 4294967295 event"):
        await backend.load_stored("s1")


def _reseq(lines: list[bytes], variant: str) -> list[bytes]:
    """The last batch's storage lines with their seqs moved (same number of events)."""
    values = [json.loads(line) for line in lines]
    key = ["seq0" if "seq0" in v else "seq" for v in values]
    rows = [i for i, k in enumerate(key) if k == "seq0"]
    plain = [i for i, k in enumerate(key) if k == "seq"]
    if variant == "first-shifted":  # every seq one later: the batch does not start at its declared seq
        for value, k in zip(values, key, strict=True):
            value[k] += 1
    elif variant == "gap-after-a-row":  # the line after a chunk row skips a seq
        at = rows[0] + 1
        for value, k in zip(values[at:], key[at:], strict=True):
            value[k] += 1
    elif variant == "gap-before-a-row":  # a chunk row and every line after it skip a seq
        at = rows[0]
        for value, k in zip(values[at:], key[at:], strict=True):
            value[k] += 1
    elif variant == "row-overlaps":  # a chunk row starts one seq early: its first member repeats a seq
        values[rows[-1]]["seq0"] -= 1
    elif variant == "event-repeats":  # an event line repeats the previous line's seq
        values[plain[-1]]["seq"] -= 1
    else:  # pragma: no cover
        raise AssertionError(variant)
    return [json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode() for v in values]


@pytest.mark.anyio
@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.parametrize(
    "variant", ["first-shifted", "gap-after-a-row", "gap-before-a-row", "row-overlaps", "event-repeats"]
)
async def test_a_crc_valid_batch_whose_events_miss_its_declared_seqs_is_damage(
    tmp_path: Path, compression: str, variant: str
) -> None:
    """A batch whose data verifies but whose events (packed chunk rows included) do not carry exactly the seqs its
    declaration states is damage naming that batch, with the declaration's count unchanged."""
    from dsh.session_persistence_jsonl._format.v1 import BatchDamage

    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    st = storage()
    for i, batch in enumerate(turn_batches(2)):
        await backend.append_batch(st, batch, i > 0)
    path = Path(backend.locate(st.meta).path)
    data = path.read_bytes()
    last = pairs(data, compression)[-1]
    body = data[last.data_start : last.end]
    plaintext = zstandard.ZstdDecompressor().decompress(body) if compression == "zstd" else body
    lines = plaintext.split(b"\n")[:-1]
    assert any(b'"seq0"' in line for line in lines)  # packed chunk rows are part of what is checked
    new_plain = b"\n".join(_reseq(lines, variant)) + b"\n"
    new_body = zstandard.ZstdCompressor(level=3).compress(new_plain) if compression == "zstd" else new_plain
    assert new_body[-1] != 0
    crc = zlib.crc32(new_body)
    decl = (
        _zstd_decl(last.first_seq, last.count, len(new_body), crc)
        if compression == "zstd"
        else _line_decl(last.first_seq, last.count, len(new_body), crc)
    )
    path.write_bytes(data[: last.start] + decl + new_body)
    expected = rf"declares {last.count} event\(s\) from seq {last.first_seq} but holds seqs"
    with pytest.raises(BatchDamage, match=expected) as info:
        await JsonlBackend(tmp_path / "root", compression=compression).load_stored("s1")  # type: ignore[arg-type]
    assert info.value.offset == last.start
