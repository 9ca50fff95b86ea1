"""Write the golden session logs of one recorded release, and the views that release itself reads from them.

Run it with an interpreter in which a *released* build is installed (not the work tree), for example::

    git worktree add --detach /tmp/rel-0.1.0 0b120c9           # the commit tools/releases.toml records
    uv venv /tmp/venv-0.1.0 && uv pip install --python /tmp/venv-0.1.0/bin/python \\
        /tmp/rel-0.1.0/packages/dsh-session-persistence \\
        /tmp/rel-0.1.0/packages/dsh-session-persistence-jsonl \\
        /tmp/rel-0.1.0/packages/dsh-session-checkpoint-policy
    /tmp/venv-0.1.0/bin/python packages/dsh-session-persistence-jsonl/tests/golden/generate.py

It writes ``v<jsonl version>/{zstd,none}/`` (one storage root per encoding) and ``v<version>/expected.json``.
The script only uses names that release exported from its public modules (``dsh.session_persistence``,
``.loop``, ``.testing``, ``dsh.session_persistence_jsonl``, ``dsh.session_checkpoint_policy``), so it keeps
running against the release it was written for; it refuses to run against an editable work-tree install.

Shapes per encoding:

- ``completed``: two finished turns, each a tool call then a streamed answer (packed chunk rows);
- ``forked``: a seeded child of ``completed`` forked after its first turn, plus one turn of its own;
- ``unpacked``: one streamed turn written with ``pack_chunks=False`` (one row per chunk);
- ``interrupted``: turn 2 dies (``os._exit`` in a child process) inside a tool body, after the checkpoint
  flush: crash repair is pending;
- ``torn``: a finished session whose last durable batch is cut in half (a torn tail);
- ``damaged``: a finished session with one byte flipped inside a middle batch (corruption).

``expected.json`` holds what the release's own ``inspect`` (nothing written) and ``load`` (repair committed,
torn tail cut) return for each session: header, inherited cut and every event's seq/type/data (``time`` too,
except for repair closers, which are stamped at load time), plus the file size after the load; or the typed
error's class name (the first one in its MRO that the release exports). One event per line.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from dsh.session_checkpoint_policy import NAME, CheckpointPolicy
from dsh.session_persistence import Host, PersistenceCoordinator, SessionPersistenceError, SessionStore

try:  # 0.2 and later: the codec lives on the backend face
    from dsh.session_persistence.backend import event_to_builtins, header_to_builtins
except ImportError:  # 0.1: exported from the top level
    from dsh.session_persistence import event_to_builtins, header_to_builtins  # type: ignore[attr-defined, no-redef]
from dsh.session_persistence.loop import AgentLoop
from dsh.session_persistence.testing import ScriptedAdapter, ScriptedTool, TextResponse, ToolCallResponse
from dsh.session_persistence_jsonl import JsonlBackend

HERE = Path(__file__).resolve().parent
CWD = "/golden/project"  # recorded in the headers; never touched on disk
ENCODINGS = ("zstd", "none")
TRANSCRIPTS = ("session.jsonl.zstd", "session.jsonl")


class Clock:
    """Deterministic milliseconds, so a rerun writes the same bytes."""

    def __init__(self) -> None:
        self.now = 1_767_225_600_000  # 2026-01-01T00:00:00Z

    def __call__(self) -> int:
        self.now += 7
        return self.now


def arith_tool(name: str, op: Any) -> ScriptedTool:
    return ScriptedTool(name, output=lambda args, call_id: str(op(args["a"], args["b"])))


def session_file(root: Path, session_id: str) -> Path:
    found = [p for p in root.rglob("session.jsonl*") if p.name in TRANSCRIPTS and p.parent.name == session_id]
    if len(found) != 1:
        raise SystemExit(f"expected one transcript for {session_id} under {root}, found {found}")
    return found[0]


async def run_turn(store: SessionStore, agent: AgentLoop, prompt: str, sizes: list[int] | None, root: Path) -> None:
    await agent.run_turn(prompt)
    await store.flush(agent.session)
    if sizes is not None:
        sizes.append(session_file(root, agent.session.id).stat().st_size)


async def write_finished(root: Path, compression: str) -> dict[str, list[int]]:
    """completed, forked, unpacked, and the two sessions later torn and damaged. Returns file sizes per turn."""
    host = Host()
    host.register(CheckpointPolicy(), name=NAME)
    store = SessionStore(host, clock=Clock())
    sizes: dict[str, list[int]] = {}
    add, mul = arith_tool("add", lambda a, b: a + b), arith_tool("mul", lambda a, b: a * b)
    async with PersistenceCoordinator(host, JsonlBackend(root, compression=compression)) as persistence:
        del persistence
        parent = store.create("completed", meta={"cwd": CWD})
        model = ScriptedAdapter(
            [
                ToolCallResponse((("call-1", "add", {"a": 2, "b": 3}),)),
                TextResponse("Two plus three is five, as the add tool says."),
                ToolCallResponse((("call-2", "mul", {"a": 4, "b": 5}),)),
                TextResponse("Four times five is twenty."),
            ]
        )
        agent = AgentLoop(host, store, model, [add, mul], provider="scripted", model="golden", session=parent)
        await run_turn(store, agent, "What is 2 + 3?", None, root)

        child = store.fork(parent, child_id="forked")
        child_model = ScriptedAdapter([TextResponse("Doubled, five becomes ten.")])
        child_agent = AgentLoop(host, store, child_model, [], provider="scripted", model="golden", session=child)
        await run_turn(store, child_agent, "Now double it.", None, root)
        child_agent.close()
        store.dispose(child)

        await run_turn(store, agent, "And 4 * 5?", None, root)
        agent.close()
        store.dispose(parent)

        # Three batches each (one per turn): the damage goes into the middle one, the tear into the last one.
        for session_id in ("torn", "damaged"):
            session = store.create(session_id, meta={"cwd": CWD})
            script = ScriptedAdapter([TextResponse(f"Answer {n} of the {session_id} session.") for n in (1, 2, 3)])
            loop = AgentLoop(host, store, script, [], provider="scripted", model="golden", session=session)
            sizes[session_id] = []
            for n in (1, 2, 3):
                await run_turn(store, loop, f"Question {n}?", sizes[session_id], root)
            loop.close()
            store.dispose(session)

    async with PersistenceCoordinator(host, JsonlBackend(root, compression=compression, pack_chunks=False)):
        session = store.create("unpacked", meta={"cwd": CWD})
        script = ScriptedAdapter([TextResponse("Every delta of this answer is its own row.")])
        loop = AgentLoop(host, store, script, [], provider="scripted", model="golden", session=session)
        await run_turn(store, loop, "Say something.", None, root)
        loop.close()
        store.dispose(session)
    return sizes


async def write_interrupted(root: Path, compression: str) -> None:
    """Runs in a child process: turn 2 dies inside a tool body, right after the policy flushed its tool/call."""
    host = Host()
    host.register(CheckpointPolicy(), name=NAME)
    store = SessionStore(host, clock=Clock())

    def crash(args: Any, call_id: str) -> None:
        os._exit(0)  # no cleanup, no flush: what SIGKILL leaves behind, deterministically

    pay = ScriptedTool("pay", side_effect=crash)
    note = ScriptedTool("note", output="noted")
    add = arith_tool("add", lambda a, b: a + b)
    async with PersistenceCoordinator(host, JsonlBackend(root, compression=compression)):
        session = store.create("interrupted", meta={"cwd": CWD})
        model = ScriptedAdapter(
            [
                ToolCallResponse((("call-1", "add", {"a": 1, "b": 1}),)),
                TextResponse("One plus one is two."),
                ToolCallResponse((("call-2", "pay", {"amount": 20}), ("call-3", "note", {"text": "paid"}))),
            ]
        )
        agent = AgentLoop(host, store, model, [add, pay, note], provider="scripted", model="golden", session=session)
        await run_turn(store, agent, "What is 1 + 1?", None, root)
        await agent.run_turn("Pay the deposit of 20 and note it.")
    raise SystemExit("the interrupted turn did not crash")


def tear(path: Path) -> None:
    """Cut the last 12 bytes: the last durable batch (a step's chunks, message and turn end) becomes a torn tail."""
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size - 12)


