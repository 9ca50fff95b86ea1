"""tools/i18n-pairs passes on the real tree and catches a README pair edited on one side only."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "i18n-pairs"
NAMES = ("README.md", "README.zh.md", "README.i18n.yaml")
POLICY = Path("packages", "dsh-session-checkpoint-policy")


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), "--root", str(root), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=root,
    )


def readme_dirs() -> list[Path]:
    return [Path("."), *(p.relative_to(REPO) for p in sorted((REPO / "packages").iterdir()) if p.is_dir())]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of every README pair of the repository (the root's and each package's)."""
    root = tmp_path / "repo"
    for rel in readme_dirs():
        (root / rel).mkdir(parents=True, exist_ok=True)
        for name in NAMES:
            if (REPO / rel / name).exists():
                shutil.copy2(REPO / rel / name, root / rel / name)
    return root


def append(path: Path, text: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")


def test_real_tree_pairs_are_consistent() -> None:
    result = run(REPO)
    assert result.returncode == 0, result.stderr
    assert f"{len(readme_dirs())} README pair(s) consistent" in result.stdout


def test_every_readme_has_its_pair_and_record() -> None:
    for rel in readme_dirs():
        for name in NAMES:
            assert (REPO / rel / name).is_file(), rel / name


def test_recorded_hashes_are_git_blob_hashes() -> None:
    git = shutil.which("git")
    if git is None:  # pragma: no cover - every CI runner has git
        pytest.skip("git is not installed")
    record = (REPO / "README.i18n.yaml").read_text(encoding="utf-8")
    for name in ("README.md", "README.zh.md"):
        out = subprocess.run([git, "hash-object", name], cwd=REPO, capture_output=True, text=True, check=True)
        assert f"{name}: {out.stdout.strip()}\n" in record


def test_copy_passes(tree: Path) -> None:
    result = run(tree)
    assert result.returncode == 0, result.stderr


def test_english_edited_alone_fails_naming_the_stale_chinese_side(tree: Path) -> None:
    append(tree / POLICY / "README.md", "\nOne more English sentence.\n")
    result = run(tree)
    assert result.returncode == 1
    [problem] = [line for line in result.stderr.splitlines() if "stale" in line]
    assert problem.startswith(f"{POLICY / 'README.zh.md'}: stale: {POLICY / 'README.md'} changed")
    assert f"tools/i18n-pairs --write {POLICY / 'README.md'}" in problem


def test_chinese_edited_alone_fails_naming_the_stale_english_side(tree: Path) -> None:
    append(tree / "README.zh.md", "\n再加一句中文。\n")
    result = run(tree)
    assert result.returncode == 1
    assert "README.md: stale: README.zh.md changed" in result.stderr


def test_both_edited_fail_until_rerecorded(tree: Path) -> None:
    append(tree / POLICY / "README.md", "\nA new paragraph.\n")
    append(tree / POLICY / "README.zh.md", "\n新的段落。\n")
    result = run(tree)
    assert result.returncode == 1
    assert "both" in result.stderr and str(POLICY / "README.i18n.yaml") in result.stderr
    written = run(tree, "--write", str(POLICY / "README.zh.md"))
    assert written.returncode == 0, written.stderr
    assert run(tree).returncode == 0
    record = (tree / POLICY / "README.i18n.yaml").read_text(encoding="utf-8")
    assert record.startswith("# Bilingual-pair consistency record")
    assert f"tools/i18n-pairs --write {(POLICY / 'README.md').as_posix()}\n" in record


def test_write_all_rerecords_every_pair(tree: Path) -> None:
    append(tree / "README.md", "\nx\n")
    append(tree / POLICY / "README.zh.md", "\ny\n")
    assert run(tree).returncode == 1
    assert run(tree, "--write", "--all").returncode == 0
    assert run(tree).returncode == 0


def test_a_readme_without_its_pair_or_record_fails(tree: Path) -> None:
    (tree / POLICY / "README.zh.md").unlink()
    (tree / "README.i18n.yaml").unlink()
    result = run(tree)
    assert result.returncode == 1
    assert f"{POLICY / 'README.zh.md'}: missing" in result.stderr
    assert "README.i18n.yaml: missing" in result.stderr
    new = tree / "packages" / "dsh-new"
    new.mkdir()
    (new / "README.md").write_text("# dsh-new\n", encoding="utf-8")
    assert "packages/dsh-new/README.zh.md: missing" in run(tree).stderr.replace("\\", "/")


def test_a_missing_language_switch_fails(tree: Path) -> None:
    path = tree / POLICY / "README.zh.md"
    path.write_text(path.read_text(encoding="utf-8").replace("[English](README.md) | 中文", "中文"), encoding="utf-8")
    run(tree, "--write", str(POLICY / "README.md"))
    result = run(tree)
    assert result.returncode == 1
    assert "no language switch" in result.stderr


def test_usage_errors_exit_2(tree: Path) -> None:
    assert run(tree, "--write").returncode == 2
    assert run(tree, "--all").returncode == 2
    assert run(tree, "--write", "--all", "README.md").returncode == 2


def test_a_translated_code_block_fails(tree: Path) -> None:
    path = tree / "README.zh.md"
    text = path.read_text(encoding="utf-8")
    assert "await agent.run_turn(" in text
    path.write_text(text.replace("await agent.run_turn(", "await agent.运行(", 1), encoding="utf-8")
    run(tree, "--write", "README.md")  # the hashes are current: only the code-block rule can fail
    result = run(tree)
    assert result.returncode == 1
    # block 5: the first run_turn block, after the install, from-a-clone install, demo and run-tests commands
    assert "README.zh.md: code block 5 differs from the one in README.md" in result.stderr
