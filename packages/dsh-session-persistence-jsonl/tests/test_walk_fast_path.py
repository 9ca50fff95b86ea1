"""The walk's clean-span fast path (``_format/v1_fast``) against the general walk it stands in for.

A load walks an in-memory zstd transcript through clean spans and leaves every batch that is not clean to the
general walk. The general walk alone runs when the buffer is not ``bytes`` (a ``bytearray`` here), so each case
walks the same transcript both ways and compares everything a reader gets: events, plaintexts, where the committed
part ends, the torn marker, or the error's type and text. On intact logs (plaintext and sealed, with and without
packed chunk rows), on every single-byte change and on every truncation, a zero-filled tail, a batch under another
key, a key the provider does not hold and cancellation checks every 64 KiB.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
import zstandard
from dsh.session_persistence.backend import encode_event
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl._format.v1 import BufferSource, encode_declared_batch, walk_declared
from dsh.session_persistence_jsonl._format.v1_declarations import parse_zstd_declaration, zstd_declaration
from dsh.session_persistence_jsonl.encryption import StaticKeyProvider

from ._sealed import KEY_NEW, KEY_OLD, provider
from ._sessions import storage, turn_batches

CAP = 1 << 28


def _write(root: Path, keys: StaticKeyProvider | None, turns: int = 3, pack_chunks: bool = True) -> bytes:
    async def build() -> str:
        backend = JsonlBackend(root, compression="zstd", encryption=keys, pack_chunks=pack_chunks)
        st = storage()
        for i, batch in enumerate(turn_batches(turns, tokens=4)):
            await backend.append_batch(st, batch, i > 0)
        return backend.locate(st.meta).path

    return Path(anyio.run(build)).read_bytes()


def _outcome(data: bytes | bytearray, keys: StaticKeyProvider | None, **options: Any) -> tuple[Any, ...]:
    texts: list[bytes] = []
    try:
        log = walk_declared(BufferSource(data), "zstd", "<log>", CAP, plaintexts=texts, keys=keys, **options)  # type: ignore[arg-type]
    except Exception as exc:
        return ("error", type(exc), str(exc), getattr(exc, "offset", None), getattr(exc, "end", None))
    torn = log.torn
    return (
        [encode_event(e) for e in log.events],
        [bytes(t) for t in texts],
        log.committed_end,
        None if torn is None else (torn.truncate_to, [encode_event(e) for e in torn.recovered_events]),
    )


def _same(data: bytes, keys: StaticKeyProvider | None, **options: Any) -> tuple[Any, ...]:
    fast = _outcome(data, keys, **options)
    assert fast == _outcome(bytearray(data), keys, **options)
    return fast


@pytest.fixture(params=["plaintext", "sealed"])
def keys(request: pytest.FixtureRequest) -> StaticKeyProvider | None:
    return provider() if request.param == "sealed" else None


@pytest.mark.parametrize("pack_chunks", [True, False])
def test_an_intact_log_walks_the_same_both_ways(
    tmp_path: Path, keys: StaticKeyProvider | None, pack_chunks: bool
) -> None:
    data = _write(tmp_path, keys, pack_chunks=pack_chunks)
    outcome = _same(data, keys)
    assert outcome[0] and outcome[2] == len(data) and outcome[3] is None
    for from_seq in (0, 1, 7, 30, 10_000):
        _same(data, keys, from_seq=from_seq)


def test_every_byte_changed_walks_the_same_both_ways(tmp_path: Path, keys: StaticKeyProvider | None) -> None:
    data = _write(tmp_path, keys, turns=2)
    for at in range(len(data)):
        for flip in (0x01, 0x80):
            _same(data[:at] + bytes([data[at] ^ flip]) + data[at + 1 :], keys)


def test_every_truncation_and_zero_tail_walks_the_same_both_ways(
    tmp_path: Path, keys: StaticKeyProvider | None
) -> None:
    data = _write(tmp_path, keys, turns=2)
    for size in range(len(data)):
        _same(data[:size], keys)
        _same(data[:size] + bytes(len(data) - size), keys)


def test_crafted_batches_with_valid_crcs_walk_the_same_both_ways(tmp_path: Path) -> None:
    # Damage no byte flip makes: every CRC verifies, the batch itself breaks a rule.
    data = _write(tmp_path, None, turns=2)
    pairs = _pairs(data)
    head, first, second = data[: pairs[0][0]], pairs[0], pairs[1]
    lines = [encode_event(e) for e in turn_batches(2, tokens=4)[0]]
    count = len(lines)
    later = [encode_event(e) for e in turn_batches(2, tokens=4)[1]]
    crafted = {
        "a batch repeated": data + data[first[0] : first[1]],
        "two batches swapped": head + data[second[0] : second[1]] + data[first[0] : second[0]],
        "no final LF": head + encode_declared_batch("zstd", 0, count, b"\n".join(lines)),
        "one event fewer than declared": head + encode_declared_batch("zstd", 0, count + 1, b"\n".join(lines) + b"\n"),
        "seqs not from the declared one": head
        + encode_declared_batch("zstd", 0, len(later), b"\n".join(later) + b"\n"),
        "a bad line": head + encode_declared_batch("zstd", 0, 1, b"{oops\n"),
        "an empty plaintext": head + encode_declared_batch("zstd", 0, 1, b""),
    }
    for name, variant in crafted.items():
        assert _same(variant, None)[0] == "error", name


def _pairs(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each batch pair after the header, read off the declarations (zstd: 32 bytes each)."""
    out: list[tuple[int, int]] = []
    pos = 32 + int.from_bytes(data[20:24], "little")
    while pos < len(data):
        end = pos + 32 + int.from_bytes(data[pos + 20 : pos + 24], "little")
        out.append((pos, end))
        pos = end
    return out


