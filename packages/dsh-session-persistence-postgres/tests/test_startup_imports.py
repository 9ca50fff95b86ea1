"""Installing this package costs a ``dsh-sessions`` process no psycopg import until a PostgresBackend is built.

Every ``dsh-sessions`` process loads each installed ``dsh.session`` plugin and asks it for its backend classes, so
this package's plugin module is imported by commands that never touch PostgreSQL; psycopg and psycopg_pool were
about 0.4 s of CPU of each such start. Each check runs in a fresh interpreter (a real subprocess): this test process
imported psycopg long ago. No server is needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import dsh.session_persistence_jsonl  # noqa: F401 - the default backend `list` builds below: it must be installed

#: Top-level modules that only a PostgreSQL backend in use needs.
POSTGRES_ONLY = ("psycopg", "psycopg_pool", "psycopg_binary", "psycopg_c")

_LOADED = f"sorted(m for m in sys.modules if m.partition('.')[0] in {POSTGRES_ONLY!r})"


def _python(code: str, *argv: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; it writes a JSON report to the file named by ``sys.argv[1]``."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *argv], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(Path(argv[0]).read_text())
    report["stdout"] = proc.stdout
    return report


def _cli(tmp_path: Path, *args: str) -> dict[str, Any]:
    """``python -m dsh.session_persistence ARGS`` (what the console script runs), then the modules it loaded."""
    code = f"""
        import json, runpy, sys
        report, sys.argv = sys.argv[1], ["dsh-sessions", *sys.argv[2:]]
        try:
            runpy.run_module("dsh.session_persistence", run_name="__main__", alter_sys=True)
            code = None
        except SystemExit as exit:
            code = exit.code
        with open(report, "w") as out:
            json.dump({{"exit": code, "loaded": {_LOADED}}}, out)
    """
    return _python(code, str(tmp_path / "report.json"), *args)


def test_cli_commands_load_the_plugin_without_psycopg(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    plugins = _cli(tmp_path, "--root", str(root), "plugins", "--json")
    assert plugins["exit"] == 0
    # The plugin was loaded in that process and asked for its backend, so the check below is not vacuous.
    listed = {p["name"]: p for p in json.loads(plugins["stdout"])["plugins"]}
    assert listed["postgres"]["backends"] == ["postgres"]
    assert plugins["loaded"] == []
    # A command that selects and builds a backend (the default, jsonl) among the installed ones.
    listing = _cli(tmp_path, "--root", str(root), "list", "--json")
    assert listing["exit"] == 0
    assert json.loads(listing["stdout"])["sessions"] == []
    assert listing["loaded"] == []


def test_psycopg_loads_when_a_backend_is_built(tmp_path: Path) -> None:
    code = f"""
        import json, sys
        import anyio
        from dsh.session_persistence import Host
        import dsh.session_persistence_postgres as package

        host = Host()
        host.load_entrypoints()
        found = host.dsh_session_backends()["postgres"]
        before = {_LOADED}
        backend = package.PostgresBackend("", schema="startup")  # builds its pool lazily: no server is contacted
        after = {_LOADED}
        anyio.run(backend.aclose)
        with open(sys.argv[1], "w") as out:
            json.dump({{"same": found is package.PostgresBackend, "before": before, "after": after}}, out)
    """
    report = _python(code, str(tmp_path / "report.json"))
    assert report["same"], "the entry point and the package must give the same class"
    assert report["before"] == []
    assert {"psycopg", "psycopg_pool"} <= set(report["after"])
