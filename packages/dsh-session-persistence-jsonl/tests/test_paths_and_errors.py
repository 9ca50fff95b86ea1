"""Paths and storage errors: long ids get an injective hashed segment, a relative cwd is refused by every create
path with one message, and every storage failure is a ``SessionStorageError`` (errno and path kept, the
``OSError`` chained): EFBIG from a file-size limit and ENOSPC from a full tmpfs, in real processes and files."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
from dsh.session_persistence.backend import SessionHeader, SessionStorageError
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl._files.layout import MAX_SEGMENT, encode_segment, session_segment
from hypothesis import given
from hypothesis import strategies as st

from ._sessions import storage, turn_batches

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["zstd", "none"])
def compression(request: pytest.FixtureRequest) -> str:
    return str(request.param)


LONG_IDS = ["a" * 300, "开" * 100, "x" * 250 + "~1", "x" * 250 + "~2", "é" * 52, "s" * 255]


async def test_long_ids_get_a_hashed_segment_and_still_list_and_load(tmp_path: Path, compression: str) -> None:
    backend = JsonlBackend(tmp_path / "root", compression=compression)  # type: ignore[arg-type]
    events = turn_batches(1)[0][:3]
    for session_id in LONG_IDS:
        await backend.append_batch(storage(session_id), events, False)
    segments = [Path(backend.locate(storage(i).meta).path).parent.name for i in LONG_IDS]
    assert len(set(segments)) == len(LONG_IDS)
    assert all(len(s.encode()) <= MAX_SEGMENT for s in segments)
    assert sorted(h.id for h in await backend.list()) == sorted(LONG_IDS)
    for session_id in LONG_IDS:
        loaded = await backend.load_stored(session_id)
        assert loaded is not None
        assert loaded.meta.id == session_id
        assert loaded.events == events
    assert segments[-1] == "s" * 255  # short enough: the plain escaped segment, unchanged


@given(st.text(min_size=1, max_size=400).filter(lambda t: not any(0xD800 <= ord(c) <= 0xDFFF for c in t)))
def test_session_segment_is_bounded_and_plain_when_it_fits(session_id: str) -> None:
    segment = session_segment(session_id)
    assert len(segment.encode()) <= MAX_SEGMENT
    encoded = encode_segment(session_id)
    if len(encoded) <= MAX_SEGMENT:
        assert segment == encoded
    else:
        assert "~~" in segment and "~~" not in encoded  # hashed segments never collide with plain ones


@given(st.lists(st.text(alphabet="ab开~", min_size=60, max_size=90), min_size=2, max_size=6, unique=True))
def test_session_segment_is_injective(ids: list[str]) -> None:
    assert len({session_segment(i) for i in ids}) == len(ids)


async def test_relative_cwd_is_refused_by_every_create_path_with_one_message(tmp_path: Path) -> None:
    message = 'session header cwd must be an absolute path, got "rel/dir"'
    with pytest.raises(ValueError, match=message):
        SessionHeader(id="s", created_at=1, cwd="rel/dir")
    host = Host()
    store = SessionStore(host)
    with pytest.raises(ValueError, match=message):
        store.create("live", meta={"cwd": "rel/dir"})
    async with PersistenceCoordinator(host, JsonlBackend(tmp_path / "root")) as persistence:
        with pytest.raises(ValueError, match=message):
            await persistence.create({"version": 1, "id": "c", "createdAt": 1, "cwd": "rel/dir"})
        assert await persistence.list() == []
    assert not (tmp_path / "root").exists()


def _run_child(script: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


_CHILD = """
import json, os, resource, signal, anyio
from dsh.session_persistence.backend import SessionStorageError, SessionWriteInDoubtError
from dsh.session_persistence_jsonl import JsonlBackend
from tests._sessions import storage, turn_batches

