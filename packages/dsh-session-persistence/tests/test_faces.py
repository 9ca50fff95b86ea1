"""The public faces: every private core module is banned outside the core distribution (ruff TID251)."""

from __future__ import annotations

import re
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
    assert not missing, f"add to [tool.ruff.lint.flake8-tidy-imports.banned-api] in pyproject.toml: {sorted(missing)}"
    stale = {m for m in banned_modules() - private_modules() if m.startswith("dsh.session_persistence.")}
    assert not stale, f"banned modules that no longer exist: {sorted(stale)}"


def test_the_ban_is_lifted_only_inside_the_core_distribution() -> None:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^select = \[[^\]]*"TID251"', text, re.MULTILINE)
    ignores = re.findall(r'^"([^"]+)" = \[[^\]]*"TID251"', text, re.MULTILINE)
    assert ignores == ["packages/dsh-session-persistence/**"]
