"""The README's program runs as written, as a user would (a process per run, on the JSONL default backend), and is
at most 20 lines of code; its other blocks compile. Its crash behaviour is tests-integration/test_pydantic_ai_crash.py,
which SIGKILLs this same program mid-tool."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = "<!-- example: durable-agent -->"


def program() -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^```python\n(.*?)^```$", text[text.index(MARKER) :], re.MULTILINE | re.DOTALL)
    assert match is not None
    return match.group(1)


def test_the_program_is_short_and_runs_twice_on_one_session(tmp_path: Path) -> None:
    assert len([line for line in program().splitlines() if line.strip()]) <= 20
    script = tmp_path / "durable_agent.py"
    script.write_text(program(), encoding="utf-8")
    for _ in range(2):  # the second process resumes the stored session: its history is the first run's
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path / "sessions")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == '{"send_email":"sent to a"}'
        assert done.stderr == ""  # no warning: the default backend is durable


def test_every_python_block_compiles_on_public_imports() -> None:
    blocks = re.findall(r"^```python\n(.*?)^```$", README.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    assert len(blocks) == 2
    for block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.module is not None and not any(p.startswith("_") for p in node.module.split("."))
        compile(tree, str(README), "exec")