def damage(path: Path, sizes: list[int]) -> None:
    """Flip one byte in the middle of the second batch; the third batch stays valid after it."""
    data = bytearray(path.read_bytes())
    at = sizes[0] + (sizes[1] - sizes[0]) // 2
    data[at] ^= 0x20 if chr(data[at]).isalpha() else 0x01
    path.write_bytes(bytes(data))


def common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def public_error_name(exc: BaseException) -> str:
    """The first class in the error's MRO that the release exports from ``dsh.session_persistence``: a backend
    may raise a private subclass (JSONL 0.2's ``BatchDamage`` is a ``SessionPersistenceCorruptionError``), and
    only the exported name means the same thing to every later build."""
    import dsh.session_persistence as core

    exported = set(core.__all__)
    return next(cls.__name__ for cls in type(exc).__mro__ if cls.__name__ in exported)


def view_of(inspection: Any, stored: int | None) -> dict[str, Any]:
    events = []
    for event in inspection.events:
        wire = event_to_builtins(event)
        item = {"seq": wire["seq"], "type": wire["type"], "data": wire.get("data")}
        if stored is None or wire["seq"] < stored:
            item["time"] = wire["time"]
        for key in sorted(set(wire) - {"seq", "type", "data", "time"}):
            item[key] = wire[key]
        events.append(item)
    return {
        "header": header_to_builtins(inspection.meta),
        "inherited_event_count": inspection.inherited_event_count,
        "events": events,
    }


