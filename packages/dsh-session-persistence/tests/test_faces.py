"""The public faces seen from inside the core: hooks are called through the Host, docs examples use faces only.

That nothing outside a distribution imports its private modules is one check for every distribution, tool and
test: ``tools/check-shape`` (its private-import walk; proven by ``tools/tests/test_package_shape.py``)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "packages" / "dsh-session-persistence" / "src" / "dsh" / "session_persistence"


def test_nothing_outside_the_host_calls_its_hooks_directly() -> None:
    offenders = []
    for path in sorted((REPO / "packages").glob("*/src/**/*.py")):
        if path.parent.name == "_host" and path.name == "host.py":
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
