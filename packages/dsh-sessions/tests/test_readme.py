"""The README's usage example runs (on asyncio and trio), against a temporary root instead of /tmp."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.anyio

README = Path(__file__).resolve().parent.parent / "README.md"
RUN_LINE = "anyio.run(main)"
ROOT = "/tmp/dsh-sessions-readme"


def _usage_block() -> str:
    section = README.read_text(encoding="utf-8").split("## Usage", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert isinstance(block, str)
    return block


async def test_usage_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _usage_block().rstrip()
    assert source.endswith(RUN_LINE) and ROOT in source
    source = source.removesuffix(RUN_LINE).replace(ROOT, str(tmp_path))
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(source, str(README), "exec"), namespace)
    await namespace["main"]()
    assert capsys.readouterr().out.splitlines() == ["hi 3"]
