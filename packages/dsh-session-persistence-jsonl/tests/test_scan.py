"""Line scanner, header validation and the torn-tail vs corruption decision (spec/jsonl.md §2, DESIGN §7)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dsh.session_persistence.backend import (
    SessionFormatUnsupportedError,
    SessionPersistenceCorruptionError,
    encode_event,
    encode_storage_lines,
)
from dsh.session_persistence_jsonl._format.frames import MAGIC, compress_frame
from dsh.session_persistence_jsonl._format.records import encode_header_line
from dsh.session_persistence_jsonl._format.v0 import LineScanner, decode_raw_log, decode_zstd_log

from ._sessions import Builder, storage

HEADER = encode_header_line(storage())
PATH = "/r/p/s/session.jsonl"


def ev(seq: int, etype: str = "turn/start", **data: Any) -> bytes:
    payload: dict[str, Any] = {"turn": 0}
    if etype == "turn/end":
        payload["reason"] = {"kind": "completed"}
    if etype in ("step/start", "step/end"):
        payload["step"] = 0
    payload.update(data)
    return json.dumps({"type": etype, "seq": seq, "time": 1000 + seq, "data": payload}, separators=(",", ":")).encode()


def raw(*lines: bytes, tail: bytes = b"") -> bytes:
    return HEADER + b"".join(line + b"\n" for line in lines) + tail


def zst(*batches: list[bytes], tail: bytes = b"") -> bytes:
    out = compress_frame(HEADER)
    for lines in batches:
        out += compress_frame(b"".join(line + b"\n" for line in lines))
    return out + tail


def seqs(log: Any) -> list[int]:
    return [e.seq for e in log.events]


# -- scanner unit behaviour ----------------------------------------------------------------------------------


def test_chunk_splits_and_ignored_fragment() -> None:
    line = ev(0)
    scanner = LineScanner()
    for chunk in (b"", line[:5], line[5:], b"\n", b"ignored torn tail"):
        scanner.feed(chunk)
    assert seqs(scanner) == [0]
    assert scanner.committed == len(line) + 1
    assert scanner.has_fragment


def test_split_inside_multibyte_char_does_not_alias_caller_buffer() -> None:
    b = Builder()
    b.user(0, "你好")
    line = encode_event(b.events[0]) + b"\n"
    cut = line.index("你".encode()) + 1
    first = bytearray(line[:cut])
    scanner = LineScanner()
    scanner.feed(first)
    first[:] = b"\0" * len(first)
    scanner.feed(line[cut:])
    assert scanner.events == b.events


def test_header_only_raw_log() -> None:
    log = decode_raw_log(HEADER, PATH)
    assert log.events == []
    assert log.torn is None
    assert log.committed_end == len(HEADER)


def test_defect_followed_by_valid_line_is_corruption_raw() -> None:
    # DESIGN §7 (stricter than the reference, which would truncate here): damage before a valid line.
    with pytest.raises(SessionPersistenceCorruptionError, match="unparsable committed event at line 2"):
        decode_raw_log(raw(ev(0), b"{not json", ev(1, "step/start")), PATH)
    with pytest.raises(
        SessionPersistenceCorruptionError, match=r"seq gap in committed region at line 2 \(expected 1, got 2\)"
    ):
        decode_raw_log(raw(ev(0), ev(2, "step/start"), ev(3, "step/end")), PATH)


def test_gapped_turn_end_raises_immediately() -> None:
    with pytest.raises(SessionPersistenceCorruptionError, match="seq gap in committed region"):
        decode_raw_log(raw(ev(0), ev(5, "turn/end")), PATH)


@pytest.mark.parametrize(
    "tail_lines",
    [
        [b"{not json"],
        [ev(3, "step/start")],  # gap as the last line
        [ev(9)],
        [b""],  # an empty line
        [b"{not json", b"also garbage"],  # damage followed only by more damage
    ],
)
def test_damage_with_nothing_valid_after_is_torn_raw(tail_lines: list[bytes]) -> None:
    buf = raw(ev(0), ev(1, "turn/end"), *tail_lines)
    log = decode_raw_log(buf, PATH)
    assert seqs(log) == [0, 1]
    assert log.torn is not None
    assert log.torn.truncate_to == len(raw(ev(0), ev(1, "turn/end")))
    assert log.torn.recovered_events == []


def test_incomplete_final_line_is_torn_raw() -> None:
    buf = raw(ev(0), tail=b'{"type":"assistant/chunk","seq":1,"ti')
    log = decode_raw_log(buf, PATH)
    assert seqs(log) == [0]
    assert log.torn is not None
    assert log.torn.truncate_to == len(raw(ev(0)))
    assert log.torn.expected_size == len(buf)


def test_packed_rows_expand_and_malformed_rows_are_defects() -> None:
    row: dict[str, Any] = {
        "type": "text-chunks",
        "seq0": 1,
        "time0": 5,
        "data": {"turn": 0, "step": 0, "index": 0, "dt": [1, 2], "texts": ["a", "b", "c"]},
    }
    line = json.dumps(row, separators=(",", ":")).encode()
    log = decode_raw_log(raw(ev(0), line, ev(4, "turn/end")), PATH)
    assert seqs(log) == [0, 1, 2, 3, 4]
    assert log.events[2].data.chunk.text == "b"  # type: ignore[union-attr]
    assert log.events[3].time == 8
    bad = dict(row, data=dict(row["data"], dt=[1]))
    with pytest.raises(SessionPersistenceCorruptionError, match="unparsable committed event at line 2"):
        decode_raw_log(raw(ev(0), json.dumps(bad).encode(), ev(4, "turn/end")), PATH)
    skipping = json.dumps(dict(row, seq0=2)).encode()
    log = decode_raw_log(raw(ev(0), skipping), PATH)
    assert seqs(log) == [0]
    assert log.torn is not None
    assert log.torn.truncate_to == len(raw(ev(0)))


def test_pack_chunks_writes_rows_and_unpacked_is_one_event_per_line() -> None:
    b = Builder()
    b.turn(0, steps=1, tokens=5)
    packed = encode_storage_lines(b.events, pack_chunks=True)
    plain = encode_storage_lines(b.events, pack_chunks=False)
    assert b'"type":"text-chunks"' in packed
    assert plain == b"".join(encode_event(e) + b"\n" for e in b.events)
    for body in (packed, plain, plain + encode_storage_lines([], pack_chunks=True)):
        assert decode_raw_log(HEADER + body, PATH).events == b.events


# -- header line -----------------------------------------------------------------------------------------------


def _with_header(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


GOOD = {"type": "session", "version": 0, "id": "s1", "createdAt": 5, "cwd": "/home/me/project", "delegationDepth": 0}


@pytest.mark.parametrize("mode", ["raw", "zstd"])
def test_header_refusals_and_shape(mode: str) -> None:
    def decode(first: bytes) -> object:
        if mode == "raw":
            return decode_raw_log(first, PATH)
        return decode_zstd_log(compress_frame(first), PATH)

    with pytest.raises(SessionFormatUnsupportedError, match=r"written by a newer harness.*upgrade the harness") as info:
        decode(_with_header({"type": "session", "version": 42, "id": "s1", "futureOnly": True}))
    assert str(info.value).endswith(f"(raw log: {PATH})")
    assert info.value.location == PATH
    with pytest.raises(SessionFormatUnsupportedError, match='session "123" uses log format v42'):
        decode(_with_header({"version": 42, "id": 123}))
    with pytest.raises(SessionFormatUnsupportedError, match="older than the supported v1"):
        decode(_with_header(dict(GOOD, version=-1)))
    with pytest.raises(SessionPersistenceCorruptionError, match="first line is not a session header"):
        decode(b"42\n")
    with pytest.raises(SessionPersistenceCorruptionError, match="header line is not valid JSON"):
        decode(b"{nope\n")
    for key, value in [
        ("createdAt", 1.5),
        ("createdAt", -1),
        ("createdAt", 2**53),
        ("createdAt", True),
        ("delegationDepth", "1"),
        ("delegationDepth", 1.5),
        ("delegationDepth", -1),
        ("delegationDepth", True),
        ("agentPreset", 7),
        ("origin", "other"),
        ("cwd", 3),
        ("parentSession", 1),
        ("isSeeded", "yes"),
        ("inheritedEventCount", -1),
    ]:
        with pytest.raises(SessionPersistenceCorruptionError, match="first line is not a session header"):
            decode(_with_header(dict(GOOD, **{key: value})))
    missing = {k: v for k, v in GOOD.items() if k != "delegationDepth"}
    with pytest.raises(SessionPersistenceCorruptionError, match="first line is not a session header"):
        decode(_with_header(missing))
    for retired in ("sandboxMode", "approvalPolicy"):
        with pytest.raises(SessionPersistenceCorruptionError, match="retired policy baseline fields"):
            decode(_with_header(dict(GOOD, **{retired: "x"})))
    log: Any = decode(
        _with_header(dict(GOOD, agentPreset="minimal", pad="x" * 9000, isSeeded=True, inheritedEventCount=3))
    )
    assert log.header.agent_preset == "minimal"
    assert log.header.is_seeded
    assert log.inherited_event_count == 3


def test_empty_and_headerless_logs() -> None:
    for buf in (b"", HEADER[:-1]):
        with pytest.raises(SessionPersistenceCorruptionError, match="empty or header-less session log"):
            decode_raw_log(buf, PATH)
    for buf in (b"", MAGIC, MAGIC[:2]):
        with pytest.raises(SessionPersistenceCorruptionError, match="empty or header-less Zstandard session log"):
            decode_zstd_log(buf, PATH)
    for first in (b"", HEADER + ev(0) + b"\n", HEADER[:-1]):
        with pytest.raises(SessionPersistenceCorruptionError, match="first frame is not exactly one header line"):
            decode_zstd_log(compress_frame(first) + compress_frame(ev(0) + b"\n"), PATH)
    with pytest.raises(SessionPersistenceCorruptionError, match="first line is not a session header"):
        decode_zstd_log(compress_frame(ev(0) + b"\n"), PATH)


# -- zstd decision table -------------------------------------------------------------------------------------


def test_zstd_round_trip_and_frames() -> None:
    log = decode_zstd_log(zst([ev(0), ev(1, "turn/end")], [ev(2)]), PATH)
    assert seqs(log) == [0, 1, 2]
    assert log.torn is None
    assert len(log.frames) == 3


def test_zstd_complete_frame_defects_are_corruption() -> None:
    torn_record = "complete frame contains a torn JSONL record"
    with pytest.raises(SessionPersistenceCorruptionError, match=torn_record):
        decode_zstd_log(zst([ev(0)]) + compress_frame(b'{"type":"turn/start"'), PATH)
    with pytest.raises(SessionPersistenceCorruptionError, match=torn_record):
        decode_zstd_log(zst([ev(0), ev(1, "turn/end")], [ev(7)]), PATH)  # valid line, gapped seq
    with pytest.raises(SessionPersistenceCorruptionError, match=torn_record):
        decode_zstd_log(zst([ev(0)]) + compress_frame(b""), PATH)
    with pytest.raises(SessionPersistenceCorruptionError, match="unparsable committed event at line 1"):
        decode_zstd_log(zst([b"{bad"], [ev(0)]), PATH)
    buf = bytearray(zst([ev(0)], [ev(1)]))
    second = len(compress_frame(HEADER))
    buf[-1] ^= 0x01  # checksum of the last complete frame
    with pytest.raises(SessionPersistenceCorruptionError, match=r"frame at byte \d+ failed validation"):
        decode_zstd_log(bytes(buf), PATH)
    assert second > 0


def test_zstd_trailing_bytes() -> None:
    base = zst([ev(0), ev(1, "turn/end")])
    for extra in (b"\x01", b"\x01\x02", b"\x01\x02\x03", MAGIC[:2], MAGIC + b"\x00"):
        log = decode_zstd_log(base + extra, PATH)
        assert seqs(log) == [0, 1]
        assert log.torn is not None
        assert log.torn.truncate_to == len(base)
        assert log.torn.recovered_events == []
    with pytest.raises(SessionPersistenceCorruptionError, match=f"invalid frame magic at byte {len(base)}"):
        decode_zstd_log(base + b"\x01\x02\x03\x04", PATH)


def test_zstd_torn_last_frame_recovers_complete_lines() -> None:
    base = zst([ev(0), ev(1, "turn/end")])
    last = compress_frame(ev(2) + b"\n" + ev(3, "step/start") + b"\n" + ev(4, "assistant/chunk") + b"\n")
    log = decode_zstd_log(base + last[:-1], PATH)  # only the checksum's last byte is missing
    assert seqs(log) == [0, 1, 2, 3]  # line 4 is not a valid chunk event: recovery stops there
    assert log.torn is not None
    assert [e.seq for e in log.torn.recovered_events] == [2, 3]


def test_zstd_apparent_torn_frame_followed_by_complete_frame_is_corruption() -> None:
    first = compress_frame(ev(0) + b"\n")
    buf = bytearray(zst() + first + compress_frame(ev(1, "turn/end") + b"\n"))
    start = len(zst())
    # Grow the first block's size field so the middle frame seems to run past EOF.
    fhd = buf[start + 4]
    header_len = 5 + (0 if fhd & 0x20 else 1) + (0, 1, 2, 4)[fhd & 3] + ((1 if fhd & 0x20 else 0), 2, 4, 8)[fhd >> 6]
    block = start + header_len
    value = int.from_bytes(buf[block : block + 3], "little") | (0xFFF << 3)
    buf[block : block + 3] = value.to_bytes(3, "little")
    with pytest.raises(
        SessionPersistenceCorruptionError, match=rf"apparent torn frame at byte {start} is followed by a complete frame"
    ):
        decode_zstd_log(bytes(buf), PATH)
