"""On a real interpreter: a fresh venv with only the core and the JSONL backend refuses to start an agent and
names the install that fixes it; adding the `dsh-sessions` safe set (its wheel and the policy's) makes the same
program run. Wheels are built from the work tree with the repository's uv (tools/_wheeltools.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import _wheeltools as wt  # noqa: E402

PROGRAM = textwrap.dedent(
    """
    import sys
    import anyio
    from dsh.session_persistence import CheckpointPolicyMissingError, open_sessions
    from dsh.session_persistence.testing import ScriptedAdapter, TextResponse

    async def main() -> None:
        async with open_sessions(sys.argv[1]) as sessions:
            try:
                agent = await sessions.create("s1", ScriptedAdapter([TextResponse("ran")]))
            except CheckpointPolicyMissingError as exc:
                print("refused:", exc)
                return
            print((await agent.run_turn("hello")).text)

    anyio.run(main)
    """
)


def _run(venv: Path, script: Path, root: Path) -> str:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(script), str(root)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


def test_core_and_jsonl_alone_refuse_the_agent_and_the_safe_set_runs_it(tmp_path: Path) -> None:
    uv = wt.find_uv()
    dists = wt.workspace()
    wheels = {
        name: wt.build(uv, dists[name].path, tmp_path / "dist", sdist=False)
        for name in ("dsh-session-persistence", "dsh-session-persistence-jsonl")
    }
    python = str(getattr(sys, "_base_executable", sys.executable))
    venv = tmp_path / "venv"
    wt.make_venv(uv, venv, python, [str(w) for w in wheels.values()])
    assert wt.installed_version(venv, "dsh-session-checkpoint-policy") == "not installed"
    wt.assert_imported_from_venv(venv, ["session_persistence", "session_persistence_jsonl"])
    script = tmp_path / "agent.py"
    script.write_text(PROGRAM, encoding="utf-8")

    out = _run(venv, script, tmp_path / "store")
    assert out.startswith("refused:"), out
    assert "pip install dsh-session-checkpoint-policy" in out
    assert "pip install dsh-sessions" in out

    safe = [
        wt.build(uv, dists[n].path, tmp_path / "dist", sdist=False)
        for n in ("dsh-session-checkpoint-policy", "dsh-sessions")
    ]
    proc = wt.run(
        [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *map(str, safe)],
        capture_output=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _run(venv, script, tmp_path / "store") == "ran"