def test_a_batch_under_another_key_or_a_missing_key_walks_the_same(tmp_path: Path) -> None:
    old = _write(tmp_path / "a", provider())
    both = StaticKeyProvider("k2", {"k1": KEY_OLD, "k2": KEY_NEW})

    async def rotate() -> str:
        backend = JsonlBackend(tmp_path / "a", compression="zstd", encryption=both)
        st = storage()
        batches = turn_batches(4, tokens=4)
        for batch in batches[len(turn_batches(3, tokens=4)) :]:
            await backend.append_batch(st, batch, True)
        return backend.locate(st.meta).path

    rotated = Path(anyio.run(rotate)).read_bytes()
    assert len(rotated) > len(old)
    outcome = _same(rotated, both)
    assert outcome[0] and outcome[3] is None
    assert _same(rotated, provider())[0] == "error"  # k2 is not held: the key error of the general walk
    assert _same(rotated, StaticKeyProvider("k2", {"k2": KEY_NEW}))[0] == "error"
    assert _same(rotated, None)[0] == "error"


def test_a_long_log_is_walked_in_spans_with_a_cancellation_check_every_64_kib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # what is tested is the walk, not durability
    data = _write(tmp_path, None, turns=240, pack_chunks=False)
    assert len(data) > 3 * (1 << 16)
    calls: list[int] = []
    fast = _outcome(data, None, checkpoint=lambda: calls.append(1))
    general: list[int] = []
    assert fast == _outcome(bytearray(data), None, checkpoint=lambda: general.append(1))
    assert len(calls) == len(general) >= 3


def test_the_fast_path_is_what_a_load_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without this the comparisons above could pass with the fast path never taken.
    from dsh.session_persistence_jsonl._format import v1

    spans: list[int] = []
    real = v1.clean_span

    def counted(*args: Any) -> Any:
        span = real(*args)
        spans.append(len(span[0]))
        return span

    monkeypatch.setattr(v1, "clean_span", counted)
    for keys in (None, provider()):
        spans.clear()
        data = _write(tmp_path / str(keys is None), keys, turns=8)
        _outcome(data, keys)
        # every batch but a sealed log's first (the general walk fetches its key) comes in a clean span
        assert sum(spans) == len(turn_batches(8, tokens=4)) - (keys is not None) > 5


