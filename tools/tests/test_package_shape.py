"""tools/check-shape passes on the real tree and catches each kind of broken package."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK_SHAPE = REPO / "tools" / "check-shape"
CORE = "dsh-session-persistence"
CORE_LEAF = Path("packages", CORE, "src", "dsh", "session_persistence")


def run_check_shape(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK_SHAPE), str(root)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """A copy of what check-shape looks at: root pyproject, LICENSE and packages/ (no caches)."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("pyproject.toml", "LICENSE"):
        shutil.copy2(REPO / name, root / name)
    shutil.copytree(
        REPO / "packages",
        root / "packages",
        symlinks=True,
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "dist", "build", ".*cache"),
    )
    return root


def test_real_tree_has_the_promised_shape() -> None:
    result = run_check_shape(REPO)
    assert result.returncode == 0, result.stderr
    assert "distributions OK" in result.stdout


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def _namespace_init(root: Path) -> None:
    (root / "packages" / CORE / "src" / "dsh" / "__init__.py").write_text("")


def _no_py_typed(root: Path) -> None:
    (root / CORE_LEAF / "py.typed").unlink()


def _no_all(root: Path) -> None:
    (root / CORE_LEAF / "__init__.py").write_text('"""No __all__ here."""\n')


def _license_differs(root: Path) -> None:
    with (root / "packages" / CORE / "LICENSE").open("a") as f:
        f.write("\nextra line\n")


def _license_symlink(root: Path) -> None:
    lic = root / "packages" / CORE / "LICENSE"
    lic.unlink()
    lic.symlink_to("../../LICENSE")


def _no_readme(root: Path) -> None:
    (root / "packages" / CORE / "README.md").unlink()


def _no_tests_dir(root: Path) -> None:
    shutil.rmtree(root / "packages" / CORE / "tests")


def _unpinned_dependency(root: Path) -> None:
    _edit(root / "packages" / CORE / "pyproject.toml", '"pluggy>=1.5"', '"pluggy"')


def _unpinned_env_dependency(root: Path) -> None:
    _edit(root / "pyproject.toml", '"hypothesis>=6.100"', '"hypothesis<7"')


def _missing_field(root: Path) -> None:
    _edit(root / "packages" / CORE / "pyproject.toml", 'requires-python = ">=3.10"\n', "")


def _wheel_drops_prefix(root: Path) -> None:
    _edit(root / "packages" / CORE / "pyproject.toml", '["src/dsh"]', '["src/dsh/session_persistence"]')


BREAKAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "namespace-init": (_namespace_init, "must not exist (dsh is a PEP 420 namespace)"),
    "no-py-typed": (_no_py_typed, "py.typed: missing"),
    "no-all": (_no_all, "does not define __all__"),
    "license-differs": (_license_differs, "LICENSE: differs from the root LICENSE"),
    "license-symlink": (_license_symlink, "LICENSE: is a symlink"),
    "no-readme": (_no_readme, "README.md: missing"),
    "no-tests-dir": (_no_tests_dir, "tests/: missing"),
    "unpinned-dependency": (_unpinned_dependency, "'pluggy' has no version floor"),
    "unpinned-env-dependency": (_unpinned_env_dependency, "'hypothesis<7' has no version floor"),
    "missing-field": (_missing_field, "[project] has no 'requires-python'"),
    "wheel-drops-prefix": (_wheel_drops_prefix, "must be 'src/dsh'"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_broken_copy_fails(tree_copy: Path, breakage: str) -> None:
    breaker, expected = BREAKAGES[breakage]
    breaker(tree_copy)
    result = run_check_shape(tree_copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert expected in result.stderr


def test_every_problem_is_reported_at_once(tree_copy: Path) -> None:
    _namespace_init(tree_copy)
    _no_readme(tree_copy)
    _unpinned_dependency(tree_copy)
    result = run_check_shape(tree_copy)
    assert result.returncode == 1
    for breakage in ("namespace-init", "no-readme", "unpinned-dependency"):
        assert BREAKAGES[breakage][1] in result.stderr


# --- the private-import walk (public faces only across distributions) ----------------------------------------------

# Built at run time: written out whole here, these module paths would be flagged by the walk itself.
CORE_PKG, JSONL_PKG = "dsh." + "session_persistence", "dsh." + "session_persistence_jsonl"
PLANTED_FORMS = [
    f"import {CORE_PKG}._model.events",
    f"from {CORE_PKG}._wire import codec",
    f"from {CORE_PKG} import _cli",
    f"from {CORE_PKG}.backend import _hidden",
    f'ARGV = ["python", "-m", "{CORE_PKG}._cli"]',
    f"from {JSONL_PKG}._format.v1 import encode_declared_batch",
]


def _places(root: Path) -> list[Path]:
    """One file in every kind of place the walk covers, none of them inside the owner of what is planted."""
    places = []
    for pkg in sorted((root / "packages").iterdir()):
        if pkg.name in (CORE, "dsh-session-persistence-jsonl"):
            continue
        leaf = next(p for p in (pkg / "src" / "dsh").iterdir() if p.is_dir())
        places += [leaf / "_planted.py", pkg / "tests" / "test_planted.py"]
    places += [root / "tests-integration" / "planted.py", root / "tools" / "planted.py", root / "tools" / "planted"]
    return places


@pytest.mark.parametrize("form", PLANTED_FORMS)
def test_a_planted_private_import_anywhere_outside_its_owner_fails_the_check(tree_copy: Path, form: str) -> None:
    places = _places(tree_copy)
    assert len(places) >= 11  # four other distributions x (src, tests) + tests-integration + two tools
    for place in places:
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_text(("#!/usr/bin/env python3\n" if not place.suffix else "") + form + "\n", encoding="utf-8")
    result = run_check_shape(tree_copy)
    assert result.returncode == 1
    for place in places:
        rel = place.relative_to(tree_copy).as_posix()
        assert f"  - {rel}:" in result.stderr, f"{rel} not flagged for {form!r}:\n{result.stderr}"


def test_a_distribution_may_use_its_own_private_modules(tree_copy: Path) -> None:
    (tree_copy / "packages" / CORE / "tests" / "test_planted.py").write_text(
        f"from {CORE_PKG}._model.events import SessionEvent\n", encoding="utf-8"
    )
    (tree_copy / "packages" / "dsh-session-persistence-jsonl" / "tests" / "test_planted.py").write_text(
        f"from {JSONL_PKG}._format.v1 import encode_declared_batch\n", encoding="utf-8"
    )
    result = run_check_shape(tree_copy)
    assert "test_planted.py" not in result.stderr, result.stderr
