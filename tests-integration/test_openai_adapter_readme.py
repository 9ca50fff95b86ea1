"""The OpenAI adapter README's two-tool program, run as a user would (two processes) against the loopback fake server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from dsh.session_adapter_openai.testing import FakeChatServer, text_reply, tool_call_reply

README = Path(__file__).resolve().parents[1] / "packages" / "dsh-session-adapter-openai" / "README.md"


def two_tool_block() -> str:
    text = README.read_text(encoding="utf-8")
    text = text[text.index("<!-- example: two-tools -->") :]
    match = re.search(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    assert match is not None
    return match.group(1)


def test_two_tool_program_runs_and_resumes(tmp_path: Path) -> None:
    script = tmp_path / "weather.py"
    script.write_text(two_tool_block(), encoding="utf-8")
    replies = [
        tool_call_reply(
            [("call_1", "get_weather", {"city": "Lisbon"}), ("call_2", "save_note", {"text": "Lisbon: sunny"})]
        ),
        text_reply("It is sunny in Lisbon; I saved a note."),
        text_reply("You asked about Lisbon."),
    ]
    with FakeChatServer(replies) as server:
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test-key", "MODEL": "fake-model"}
        runs = []
        for question in ("What is the weather in Lisbon? Save it as a note.", "Which city did I ask about?"):
            done = subprocess.run(
                [sys.executable, str(script), str(tmp_path / "sessions"), question],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                env=env,
            )
            assert done.returncode == 0, done.stderr
            runs.append(done.stdout.strip())
    assert runs == [
        "completed: It is sunny in Lisbon; I saved a note. (notes: ['Lisbon: sunny'])",
        "completed: You asked about Lisbon. (notes: [])",
    ]
    first, second, third = server.requests
    assert [t["function"]["name"] for t in first["tools"]] == ["get_weather", "save_note"]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "tool", "tool"]
    assert second["messages"][2]["content"] == "Sunny, 21 C in Lisbon"
    # The second process resumed the stored conversation: the model sees all of it.
    assert [m["role"] for m in third["messages"]] == ["user", "assistant", "tool", "tool", "assistant", "user"]
    assert server.paths == ["/v1/chat/completions"] * 3
    lines = [line for line in two_tool_block().splitlines() if line.strip()]
    assert len(lines) <= 20


def test_fake_server_example_runs_as_documented(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    text = text[text.index("<!-- example: fake-server -->") :]
    match = re.search(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    assert match is not None
    printed = re.search(r"It prints `(.*?)`\.", text)
    assert printed is not None
    script = tmp_path / "fake_server.py"
    script.write_text(match.group(1), encoding="utf-8")
    for backend_name in ("asyncio", "trio"):
        program = match.group(1).replace(
            "anyio.run(main, sys.argv[1])", f"anyio.run(main, sys.argv[1], backend={backend_name!r})"
        )
        script.write_text(program, encoding="utf-8")
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path / backend_name)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == printed.group(1)
