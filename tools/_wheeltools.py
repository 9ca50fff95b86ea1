"""Shared helpers for tools/package-tests and tools/compat-matrix: build a distribution's wheel, install wheels
into a fresh venv and run a package's tests from the source tree against the installed wheels.

Stdlib only (plus uv, found as .venv-tools/bin/uv, $DSH_UV or on PATH). Never downloads an interpreter.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

REPO = Path(__file__).resolve().parent.parent
# Root hatch `default` env dependencies that are not needed to run tests.
_NOT_TEST_DEPS = {"mypy", "ruff"}
_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
# pytest's final line, framed by "=" (default) or bare (-q): "12 passed, 1 skipped in 3.2s".
SUMMARY_RE = re.compile(r"^=*\s*(?P<summary>(?:\d+ \w+|no tests ran)(?:, \d+ \w+)* in [\d.]+s(?: \([^)]*\))?)\s*=*$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(req: str) -> str:
    m = _NAME_RE.match(req)
    return canonical(m.group(1)) if m else ""


@dataclass(frozen=True)
class Dist:
    """One workspace distribution under packages/."""

    name: str
    path: Path
    version: str
    dependencies: tuple[str, ...]

    @property
    def leaf(self) -> str:
        """The import name below `dsh.`: dsh-session-persistence-jsonl -> session_persistence_jsonl."""
        return self.name.removeprefix("dsh-").replace("-", "_")

    @property
    def wheel_stem(self) -> str:
        return self.name.replace("-", "_")


def load_pyproject(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        data: dict[str, Any] = tomllib.load(f)
    return data


def workspace() -> dict[str, Dist]:
    dists: dict[str, Dist] = {}
    for pyproject in sorted((REPO / "packages").glob("*/pyproject.toml")):
        project = load_pyproject(pyproject)["project"]
        dists[canonical(project["name"])] = Dist(
            name=canonical(project["name"]),
            path=pyproject.parent,
            version=project["version"],
            dependencies=tuple(project.get("dependencies", [])),
        )
    return dists


def sibling_requirements(dist: Dist, dists: dict[str, Dist]) -> list[str]:
    """The requirement strings `dist` declares on other workspace distributions."""
    return [r for r in dist.dependencies if requirement_name(r) in dists and requirement_name(r) != dist.name]


def siblings_used_by_tests(dist: Dist, dists: dict[str, Dist]) -> set[str]:
    """Workspace distributions that `dist`'s tests use: named in its tests (`dsh.<leaf>` imports, or the
    distribution name, e.g. a demo run in a subprocess) or in its README (whose examples the tests run)."""
    by_leaf = {d.leaf: d.name for d in dists.values()}
    texts = [f.read_text(errors="replace") for f in (dist.path / "tests").rglob("*.py")]
    if (dist.path / "README.md").is_file():
        texts.append((dist.path / "README.md").read_text(errors="replace"))
    found: set[str] = set()
    for text in texts:
        found |= {by_leaf[leaf] for leaf in re.findall(r"\bdsh\.(\w+)", text) if leaf in by_leaf}
        found |= {canonical(n) for n in re.findall(r"\bdsh-session-[a-z-]*[a-z]", text) if canonical(n) in dists}
    return found - {dist.name}


def closure(names: set[str], dists: dict[str, Dist]) -> set[str]:
    """`names` plus every workspace distribution they depend on, transitively."""
    todo, seen = list(names), set(names)
    while todo:
        for req in sibling_requirements(dists[todo.pop()], dists):
            dep = requirement_name(req)
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def tool_requirements(*, trio: bool = True) -> list[str]:
    """The test tools, as pinned in the root pyproject's hatch `default` env (one source of truth)."""
    deps = load_pyproject(REPO / "pyproject.toml")["tool"]["hatch"]["envs"]["default"]["dependencies"]
    out: list[str] = []
    for req in deps:
        name = requirement_name(req)
        if name in _NOT_TEST_DEPS:
            continue
        if not trio:
            if name == "trio":
                continue
            req = re.sub(r"\[trio\]", "", req)
        out.append(req)
    return out


def find_uv() -> str:
    beside_hatch = str(Path(os.environ["DSH_HATCH"]).parent / "uv") if os.environ.get("DSH_HATCH") else None
    for cand in (os.environ.get("DSH_UV"), str(REPO / ".venv-tools" / "bin" / "uv"), beside_hatch, shutil.which("uv")):
        if cand and Path(cand).is_file():
            return cand
    sys.exit("need uv: run tools/run-tests once (installs it into .venv-tools/), or set DSH_UV, or put uv on PATH")


