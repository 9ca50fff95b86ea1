"""tools/import-graph measures the core's layers; every public face stays within the bound it reached (issue 23).

The figures count every import, those under ``TYPE_CHECKING`` and inside functions included. The bounds are on the
layers from each face in the tool's ``FACES`` down. The root face (``dsh.session_persistence``): 14 before the 0.3
flattening, 11 after it, 10 since the coordinator's in-doubt settlement folded into ``durable`` (``in_doubt`` gone,
issue 24), 9 since the loop's runtime stopped importing ``tool_calls``. The testing kit: 14, then 13 when the
lifecycle cases' shared part joined the retention cases, then 10. The CLI (``python -m dsh.session_persistence``):
16, then 13 when its walks joined ``_examine``, then 10.

How the kit and the CLI reached 10 (issue 23): ``_coordinator.service`` went from 8 layers to 6. The backend
protocol no longer imports the listing (``SupportsListPage`` lives there); the core object (``state``) reaches the
host and the durable writes through two small protocols, so it imports neither ``_host`` nor ``durable``, and the cold
path, the live path and ``durable`` sit side by side one layer over it. Above the service: the kit is the face,
``_conformance`` (both public kit classes), a group of cases and the rig (with the cases' base); the CLI is
``__main__``, ``_cli._main``, a command, and ``_cli._context`` or a read helper that takes the coordinator, not the
command's ``Stack``.
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
    TOP: 9,  # was 10 until the loop's runtime stopped importing tool_calls
    **{f"{TOP}.{face}": 9 for face in ("events", "backend", "hookspecs", "repair", "invariant", "encryption")},
    f"{TOP}.loop": 8,  # was 9 (the runtime, as above)
    f"{TOP}.testing": 10,  # was 13 until the coordinator's service went from 8 layers to 6 and the kit lost two
    f"{TOP}.testing.fixtures": 6,
    f"{TOP}.__main__": 10,  # was 13 until the service went to 6 and the CLI's read helpers stopped importing _context
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