async def main():
    backend = JsonlBackend({root!r}, compression={compression!r})
    st = storage()
    batches = turn_batches(4, tokens=200)
    out = {{}}
    await backend.append_batch(st, batches[0], False)
    path = backend.locate(st.meta).path
    before = open(path, "rb").read()
    {limit}
    try:
        for batch in batches[1:]:
            await backend.append_batch(st, batch, True)
    except SessionStorageError as exc:
        out.update(kind=type(exc).__name__, errno=exc.errno, path=exc.path, cause=type(exc.__cause__).__name__,
                   message=str(exc))
    {unlimit}
    after = await backend.load_stored("s1")
    out["events_prefix"] = [e.seq for e in after.events] == list(range(len(after.events)))
    out["kept_committed"] = open(path, "rb").read().startswith(before)
    out["torn"] = after.torn_marker is not None
    print(json.dumps(out))

anyio.run(main)
"""


def test_efbig_from_a_file_size_limit_is_a_storage_error(tmp_path: Path, compression: str) -> None:
    """RLIMIT_FSIZE makes the kernel refuse the append (EFBIG); the partial write is rolled back."""
    tests_dir = Path(__file__).resolve().parent.parent
    limit = textwrap.dedent(
        """
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 3000, hard))
    """
    ).strip()
    unlimit = "resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))"
    script = f"import sys; sys.path.insert(0, {str(tests_dir)!r})\n" + _CHILD.format(
        root=str(tmp_path / "root"), compression=compression, limit=limit.replace("\n", "\n    "), unlimit=unlimit
    )
    result = _run_child(script)
    assert result["kind"] == "SessionStorageError", result
    assert result["errno"] == errno.EFBIG, result
    assert str(result["path"]).endswith("session.jsonl" + (".zstd" if compression == "zstd" else "")), result
    assert result["cause"] in ("OSError", "FileTooLargeError"), result  # the OSError is chained
    assert result["events_prefix"] and result["kept_committed"] and not result["torn"], result


@contextlib.contextmanager
def _tiny_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_enospc_on_a_full_tmpfs_is_a_storage_error(tmp_path: Path, compression: str) -> None:
    """A real full file system: ENOSPC on write is rolled back and surfaces typed, errno and path kept."""
    tests_dir = Path(__file__).resolve().parent.parent
    with _tiny_tmpfs(tmp_path / "fs", "64k") as fs:
        # After the first batch, fill the file system to its last page: the next append runs out of space.
        fill = textwrap.dedent(
            f"""
        filler = os.open({str(fs / "filler")!r}, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(filler, b"\\0" * 4096)
        except OSError:
            pass
        os.close(filler)
        """
        ).strip()
        script = f"import sys; sys.path.insert(0, {str(tests_dir)!r})\n" + _CHILD.format(
            root=str(fs / "root"), compression=compression, limit=fill.replace("\n", "\n    "), unlimit="pass"
        )
        result = _run_child(script)
    assert result["kind"] == "SessionStorageError", result
    assert result["errno"] == errno.ENOSPC, result
    assert result["events_prefix"] and result["kept_committed"] and not result["torn"], result


def test_storage_error_keeps_errno_path_and_cause(tmp_path: Path) -> None:
    """Construction on a path that is not a directory: typed, never a bare OSError."""
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(SessionStorageError) as info:
        JsonlBackend(target / "deeper")
    assert info.value.errno == errno.ENOTDIR
    assert isinstance(info.value.__cause__, OSError)


def test_no_open_in_the_layout_follows_a_symlink(tmp_path: Path) -> None:
    """Descriptor-level guard (behind the lstat checks): reads, appends and truncation refuse a symlink."""
    from dsh.session_persistence_jsonl._files.fs import append_durable, open_read, stable_read, truncate_durable

    target = tmp_path / "target"
    target.write_bytes(b"committed\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    for attempt in (
        lambda: open_read(str(link)),
        lambda: stable_read(str(link)),
        lambda: append_durable(str(link), b"more\n"),
        lambda: truncate_durable(str(link), 0, 10),
    ):
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno == errno.ELOOP
    assert target.read_bytes() == b"committed\n"
