"""The core's private modules stand in wings, each importing only the wings below it (TYPE_CHECKING imports too):
_model < _wire < _host < _backends < _coordinator < _loop. A planted upward import fails this test."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dsh" / "session_persistence"
WINGS = ("_model", "_wire", "_host", "_backends", "_coordinator", "_loop")


def _imported_wings(path: Path, package: list[str]) -> set[str]:
    """The wings (of this package) that ``path`` imports, relative and absolute, anywhere in the module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[list[str]] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = base + (node.module.split(".") if node.module else [])
            else:
                module = (node.module or "").split(".")
            targets.append(module)
            targets += [[*module, alias.name] for alias in node.names]
        elif isinstance(node, ast.Import):
            targets += [alias.name.split(".") for alias in node.names]
        for target in targets:
            if target[:2] == ["dsh", "session_persistence"] and len(target) > 2 and target[2] in WINGS:
                found.add(target[2])
    return found


def wing_violations(root: Path) -> list[str]:
    out = []
    for wing in WINGS:
        for path in sorted((root / wing).rglob("*.py")):
            package = ["dsh", "session_persistence", *path.relative_to(root).parent.parts]
            for other in _imported_wings(path, package):
                if WINGS.index(other) > WINGS.index(wing):
                    out.append(f"{path.relative_to(root)} imports the higher wing {other}")
    return out


def test_no_wing_imports_a_higher_wing() -> None:
    assert wing_violations(PACKAGE) == []


def test_every_private_module_stands_in_a_wing() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("_*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert loose == [], f"private modules outside the wings: {loose}"


@pytest.mark.parametrize(
    "planted",
    [
        "from .._loop.agent import AgentLoop\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..(_coordinator).service import X\n",
        "import dsh.session_persistence._host.host\n",
    ],
)
def test_a_planted_upward_import_is_found(tmp_path: Path, planted: str) -> None:
    root = tmp_path / "session_persistence"
    for wing in WINGS:
        (root / wing).mkdir(parents=True)
        (root / wing / "__init__.py").write_text("")
    (root / "_model" / "planted.py").write_text(planted.replace("(_coordinator)", "_coordinator"))
    assert [v.split(" imports")[0] for v in wing_violations(root)] == ["_model/planted.py"]


def test_values_spell_out_the_json_safe_bound() -> None:
    # _model.values imports nothing of the core (one layer fewer under every event); its bound must stay jsonvalue's.
    from dsh.session_persistence._model import jsonvalue, values

    assert values.MAX_SAFE_INTEGER == jsonvalue.MAX_SAFE_INTEGER
    assert _imported_wings(PACKAGE / "_model" / "values.py", ["dsh", "session_persistence", "_model"]) == set()