async def read_expected(root: Path, compression: str, session_id: str) -> dict[str, Any]:
    """What this release's inspect and load return for one session (on a copy: load may write)."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "root"
        shutil.copytree(root, copy)
        path = session_file(copy, session_id)
        out: dict[str, Any] = {
            "file": session_file(root, session_id).relative_to(root.parent).as_posix(),
            "size": path.stat().st_size,
        }
        async with PersistenceCoordinator(Host(), JsonlBackend(copy, compression=compression)) as persistence:
            try:
                stored = len((await persistence.read_from(session_id, 0)).events)
            except SessionPersistenceError as exc:
                out["error"] = public_error_name(exc)
                for name, read in (("inspect", persistence.inspect), ("load", persistence.load)):
                    try:
                        await read(session_id)
                    except SessionPersistenceError as again:
                        if type(again) is not type(exc):
                            raise SystemExit(f"{session_id}: {name} raised {again!r}, read_from {exc!r}") from again
                    else:
                        raise SystemExit(f"{session_id}: {name} succeeded where read_from failed") from exc
                out["size_after_load"] = path.stat().st_size
                return out
            out["stored_events"] = stored
            out["inspect"] = view_of(await persistence.inspect(session_id), stored)
            out["load"] = view_of(await persistence.load(session_id), stored)
            out["size_after_load"] = path.stat().st_size
        # How many leading bytes the load kept: everything before the torn frame (the repair goes after them).
        before, after = session_file(root, session_id).read_bytes(), path.read_bytes()
        out["bytes_kept"] = common_prefix(before, after)
        return out


def check_shapes(expected: dict[str, dict[str, Any]]) -> None:
    """The generated files are what their names say (checked with the release's own reader)."""
    interrupted = expected["interrupted"]
    closers = interrupted["inspect"]["events"][interrupted["stored_events"] :]
    assert [e["type"] for e in closers][-1:] == ["turn/end"], closers
    assert interrupted["load"]["events"] == interrupted["inspect"]["events"][: len(interrupted["load"]["events"])]
    assert len(interrupted["load"]["events"]) == len(interrupted["inspect"]["events"])
    assert expected["forked"]["load"]["inherited_event_count"] > 0
    assert expected["forked"]["load"]["header"]["isSeeded"] is True
    torn = expected["torn"]
    assert torn["bytes_kept"] < torn["size"], torn
    last = torn["load"]["events"][-1]
    assert (last["type"], last["data"]) == ("turn/end", {"turn": 3, "reason": {"kind": "interrupted"}}), torn
    assert expected["damaged"]["error"] == "SessionPersistenceCorruptionError", expected["damaged"]
    for name in ("completed", "unpacked"):
        assert expected[name]["size_after_load"] == expected[name]["size"]
        assert expected[name]["load"] == expected[name]["inspect"]


def dump_expected(value: Any, level: int = 0, key: str | None = None) -> str:
    """JSON indented by one space per level, except that each event of an ``events`` list is one line: a diff of a
    regenerated file names the events that changed, and a reader follows a session one event per line."""
    pad = " " * (level + 1)
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(k)}: {dump_expected(v, level + 1, k)}" for k, v in sorted(value.items())]
    elif isinstance(value, list) and value and key == "events":
        items = [pad + json.dumps(event, sort_keys=True) for event in value]
    elif isinstance(value, list) and value:
        items = [pad + dump_expected(item, level + 1) for item in value]
    else:
        return json.dumps(value, sort_keys=True)
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    return opening + "\n" + ",\n".join(items) + "\n" + " " * level + closing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write v<version>/ into")
    parser.add_argument("--child", nargs=2, metavar=("ROOT", "COMPRESSION"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        anyio.run(write_interrupted, Path(args.child[0]), args.child[1])
        return 1
    import dsh.session_persistence as core

    if Path(core.__file__).resolve().is_relative_to(HERE.parents[3]):
        raise SystemExit(f"dsh.session_persistence comes from this work tree ({core.__file__}), not a release")
    version = importlib.metadata.version("dsh-session-persistence-jsonl")
    out = args.out / f"v{version}"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    expected: dict[str, Any] = {
        "generated_by": {
            dist: importlib.metadata.version(dist)
            for dist in ("dsh-session-persistence", "dsh-session-persistence-jsonl", "dsh-session-checkpoint-policy")
        },
        "encodings": {},
    }
    for compression in ENCODINGS:
        root = out / compression
        sizes = anyio.run(write_finished, root, compression)
        subprocess.run([sys.executable, __file__, "--child", str(root), compression], check=True)
        # The writer lease's lock files (0.2 and later) name the holder's pid and host: runtime state that differs
        # on every run, not part of the log, so they are not kept (a later build makes its own).
        for lock in root.rglob("session.lock"):
            lock.unlink()
        tear(session_file(root, "torn"))
        damage(session_file(root, "damaged"), sizes["damaged"])
        views = {}
        for session_id in ("completed", "forked", "unpacked", "interrupted", "torn", "damaged"):
            views[session_id] = anyio.run(read_expected, root, compression, session_id)
        check_shapes(views)
        expected["encodings"][compression] = views
        # The activity index and journal (0.3 and later) are caches a listing rebuilds from the logs; their records
        # name writer pids and inode numbers, which differ on every run, so they are not kept either.
        for cache in root.glob(".dsh-activity*"):
            cache.unlink()
    text = dump_expected(expected) + "\n"
    if json.loads(text) != expected:
        raise SystemExit("dump_expected does not round-trip")  # the layout must never change the content
    (out / "expected.json").write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
