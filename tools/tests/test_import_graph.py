"""tools/import-graph measures the core's layers; every public face stays within the bound it reached (issue 23).

The figures count every import, those under ``TYPE_CHECKING`` and inside functions included. The bounds are on the
layers from each face in the tool's ``FACES`` down. The root face (``dsh.session_persistence``): 14 before the 0.3
flattening, 11 after it, 10 since the coordinator's in-doubt settlement folded into ``durable`` (``in_doubt`` gone,
issue 24). The testing kit: 14 until the lifecycle cases' shared part joined the retention cases (13). The CLI
(``python -m dsh.session_persistence``): 16 until its walks joined ``_examine`` and ``__main__`` imported
``_cli._main`` itself (13).

Why the kit and the CLI stop at 13, not 10: ``_coordinator.service`` is 8 layers from the bottom (its core object
holds a ``Host`` and ``Session``s, 4 layers over the event values, and ``durable`` and the cold and live paths stack
on it), the rig and the CLI's stack construct a coordinator (9), and above them the kit's classes are a chain the
API snapshot fixes (``BackendConformance`` over ``LifecycleConformance`` over ``_RetentionCases``) and the CLI is
entry, dispatch, command and the shared examination module.
"""

from __future__ import annotations

import importlib.util
import itertools
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "import-graph"
TOP = "dsh.session_persistence"
WINGS = ("_model", "_wire", "_host", "_backends", "_coordinator", "_loop")
#: The most layers from each face down; every face of the tool's FACES has one (test_every_face_has_a_bound).
FACE_BOUNDS = {
    TOP: 10,  # was 11 until in_doubt folded into durable
    **{f"{TOP}.{face}": 9 for face in ("events", "backend", "hookspecs", "loop", "repair", "invariant", "encryption")},
    f"{TOP}.testing": 13,  # was 14 until _lifecycle_base joined _lifecycle_retention
    f"{TOP}.testing.fixtures": 10,
    f"{TOP}.__main__": 13,  # was 16 until _walk and _verify_walk joined _examine
}


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


def over_bound(found: dict[str, Any]) -> dict[str, list[str]]:
    """The chain of each face that is deeper than its bound (a face the graph lacks has none)."""
    return {face: chain for face, chain in found["face_chains"].items() if len(chain) > FACE_BOUNDS[face]}


def test_every_face_has_a_bound(tool: ModuleType) -> None:
    assert sorted(tool.FACES) == sorted(FACE_BOUNDS)


@pytest.mark.parametrize("face", sorted(FACE_BOUNDS))
def test_every_face_is_within_its_bound(found: dict[str, Any], face: str) -> None:
    assert face in found["faces"], face
    assert face not in over_bound(found), found["face_chains"][face]


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


def _face_file(face: str) -> str:
    """The planted file of a face: the root and ``testing`` are packages, the others modules."""
    name = face.removeprefix(TOP).lstrip(".")
    return {"": "__init__", "testing": "testing.__init__"}.get(name, name)


@pytest.mark.parametrize("face", sorted(FACE_BOUNDS))
@pytest.mark.parametrize("extra", [0, 1])
def test_a_face_one_layer_over_its_bound_fails(tool: ModuleType, tmp_path: Path, face: str, extra: int) -> None:
    # face -> _deep.m1 -> ... : exactly the bound passes, one module more is reported with its chain.
    length = FACE_BOUNDS[face] + extra
    chain = [f"_deep.m{i}" for i in range(1, length)]
    modules = {_face_file(face): f"import {TOP}.{chain[0]}\n"}
    for here, below in itertools.pairwise(chain):
        modules[here] = f"import {TOP}.{below}\n"
    modules[chain[-1]] = ""
    found = tool.figures(tool.graph(_plant(tmp_path, modules), TOP))
    assert found["faces"] == {face: length}
    assert over_bound(found) == ({face: [face, *(f"{TOP}.{m}" for m in chain)]} if extra else {})
