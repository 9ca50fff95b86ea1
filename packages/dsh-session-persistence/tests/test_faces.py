"""The public faces: every private core module is banned outside the core distribution (ruff TID251).

After adding or removing a private core module, rewrite the ban list in the root ``pyproject.toml`` with::

    python packages/dsh-session-persistence/tests/test_faces.py --write
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "packages" / "dsh-session-persistence" / "src" / "dsh" / "session_persistence"


def private_modules() -> set[str]:
    """``dsh.session_persistence._x`` and ``dsh.session_persistence.testing._x`` for every private module or package."""
    out: set[str] = set()
    for folder, prefix in (
        (PACKAGE, "dsh.session_persistence"),
        (PACKAGE / "testing", "dsh.session_persistence.testing"),
    ):
        for entry in folder.iterdir():
            name = entry.name
            if not name.startswith("_") or name.startswith("__"):
                continue
            if entry.is_dir() and (entry / "__init__.py").exists():
                out.add(f"{prefix}.{name}")
            elif name.endswith(".py"):
                out.add(f"{prefix}.{name[:-3]}")
    return out


def banned_modules() -> set[str]:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[tool.ruff.lint.flake8-tidy-imports.banned-api]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r'^"([\w.]+)"\.msg\s*=', section, re.MULTILINE))


def test_every_private_core_module_is_banned_outside_the_core() -> None:
    missing = private_modules() - banned_modules()
    assert not missing, (
        f"not banned outside the core yet: {sorted(missing)}; run "
        "python packages/dsh-session-persistence/tests/test_faces.py --write"
    )
    stale = {m for m in banned_modules() - private_modules() if m.startswith("dsh.session_persistence.")}
    assert not stale, f"banned modules that no longer exist: {sorted(stale)}"


def test_the_ban_is_lifted_only_inside_the_core_distribution() -> None:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^select = \[[^\]]*"TID251"', text, re.MULTILINE)
    ignores = re.findall(r'^"([^"]+)" = \[[^\]]*"TID251"', text, re.MULTILINE)
    assert ignores == ["packages/dsh-session-persistence/**"]


def test_nothing_outside_the_host_calls_its_hooks_directly() -> None:
    offenders = []
    for path in sorted((REPO / "packages").glob("*/src/**/*.py")):
        if path.name == "_host.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\bhost\.hook\.|\bself\.hook\.", line):
                offenders.append(f"{path.relative_to(REPO)}:{number}")
    assert not offenders, f"call the Host's method named after the hook instead: {offenders}"


def test_documentation_examples_use_public_faces_only() -> None:
    offenders = []
    for path in sorted([*REPO.glob("docs/*.md"), *REPO.glob("README*.md"), *REPO.glob("packages/*/README*.md")]):
        for block in re.findall(r"^```python\n(.*?)^```$", path.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL):
            offenders += [
                f"{path.relative_to(REPO)}: {m}" for m in re.findall(r"dsh\.session_persistence\._\w+", block)
            ]
    assert not offenders


BAN_HEADER = "[tool.ruff.lint.flake8-tidy-imports.banned-api]"
BAN_MESSAGE = (
    "private to dsh-session-persistence: import from a public face "
    "(dsh.session_persistence, .events, .backend, .loop, .repair, .invariant, .hookspecs, .testing)"
)


def write_ban_list() -> None:
    """Rewrite the banned-api table's entries from the core's private modules (the comment lines are kept)."""
    path = REPO / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(BAN_HEADER, 1)
    section, sep, tail = rest.partition("\n[")
    comments = [line for line in section.splitlines() if line.startswith("#")]
    entries = [f'"{module}".msg = "{BAN_MESSAGE}"' for module in sorted(private_modules())]
    body = "\n".join(["", *comments, *entries, ""]) + ("\n" if sep else "")
    path.write_text(
        head + BAN_HEADER + body + sep.lstrip("\n") + tail if sep else head + BAN_HEADER + body, encoding="utf-8"
    )


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: test_faces.py --write")
    write_ban_list()
