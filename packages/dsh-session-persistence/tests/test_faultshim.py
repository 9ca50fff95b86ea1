"""The LD_PRELOAD fault and trace shim itself: built from the shipped C source, it fails exactly what it is told.

A child process runs plain ``os`` calls with the shim preloaded; the parent checks which calls failed, with
which errno, whether an ``after`` fault really performed the call, that healing (clearing ``DSH_SHIM_FAULT``
from inside the child) works, and that the trace records every durable call with its data.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dsh.session_persistence.testing import (
    FaultRule,
    ShimUnavailableError,
    build_shim,
    fault_spec,
    read_trace,
    shim_environment,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the LD_PRELOAD shim needs Linux")

CHILD = r"""
import json, os, sys
work = sys.argv[1]
out = []
def attempt(name, call):
    try:
        call()
        out.append([name, 0])
    except OSError as exc:
        out.append([name, exc.errno])
path = os.path.join(work, "data")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
for n in range(3):
    attempt(f"write{n}", lambda: os.write(fd, b"abc"))
attempt("pwrite", lambda: os.pwrite(fd, b"Z", 0))
attempt("fsync", lambda: os.fsync(fd))
attempt("ftruncate", lambda: os.ftruncate(fd, 4))
os.environ["DSH_SHIM_FAULT"] = os.environ.get("HEAL_TO", "")
attempt("fsync-healed", lambda: os.fsync(fd))
os.close(fd)
attempt("link", lambda: os.link(path, path + ".l"))
attempt("rename", lambda: os.replace(path + ".l", path + ".r"))
attempt("unlink", lambda: os.unlink(path + ".r"))
dfd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
attempt("dirfsync", lambda: os.fsync(dfd))
os.close(dfd)
with open(path, "rb") as fh:
    out.append(["content", fh.read().decode()])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return build_shim(tmp_path_factory.mktemp("shim"))
    except ShimUnavailableError as exc:
        pytest.skip(str(exc))


def run(
    shim: Path, work: Path, rules: list[FaultRule], record: Path | None = None, *, heal: bool = True
) -> dict[str, Any]:
    work.mkdir(exist_ok=True)
    env = shim_environment(shim, rules=rules, record=record, record_under=[work])
    env["HEAL_TO"] = "" if heal else env["DSH_SHIM_FAULT"]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(work)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_no_rule_fails_nothing(shim: Path, tmp_path: Path) -> None:
    result = run(shim, tmp_path / "w", [])
    assert {k: v for k, v in result.items() if k != "content"} == dict.fromkeys(result.keys() - {"content"}, 0)
    assert result["content"] == "Zbca"


def test_nth_count_errno_and_heal(shim: Path, tmp_path: Path) -> None:
    rules = [
        FaultRule(("write",), nth=2, count=1, errno="ENOSPC"),
        FaultRule(("fsync",), count=0),
        FaultRule(("dirfsync", "link")),
    ]
    result = run(shim, tmp_path / "w", rules)
    assert (result["write0"], result["write1"], result["write2"]) == (0, 28, 0)
    assert result["fsync"] == 5 and result["fsync-healed"] == 0  # count=0 fails every call until healed
    assert result["content"] == "Zbca"  # the failed write never happened; ftruncate(4) kept 4 bytes


def test_after_performs_the_call_then_fails(shim: Path, tmp_path: Path) -> None:
    result = run(shim, tmp_path / "w", [FaultRule(("write",), nth=1, count=3, after=True)])
    assert (result["write0"], result["write1"], result["write2"]) == (5, 5, 5)
    assert result["content"] == "Zbca"  # all three writes landed although each call failed


def test_directory_fsync_is_its_own_op(shim: Path, tmp_path: Path) -> None:
    only_dirs = run(shim, tmp_path / "a", [FaultRule(("dirfsync",))], heal=False)
    assert (only_dirs["fsync"], only_dirs["fsync-healed"], only_dirs["dirfsync"]) == (0, 0, 5)
    only_files = run(shim, tmp_path / "b", [FaultRule(("fsync",), count=0)], heal=False)
    assert (only_files["fsync"], only_files["fsync-healed"], only_files["dirfsync"]) == (5, 5, 0)


def test_path_filter(shim: Path, tmp_path: Path) -> None:
    result = run(shim, tmp_path / "w", [FaultRule(("write", "fsync"), path="/not-this-one/", count=0)])
    assert all(v == 0 for k, v in result.items() if k != "content")


def test_trace_records_every_durable_call_with_its_data(shim: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    run(shim, tmp_path / "w", [], record=trace)
    ops = [(r.op, r.arg, r.data) for r in read_trace(trace)]
    assert ops == [
        ("C", 1, b""),
        ("W", 0, b"abc"),
        ("W", 3, b"abc"),
        ("W", 6, b"abc"),
        ("W", 0, b"Z"),
        ("S", 0, b""),
        ("T", 4, b""),
        ("S", 0, b""),
        ("L", 0, b""),
        ("R", 0, b""),
        ("U", 0, b""),
        ("D", 0, b""),
    ]


def test_fault_spec_syntax() -> None:
    assert fault_spec([]) == ""
    assert fault_spec([FaultRule(("fsync", "write"), path="/x", after=True)]) == (
        "op=fsync,write;nth=1;count=1;errno=EIO;path=/x;after=1"
    )
    with pytest.raises(ValueError, match="unknown or missing shim ops"):
        FaultRule(("mmap",))
    with pytest.raises(ValueError, match="nth must be"):
        FaultRule(("write",), nth=0)
