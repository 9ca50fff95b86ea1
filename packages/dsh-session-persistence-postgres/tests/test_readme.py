"""The README's Python examples run against the test server, on asyncio and trio."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
EXAMPLE_DSN = "host=127.0.0.1 port=5432 dbname=agents user=dsh"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_examples() -> None:
    assert len(_python_blocks()) >= 2


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
@pytest.mark.parametrize("index", range(len(_python_blocks())))
def test_readme_example_runs(postgres_dsn: str, index: int, loop: str) -> None:
    code = _python_blocks()[index]
    schema = f"readme_{uuid.uuid4().hex[:10]}"
    code = code.replace(f'"{EXAMPLE_DSN}"', repr(postgres_dsn)).replace('schema="agents"', f"schema={schema!r}")
    code = code.replace("anyio.run(main)", f"anyio.run(main, backend={loop!r})")
    exec(compile(code, f"README.md example {index + 1}", "exec"), {"__name__": "readme_example"})
