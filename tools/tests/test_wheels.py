"""tools/wheels: a clone installs in one documented command (issue #36 item 12).

For real: every distribution's wheel is built into one folder, a fresh venv gets the third-party requirements
those wheels declare from the index, then the documented install resolves every dsh-* distribution from that folder
alone (`--no-index --find-links`), extras included, and the installed command runs. The pip fallback (a machine
with only python3 + pip) builds a wheel with the same files as uv's.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "wheels"
BASE_PYTHON = str(getattr(sys, "_base_executable", sys.executable))  # has pip; the hatch env may not
#: The documented install (README.md, README.zh.md, packages/dsh-sessions/README*.md) and an extra of it.
BUILD_LINE = "tools/wheels dist/"
INSTALL_LINE = "pip install --find-links dist/ dsh-sessions"
EXTRA_LINE = "pip install --find-links dist/ 'dsh-session-persistence[encryption]'"
DOCS = [REPO / "README.md", REPO / "README.zh.md", *sorted((REPO / "packages" / "dsh-sessions").glob("README*.md"))]
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?([^;]*)(?:;(.*))?$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600, **kw)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout}{proc.stderr}"
    return proc  # type: ignore[no-any-return]


def requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        text = zf.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def third_party(wheels: dict[str, Path], wanted: dict[str, set[str]]) -> list[str]:
    """The non-dsh requirements of ``wanted`` ({distribution: extras}) and of the dsh ones they pull in."""
    out: list[str] = []
    todo, seen = list(wanted.items()), set()
    while todo:
        dist, extras = todo.pop()
        if (dist, frozenset(extras)) in seen:
            continue
        seen.add((dist, frozenset(extras)))
        for req in requires(wheels[dist]):
            m = _REQ.match(req)
            assert m is not None, req
            name, req_extras, marker = canonical(m.group(1)), m.group(2), m.group(4) or ""
            extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
            if extra is not None and extra.group(1) not in extras:
                continue
            if name in wheels:
                todo.append((name, {e.strip() for e in (req_extras or "").split(",") if e.strip()}))
            else:
                out.append(re.sub(r"(?:and\s+)?extra\s*==\s*['\"][^'\"]+['\"]", "", req).rstrip("; "))
    return sorted(set(out))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_docs_give_the_command_this_file_runs(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    assert BUILD_LINE in text and INSTALL_LINE in text, doc
    if doc.parent == REPO:
        assert EXTRA_LINE in text, doc


def test_a_clone_installs_from_its_wheels_alone(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = run([BASE_PYTHON, str(TOOL), str(dist)], cwd=REPO)
    wheels = {
        canonical(Path(line).name.split("-")[0]): Path(line) for line in built.stdout.splitlines() if line.strip()
    }
    packages = {canonical(p.parent.name) for p in (REPO / "packages").glob("*/pyproject.toml")}
    assert set(wheels) == packages and all(w.is_file() for w in wheels.values())
    assert "pip install --find-links" in built.stderr

    venv = tmp_path / "venv"
    run([BASE_PYTHON, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    # The index supplies only what is published (the third-party requirements); every dsh-* distribution must
    # come from the folder: with --no-index a sibling missing there fails the install.
    run([*pip, "install", *third_party(wheels, {"dsh-sessions": set(), "dsh-session-persistence": {"encryption"}})])
    run([*pip, "install", "--no-index", "--find-links", str(dist), "dsh-sessions"])
    run([*pip, "install", "--no-index", "--find-links", str(dist), "dsh-session-persistence[encryption]"])

    version = run([str(venv / "bin" / "dsh-sessions"), "--version"], cwd=tmp_path).stdout.splitlines()
    core = wheels["dsh-session-persistence"].name.split("-")[1]
    assert version[0] == f"dsh-sessions {core} (dsh-session-persistence)"
    listed = {line.split()[0] for line in version[1:]}
    assert listed == {"dsh-sessions", *json_safe_set(venv)}
    code = (
        "import dsh.sessions, cryptography, sys\n"
        "assert 'site-packages' in dsh.sessions.__file__, dsh.sessions.__file__\n"
        "print(len(dsh.sessions.SAFE_SET))\n"
    )
    assert run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path).stdout.strip() == "3"


def json_safe_set(venv: Path) -> list[str]:
    """What ``dsh.sessions.SAFE_SET`` names, as the installed package says."""
    code = "import dsh.sessions; print(' '.join(dsh.sessions.SAFE_SET))"
    return run([str(venv / "bin" / "python"), "-c", code]).stdout.split()


def test_with_only_pip_the_wheel_is_the_same(tmp_path: Path) -> None:
    with_uv = run([BASE_PYTHON, str(TOOL), str(tmp_path / "uv"), "dsh-sessions", "--builder", "uv"], cwd=REPO)
    with_pip = run([BASE_PYTHON, str(TOOL), str(tmp_path / "pip"), "dsh-sessions", "--builder", "pip"], cwd=REPO)
    assert "built with pip" in with_pip.stderr

    def files(out: str) -> set[str]:
        (wheel,) = out.split()
        with zipfile.ZipFile(wheel) as zf:
            return {n for n in zf.namelist() if not n.endswith("RECORD")}

    assert files(with_pip.stdout) == files(with_uv.stdout)
