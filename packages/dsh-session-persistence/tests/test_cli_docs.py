"""The documentation's code runs: the README's composition example, and the backend guide's example backend
passes the conformance kit. Also: every relative link in the README and docs/ resolves, and the two README
commands exist and are executable.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from dsh.session_persistence import Host
from dsh.session_persistence.testing import BackendConformance, BackendFactory, StorageContractConformance

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"
GUIDE = REPO / "docs" / "backend-guide.md"
ADAPTERS = REPO / "docs" / "model-adapters.md"


def python_block(path: Path, after: str | None = None) -> str:
    """The first ```python block of ``path`` (after the line ``after``, when given)."""
    text = path.read_text(encoding="utf-8")
    if after is not None:
        text = text[text.index(after) :]
    match = re.search(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    assert match is not None, f"no python block in {path}"
    return match.group(1)


def load_example_backend() -> types.ModuleType:
    name = "dsh_docs_example_backend"
    if name not in sys.modules:
        module = types.ModuleType(name)
        module.__file__ = str(GUIDE)
        sys.modules[name] = module
        exec(compile(python_block(GUIDE, "<!-- example: file-backend -->"), str(GUIDE), "exec"), module.__dict__)
    return sys.modules[name]


def test_readme_front_door_example_persists_restarts_and_resumes(tmp_path: Path) -> None:
    block = python_block(README, "<!-- example: front-door -->")
    assert len([line for line in block.splitlines() if line.strip()]) <= 15  # the promised size
    script = tmp_path / "example.py"
    script.write_text(block, encoding="utf-8")
    root = tmp_path / "sessions"
    outputs = []
    for _ in range(2):  # two processes: the second one resumes what the first stored
        result = subprocess.run(
            [sys.executable, str(script), str(root), "What is 2 + 3?"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout.strip())
    assert outputs == ["turn 1: completed: 5", "turn 2: completed: 5"]
    shown = subprocess.run(
        [sys.executable, "-m", "dsh.session_persistence", "--root", str(root), "show", "readme"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "turn 2 ended: completed" in shown.stdout


def test_adapter_guide_example_runs(tmp_path: Path) -> None:
    block = python_block(ADAPTERS, "<!-- example: adapter -->")
    assert "session_persistence._" not in block  # public imports only
    script = tmp_path / "adapter_example.py"
    script.write_text(block, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "root")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["completed The answer is 42. [4]", "error BAD_REQUEST", "open streams: 0"]


def test_readme_composition_example_runs(tmp_path: Path) -> None:
    script = tmp_path / "readme_example.py"
    script.write_text(python_block(README, "## Composing it yourself"), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    types_seen = eval(result.stdout)  # the example prints a list of event types
    assert types_seen[0] == "turn/start" and types_seen[-1] == "turn/end"
    assert "tool/call" in types_seen and "tool/result" in types_seen


def test_the_scripted_model_tools_and_log_builders_need_no_pytest() -> None:
    """What the README's example says: the testing face works in a plain install (only the kits and their rig,
    loaded on first use, need pytest)."""
    code = (
        "import sys\n"
        "sys.modules['pytest'] = None  # as if the [testing] extra were not installed\n"
        "from dsh.session_persistence.testing import ScriptedAdapter, ScriptedTool, TextResponse, one_turn_log\n"
        "ScriptedAdapter([TextResponse('hi')]); ScriptedTool('t'); one_turn_log()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


class TestDocsExampleBackendConformance(BackendConformance, StorageContractConformance):
    """The backend guide's example, run through the whole kit (and the storage-level contract cases)."""

    @pytest.fixture
    def backend_factory(self, tmp_path: Path) -> BackendFactory:
        cls: Any = load_example_backend().FileBackend
        return lambda: cls(tmp_path / "sessions")


def test_docs_example_backend_is_discoverable() -> None:
    module = load_example_backend()
    host = Host()
    host.register(module, name="example-file")
    assert host.dsh_session_backends()["example-file"] is module.FileBackend


def test_backend_guide_names_every_optional_primitive_kit_class_and_hook() -> None:
    """The guide is the backend author's whole reference: it names every optional primitive the backend face
    exports, every kit class the testing face exports, and every hook those classes let a subclass set."""
    from dsh.session_persistence import backend, testing

    text = GUIDE.read_text(encoding="utf-8")
    primitives = [name for name in backend.__all__ if name.startswith("Supports")]
    assert len(primitives) == 16 and f"{len(primitives)} separate" in text
    kits = [name for name in testing.__all__ if name.endswith("Conformance")]
    hooks: set[str] = set()
    for name in kits:
        for klass in getattr(testing, name).__mro__:
            if klass.__module__.startswith("dsh.session_persistence.testing"):
                hooks |= {n for n in vars(klass) if not n.startswith(("_", "test_"))}
    hooks -= {"conformance", "storage_rig", "pytestmark"}  # the kit's own fixtures, not hooks
    missing = [name for name in [*primitives, *kits, *sorted(hooks)] if f"`{name}" not in text]
    assert missing == []


def test_readme_commands_exist() -> None:
    text = README.read_text(encoding="utf-8")
    for command in ("tools/demo", "tools/run-tests"):
        assert f"```\n{command}\n```" in text
        assert os.access(REPO / command, os.X_OK), command


@pytest.mark.parametrize("doc", [README, *sorted((REPO / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path) -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
        if "://" in target:
            continue
        assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_readme_continue_after_crash_example_crashes_reconciles_and_continues(tmp_path: Path) -> None:
    block = python_block(README, "<!-- example: continue-after-crash -->")
    assert "session_persistence._" not in block  # public imports only
    script = tmp_path / "crash_example.py"
    script.write_text(block, encoding="utf-8")
    root = tmp_path / "pay"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), str(root), *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    crashed = run("crash")
    assert crashed.returncode == -9, crashed.stderr  # it really SIGKILLed itself inside the tool
    resumed = run()
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "turn 2: completed: Paid once. (1 charge)"
    shown = subprocess.run(
        [sys.executable, "-m", "dsh.session_persistence._cli", "--root", str(root), "show", "pay"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "reconciled pay [c1]: happened" in shown.stdout
    assert "(continues interrupted turn 1: no new user message)" in shown.stdout


def test_readme_encrypted_example_seals_what_it_stores(tmp_path: Path) -> None:
    block = python_block(README, "<!-- example: encrypted -->")
    assert "open_sessions(root, encryption=keys)" in block and "session_persistence._" not in block
    script = tmp_path / "encrypted_example.py"
    script.write_text(block, encoding="utf-8")
    root = tmp_path / "sessions"
    env = {k: v for k, v in os.environ.items() if k != "DSH_SESSIONS_ROOT"}
    env["DSH_SESSION_KEYS"] = "k1:" + base64.b64encode(bytes(range(32))).decode()

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False, env=env
        )

    made = run(str(script), str(root))
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == "sealed"
    stored = [p.read_bytes() for p in root.rglob("session.jsonl*")]
    assert len(stored) == 1 and b"4111" not in stored[0]  # the message is sealed at rest
    cli = ["-m", "dsh.session_persistence", "--root", str(root)]
    assert run(*cli, "list").returncode == 0  # headers stay plaintext
    assert run(*cli, "show", "secret").returncode == 7  # the events need the key
    shown = run(*cli, "--key-env", "DSH_SESSION_KEYS", "show", "secret")
    assert shown.returncode == 0 and "4111 1111 1111 1111" in shown.stdout, shown.stderr