def test_crafted_frames_with_valid_crcs_walk_the_same_both_ways(tmp_path: Path) -> None:
    # A frame header the fast path reads with zstd's own parser: whatever it pledges, or fails to, both walks agree.
    data = _write(tmp_path, None, turns=2, pack_chunks=False)
    head = data[: _pairs(data)[0][0]]
    plaintext = b"\n".join(encode_event(e) for e in turn_batches(2, tokens=4)[0]) + b"\n"
    count = plaintext.count(b"\n")
    frame = zstandard.ZstdCompressor().compress(plaintext)
    fcs_at = 5 + (0 if frame[4] & 0x20 else 1)  # single-segment frames have no window byte
    frames = {
        "no content size": zstandard.ZstdCompressor(write_content_size=False).compress(plaintext),
        "a skippable frame": b"\x50\x2a\x4d\x18" + len(plaintext).to_bytes(4, "little") + plaintext,
        "a pledge one byte short": frame[:fcs_at] + bytes([frame[fcs_at] - 1]) + frame[fcs_at + 1 :],
        "a pledge one byte long": frame[:fcs_at] + bytes([frame[fcs_at] + 1]) + frame[fcs_at + 1 :],
        "a dictionary id": zstandard.ZstdCompressor(
            dict_data=zstandard.ZstdCompressionDict(b"dictionary " * 64, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        ).compress(plaintext),
        "a header cut short": frame[:fcs_at],
        "not a frame": plaintext,
    }
    for name, bad in frames.items():
        assert _same(head + zstd_declaration(0, count, bad) + bad, None)[0] == "error", name
    good = head + zstd_declaration(0, count, frame) + frame
    assert _same(good, None)[0] != "error"
    _same(head + zstd_declaration(0, count, frame + frame) + frame + frame, None)  # bytes after the frame
    for cap in (len(plaintext) - 1, len(plaintext)):  # the cap on what a frame pledges, at the boundary
        fast = _capped(good, cap)
        assert fast == _capped(bytearray(good), cap)
        assert (fast[0] == "error") is (cap < len(plaintext)), cap


def _capped(data: bytes | bytearray, cap: int) -> tuple[Any, ...]:
    try:
        log = walk_declared(BufferSource(data), "zstd", "<log>", cap)  # type: ignore[arg-type]
    except Exception as exc:
        return ("error", type(exc), str(exc))
    return ([encode_event(e) for e in log.events], log.committed_end)


def test_crafted_seals_with_valid_crcs_walk_the_same_both_ways(tmp_path: Path) -> None:
    # A later seal of a span whose header breaks a rule the CRC cannot catch (the batch was declared as it is).
    keys = provider()
    data = _write(tmp_path, keys, turns=3)
    pairs = _pairs(data)
    assert len(pairs) >= 3
    start, end = pairs[2]  # a seal after the span's first: the one its key id is taken from
    decl = parse_zstd_declaration(data[start : start + 32])
    seal = data[start + 32 : end]
    id_length = seal[9]
    variants = {
        "a length one more": seal[:4] + (len(seal) - 7).to_bytes(4, "little") + seal[8:],
        "a length one less": seal[:4] + (len(seal) - 9).to_bytes(4, "little") + seal[8:],
        "another AEAD code": seal[:8] + b"\x02" + seal[9:],
        "a longer key id": seal[:9] + bytes([id_length + 1]) + seal[10:],
        "another key id": seal[:10] + bytes([seal[10] ^ 0x01]) + seal[11:],
        "no final LF": seal[:-1] + b" ",
        "another magic": bytes([seal[0] ^ 0x01]) + seal[1:],
        "cut before its tag": seal[: 10 + id_length + 12 + 8] + b"\n",
    }
    for name, bad in variants.items():
        crafted = data[:start] + zstd_declaration(decl.first_seq, decl.count, bad) + bad + data[end:]
        assert _same(crafted, keys)[0] == "error", name
