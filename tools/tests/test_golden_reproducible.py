"""The golden logs are what the recorded release writes: rebuilt from tools/releases.toml (a git worktree at the
recorded commit, the release's packages installed into a fresh venv), golden/generate.py reproduces every file
byte for byte. A hand-edited golden file, or a record naming the wrong commit, fails here."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "packages" / "dsh-session-persistence-jsonl" / "tests" / "golden"
sys.path.insert(0, str(REPO / "tools"))
import _wheeltools as wt  # noqa: E402

# The distributions golden/generate.py imports (the release's own copies, never the work tree's).
GENERATOR_DISTS = ("dsh-session-persistence", "dsh-session-persistence-jsonl", "dsh-session-checkpoint-policy")


def _jsonl_releases() -> list[dict[str, str]]:
    record = wt.load_pyproject(REPO / "tools" / "releases.toml")["release"]
    return [e for e in record if e["distribution"] == "dsh-session-persistence-jsonl"]


def _tree_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("release", _jsonl_releases(), ids=lambda e: e["version"])
def test_generator_run_against_the_recorded_release_reproduces_the_golden_logs(
    release: dict[str, str], tmp_path: Path
) -> None:
    uv = wt.find_uv()
    commit = release["commit"]
    worktree = tmp_path / "release"
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(worktree), commit], cwd=REPO, check=True)
    try:
        venv = tmp_path / "venv"
        python = str(getattr(sys, "_base_executable", sys.executable))
        wt.make_venv(uv, venv, python, [str(worktree / "packages" / d) for d in GENERATOR_DISTS])
        assert wt.installed_version(venv, release["distribution"]) == release["version"]
        out = tmp_path / "out"
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        proc = subprocess.run(
            [str(venv / "bin" / "python"), str(GOLDEN / "generate.py"), "--out", str(out)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, check=False)
        subprocess.run(["git", "worktree", "prune"], cwd=REPO, check=False)
    fresh, kept = out / f"v{release['version']}", GOLDEN / f"v{release['version']}"
    assert _tree_files(fresh) == _tree_files(kept)
    different = [f for f in _tree_files(kept) if not filecmp.cmp(fresh / f, kept / f, shallow=False)]
    assert not different, f"the recorded release writes other bytes than the golden copies: {different}"
