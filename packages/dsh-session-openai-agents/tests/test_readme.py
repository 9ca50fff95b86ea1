"""The README's example compiles and imports only public names (its behaviour is the crash test's, which runs the
same calls through the SDK's Runner with a scripted model: tests-integration/test_openai_agents_crash.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_compiles_on_public_imports() -> None:
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    tree = ast.parse(block)
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert modules == {"agents", "dsh.session_openai_agents", "dsh.session_persistence"}
    compile(tree, str(README), "exec")
