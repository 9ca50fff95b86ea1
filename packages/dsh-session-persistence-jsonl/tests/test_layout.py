"""Layout: id escaping, project keys, transcript paths, locate (spec/jsonl.md §1, §5 #1-#7)."""

from __future__ import annotations

import errno
import os
import re

import pytest
from dsh.session_persistence.backend import SessionStorageError
from dsh.session_persistence_jsonl import JsonlBackend
from dsh.session_persistence_jsonl._files.layout import decode_segment, encode_segment, project_key
from hypothesis import given
from hypothesis import strategies as st

from ._sessions import header

NO_SURROGATES = st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40)


@pytest.mark.parametrize(
    ("raw", "encoded"),
    [
        ("..", "~002E~002E"),
        (".", "~002E"),
        ("a/b", "a~002Fb"),
        ("/etc/passwd", "~002Fetc~002Fpasswd"),
        ("a\0b", "a~0000b"),
        ("plain-ID_1.2", "plain-ID_1.2"),
        ("a~b", "a~007Eb"),
        ("é开", "~00E9~5F00"),
        ("\U0001f600", "~D83D~DE00"),
    ],
)
def test_encode_segment_table(raw: str, encoded: str) -> None:
    assert encode_segment(raw) == encoded
    assert decode_segment(encoded) == raw


def test_encode_segment_rejects_empty_and_surrogates() -> None:
    with pytest.raises(ValueError, match="empty"):
        encode_segment("")
    # Port deviation (spec §6.6): lone surrogates would make the UTF-16 walk non-injective over str.
    for bad in ("\ud800", "x\udc00"):
        with pytest.raises(ValueError, match="surrogate"):
            encode_segment(bad)
    assert encode_segment("~002F") != encode_segment("/")


@given(NO_SURROGATES, NO_SURROGATES)
def test_encode_segment_is_injective_and_safe(a: str, b: str) -> None:
    ea, eb = encode_segment(a), encode_segment(b)
    assert re.fullmatch(r"[A-Za-z0-9._~-]+", ea)
    assert ea not in (".", "..")
    assert decode_segment(ea) == a
    assert (ea == eb) == (a == b)


@pytest.mark.parametrize(
    ("cwd", "key"),
    [
        ("/home/me/src/harness", "--home-me-src-harness--"),
        ("C:\\work\\agent", "--C-work-agent--"),
        ("/开发/~agent", "--~5F00~53D1-~007Eagent--"),
        ("/", "--root--"),
        ("/a/", "--a---"),
        (".", "--.--"),
        ("//a::b", "--a-b--"),
    ],
)
def test_project_key_table(cwd: str, key: str) -> None:
    assert project_key(cwd) == key


def test_project_key_is_lossy_and_bounded() -> None:
    assert project_key("/a/b-c") == project_key("/a-b/c") == "--a-b-c--"
    assert len(project_key("/" + "x" * 1000)) == 255
    with pytest.raises(ValueError, match="empty project path"):
        project_key("")


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=300))
def test_project_key_properties(cwd: str) -> None:
    key = project_key(cwd)
    assert key.isascii()
    assert key.startswith("--")
    assert key.endswith("--")
    assert len(key) <= 255
    assert not set("/\\:") & set(key)


def test_relative_root_is_made_absolute_and_locate_does_no_io(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    backend = JsonlBackend("data/sessions")
    assert backend.root == os.path.join(os.fspath(tmp_path), "data", "sessions")
    loc = backend.locate(header("id/1", "/home/me/proj"))
    assert loc.kind == "jsonl"
    assert loc.path == os.path.join(backend.root, "--home-me-proj--", "id~002F1", "session.jsonl.zstd")
    assert JsonlBackend("data/sessions", compression="none").locate(header("x", None)).path == os.path.join(
        backend.root, "_no-cwd", "x", "session.jsonl"
    )
    assert not os.path.lexists(os.path.join(os.fspath(tmp_path), "data"))


def test_construction_rejects_bad_config(tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(ValueError, match="compression"):
        JsonlBackend(tmp_path, compression="gzip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="root"):
        JsonlBackend("")
    a_file = os.path.join(os.fspath(tmp_path), "file")
    with open(a_file, "w") as fh:
        fh.write("x")
    with pytest.raises(SessionStorageError) as info:
        JsonlBackend(a_file)
    assert info.value.errno == errno.ENOTDIR
    assert isinstance(info.value.__cause__, NotADirectoryError)
    for bad in (0, 1023, 1 << 32, 2.5, True):
        with pytest.raises(ValueError, match="max_batch_bytes"):
            JsonlBackend(tmp_path, max_batch_bytes=bad)  # type: ignore[arg-type]
