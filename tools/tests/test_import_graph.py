"""tools/import-graph measures the core's layers; the core stays within the bound it reached (issue 23).

The figures count every import, those under ``TYPE_CHECKING`` and inside functions included. The bound is on
the layers from the root face down (``dsh.session_persistence``): 14 before the 0.3 flattening, 11 after it
(10 once the coordinator's durable-write modules fold in-doubt settlement into ``durable``).
"""

from __future__ import annotations

import importlib.util
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "import-graph"
TOP = "dsh.session_persistence"
WINGS = ("_model", "_wire", "_host", "_backends", "_coordinator", "_loop")
ROOT_FACE_BOUND = 11
OTHER_FACE_BOUND = 9  # events, backend, hookspecs, loop, repair, invariant (not the testing kit, not the CLI)


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    loader = SourceFileLoader("import_graph", str(TOOL))
    spec = importlib.util.spec_from_loader("import_graph", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def found(tool: ModuleType) -> dict[str, object]:
    return tool.figures(tool.graph())  # type: ignore[no-any-return]


def test_the_root_face_is_within_its_bound(found: dict[str, Any]) -> None:
    assert found["faces"][TOP] <= ROOT_FACE_BOUND, found["face_chains"][TOP]


@pytest.mark.parametrize("face", ["events", "backend", "hookspecs", "loop", "repair", "invariant"])
def test_every_other_face_is_within_its_bound(found: dict[str, Any], face: str) -> None:
    assert found["faces"][f"{TOP}.{face}"] <= OTHER_FACE_BOUND, found["face_chains"][f"{TOP}.{face}"]


def test_no_cycle_spans_two_wings(found: dict[str, Any]) -> None:
    for cycle in found["cycles"]:
        wings = {m.split(".")[2] for m in cycle}
        assert len(wings) == 1 and wings <= set(WINGS), cycle


def _plant(root: Path, modules: dict[str, str]) -> Path:
    package = root / "dsh" / "session_persistence"
    for name, text in modules.items():
        path = package / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_a_type_checking_import_is_a_layer_and_a_cycle_one_node(tool: ModuleType, tmp_path: Path) -> None:
    package = _plant(
        tmp_path,
        {
            "__init__": "from ._loop.a import A\n",
            "_loop/__init__": "",
            "_loop.a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
            "_loop.b": "def f():\n    from .._model import c\n",
            "_model/__init__": "",
            "_model.c": "from . import d\n",
            "_model.d": "from .c import X\n",
        },
    )
    found = tool.figures(tool.graph(package, TOP))
    assert found["cycles"] == [[f"{TOP}._model.c", f"{TOP}._model.d"]]
    # root -> a -> b (TYPE_CHECKING) -> c|d (inside a function, then a cycle counted once)
    assert found["faces"][TOP] == 4
    assert found["face_chains"][TOP][-1] == f"{TOP}._model.c|{TOP}._model.d"


def test_the_tool_prints_the_figures(tool: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert tool.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("modules ") and f"from {TOP}:" in out