def find_python(minor: str | None) -> str:
    """An installed interpreter for `minor` ("3.12"), from pyenv or PATH; None means the one running this."""
    if minor is None:
        return str(getattr(sys, "_base_executable", sys.executable))
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(
        (p for p in root.glob(f"{minor}.*") if re.fullmatch(rf"{re.escape(minor)}\.\d+", p.name)),
        key=lambda p: int(p.name.rsplit(".", 1)[1]),
    )
    for p in reversed(found):
        if (p / "bin" / f"python{minor}").is_file():
            return str(p / "bin" / f"python{minor}")
    exe = shutil.which(f"python{minor}")
    if exe is None:
        sys.exit(f"no python{minor} in pyenv (~/.pyenv/versions) or on PATH; interpreters are never downloaded")
    return exe


def require(condition: bool, problem: str) -> None:
    """Raise RuntimeError(problem) unless `condition` (the scripts report it in their table and carry on)."""
    if not condition:
        raise RuntimeError(problem)


def short(exc: BaseException) -> str:
    """One table cell for an error: its first line plus, for a traceback, its last (the actual error)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
    return subprocess.run(cmd, text=True, env=env, check=False, **kw)


def build(uv: str, source: Path, out: Path, *, sdist: bool = True) -> Path:
    """Build `source` (sdist, then the wheel from the sdist, like PyPI users get it); return the wheel."""
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.whl"))
    cmd = [uv, "build", "--quiet", "--out-dir", str(out), str(source)]
    if not sdist:
        cmd.insert(2, "--wheel")
    proc = run(cmd, capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"uv build {source} failed:\n{proc.stdout}{proc.stderr}")
    new = sorted(set(out.glob("*.whl")) - before)
    if len(new) != 1:
        raise RuntimeError(f"uv build {source}: expected one new wheel in {out}, got {new}")
    return new[0]


def make_venv(uv: str, venv: Path, python: str, requirements: list[str]) -> None:
    proc = run([uv, "venv", "--quiet", "--python", python, str(venv)], capture_output=True)
    if proc.returncode == 0:
        proc = run(
            [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *requirements],
            capture_output=True,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"creating {venv} failed:\n{proc.stdout}{proc.stderr}")


def installed_version(venv: Path, dist: str) -> str:
    proc = run(
        [str(venv / "bin" / "python"), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
    )
    return proc.stdout.strip() if proc.returncode == 0 else "not installed"


def assert_imported_from_venv(venv: Path, leaves: list[str]) -> None:
    """Each dsh.<leaf> must come from the venv's site-packages, never from the source tree."""
    code = (
        "import importlib, sys\n"
        "for leaf in sys.argv[1:]:\n"
        "    m = importlib.import_module('dsh.' + leaf)\n"
        "    where = getattr(m, '__file__', None) or f'a namespace dir {list(m.__path__)} (no __init__.py)'\n"
        "    assert 'site-packages' in where, f'dsh.{leaf} imported from {where}'\n"
    )
    proc = run([str(venv / "bin" / "python"), "-c", code, *leaves], capture_output=True, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"import check failed:\n{proc.stderr}")


def run_tests(venv: Path, dist: Dist, pytest_args: list[str], log: Path) -> tuple[int, str]:
    """Run `dist`'s tests (source tree) with the root pytest config against the venv; return (rc, summary)."""
    cmd = [
        str(venv / "bin" / "python"), "-m", "pytest",
        "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO),
        "--import-mode=importlib", "-p", "no:cacheprovider",
        str(dist.path.relative_to(REPO) / "tests"), *pytest_args,
    ]  # fmt: skip
    with log.open("w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        rc = run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    summary = ""
    for line in log.read_text(errors="replace").splitlines():
        if m := SUMMARY_RE.match(line.strip()):
            summary = m.group("summary")
    return rc, summary or "(no pytest summary; see log)"


def print_table(rows: list[dict[str, str]], cols: tuple[str, ...]) -> None:
    # A list, so no rows (compat-matrix --releases-only with no release in range) leaves the header's width.
    widths = {c: max([len(c), *(len(r.get(c, "")) for r in rows)]) for c in cols}
    print("| " + " | ".join(c.ljust(widths[c]) for c in cols) + " |")
    print("|" + "|".join("-" * (widths[c] + 2) for c in cols) + "|")
    for r in rows:
        print("| " + " | ".join(r.get(c, "").ljust(widths[c]) for c in cols) + " |")
