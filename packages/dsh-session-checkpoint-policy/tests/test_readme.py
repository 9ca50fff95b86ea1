"""The README's usage example is executed here (on asyncio and trio), so it cannot rot."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.anyio

README = Path(__file__).resolve().parent.parent / "README.md"
RUN_LINE = "anyio.run(main)"


def _usage_block() -> str:
    """The one ``python`` block of the README's "Usage" section."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Usage", 1)[1].split("\n## ", 1)[0]
    blocks: list[str] = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    (block,) = blocks
    return block


def test_usage_block_ends_with_anyio_run() -> None:
    assert _usage_block().rstrip().endswith(RUN_LINE)


async def test_usage_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    # Execute the block without its last line, then await main() on the test's own backend (asyncio or trio).
    source = _usage_block().rstrip().removesuffix(RUN_LINE)
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(source, str(README), "exec"), namespace)
    await namespace["main"]()
    out = capsys.readouterr().out.splitlines()
    assert out == ["durable at dispatch: ['turn/start', 'step/start', 'tool/call']", "deployed"]


async def test_usage_example_without_the_policy_is_not_durable_at_dispatch(capsys: pytest.CaptureFixture[str]) -> None:
    # Negative control: the same example with the policy's registration removed sees nothing durable.
    source = _usage_block().rstrip().removesuffix(RUN_LINE)
    registration = 'host.register(CheckpointPolicy(), name="session-checkpoint-policy")'
    assert registration in source
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(source.replace(registration, "pass"), str(README), "exec"), namespace)
    await namespace["main"]()
    out = capsys.readouterr().out.splitlines()
    assert out == ["durable at dispatch: []", "deployed"]
