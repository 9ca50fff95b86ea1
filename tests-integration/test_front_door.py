"""The front door (``open_sessions``) on the real stack: JSONL backend and checkpoint policy found by entry point.

Restarts are real processes; "nothing written" is proven by the stored file's bytes; every async test runs on
asyncio and trio.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from dsh.session_persistence import (
    BackendNotFoundError,
    Host,
    PersistenceCoordinator,
    SessionForkError,
    SessionIdCollisionError,
    SessionNotFoundError,
    SessionPersistenceError,
    SessionStore,
    open_sessions,
)
from dsh.session_persistence.events import TurnEnd, TurnStart
from dsh.session_persistence.loop import AgentLoop
from dsh.session_persistence.testing import (
    ErrorResponse,
    HangResponse,
    ScriptedAdapter,
    ScriptedTool,
    TextResponse,
    ToolCallResponse,
)
from dsh.session_persistence_jsonl import JsonlBackend

pytestmark = pytest.mark.anyio


def stored_files(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (what a process left on disk), but the listing's activity cache
    (``.dsh-activity.*``: a writer notes a lease it took even when it then refuses; never the truth)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".dsh-activity.")
    }


def add_tool() -> ScriptedTool:
    return ScriptedTool("add", output=lambda args, call_id: str(args["a"] + args["b"]))


async def test_persist_restart_resume_across_processes(tmp_path: Path) -> None:
    program = textwrap.dedent(
        """
        import sys
        import anyio
        from dsh.session_persistence import open_sessions
        from dsh.session_persistence.testing import ScriptedAdapter, ScriptedTool, TextResponse, ToolCallResponse

        add = ScriptedTool("add", output=lambda args, call_id: str(args["a"] + args["b"]))
        script = {
            "1": [ToolCallResponse((("call-1", "add", {"a": 2, "b": 3}),)), TextResponse("5")],
            "2": [TextResponse("10")],
        }[sys.argv[2]]

        async def main() -> None:
            model = ScriptedAdapter(script)
            async with open_sessions(sys.argv[1]) as sessions:
                agent = await sessions.resume_or_create("s1", model, [add])
                result = await agent.run_turn(sys.argv[3])
            seen = [m.role for m in model.requests[0].messages]
            print(result.turn, result.reason.kind, result.text, len(add.calls), ",".join(seen))

        anyio.run(main)
        """
    )
    script = tmp_path / "program.py"
    script.write_text(program, encoding="utf-8")
    root = tmp_path / "root"

    def run(which: str, text: str) -> str:
        done = subprocess.run(
            [sys.executable, str(script), str(root), which, text],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run("1", "What is 2 + 3?") == "1 completed 5 1 user"
    # The restarted process resumes: turn 2, the model sees turn 1's history, the tool is not run again.
    assert run("2", "And doubled?") == "2 completed 10 0 user,assistant,user,assistant,user"
    async with open_sessions(root) as sessions:
        view = await sessions.inspect("s1")
    assert [e.data.turn for e in view.events if type(e) is TurnEnd] == [1, 2]


async def test_stored_id_given_to_a_new_agent_loop_fails_before_the_turn_and_names_resume(tmp_path: Path) -> None:
    async with open_sessions(tmp_path) as sessions:
        agent = await sessions.create("s1", ScriptedAdapter([TextResponse("hi")]))
        await agent.run_turn("hello")
    before = stored_files(tmp_path)
    host = Host()
    host.load_entrypoints()
    store = SessionStore(host)
    model = ScriptedAdapter([TextResponse("never")])
    async with PersistenceCoordinator(host, JsonlBackend(str(tmp_path))):
        agent = AgentLoop(host, store, model, provider="p", model="m", session_id="s1")
        with pytest.raises(SessionIdCollisionError, match=r"already stored; continue it with AgentLoop\.resume"):
            await agent.run_turn("again")
        assert model.requests == []  # the turn never started
        assert store.get("s1") is None  # the loop retired the session it created
        with pytest.raises(RuntimeError, match="closed"):
            await agent.run_turn("again")
    # The coordinator's exit raised nothing (no ExceptionGroup) and nothing was written.
    assert stored_files(tmp_path) == before


async def test_front_door_create_of_a_stored_id_raises_before_anything_runs(tmp_path: Path) -> None:
    async with open_sessions(tmp_path) as sessions:
        await (await sessions.create("s1", ScriptedAdapter([TextResponse("hi")]))).run_turn("hello")
    before = stored_files(tmp_path)
    async with open_sessions(tmp_path) as sessions:
        with pytest.raises(SessionIdCollisionError, match="resume"):
            await sessions.create("s1", ScriptedAdapter([]))
        agent = await sessions.resume_or_create("s1", ScriptedAdapter([TextResponse("again")]))
        assert agent.last_turn() == 1
    assert stored_files(tmp_path) != before  # the resume appended its seed marker, the create nothing
    async with open_sessions(tmp_path) as sessions:
        with pytest.raises(SessionNotFoundError):
            await sessions.resume("nope", ScriptedAdapter([]))


async def test_turn_result_reports_kind_text_error_and_abort(tmp_path: Path) -> None:
    hanging = anyio.Event()

    async def mark(request: object) -> None:
        hanging.set()

    async with open_sessions(tmp_path) as sessions:
        tool = add_tool()
        model = ScriptedAdapter(
            [
                ToolCallResponse((("c1", "add", {"a": 1, "b": 2}),), text="Let me add."),
                TextResponse("It is 3.", usage=(10, 4)),
                ErrorResponse("rate limited", "RATE_LIMIT"),
                TextResponse("cut short", finish="max-tokens"),
                HangResponse(hook=mark),
            ]
        )
        agent = await sessions.create("s1", model, [tool])
        ok = await agent.run_turn("1 + 2?")
        assert (ok.reason.kind, ok.text, ok.turn) == ("completed", "It is 3.", 1)
        assert [(u.input_tokens, u.output_tokens) for u in ok.usage] == [(10, 4)]
        assert ok.event.type == "turn/end" and ok.data is ok.event.data and ok.seq == ok.event.seq
        failed = await agent.run_turn("again")
        assert failed.reason.kind == "error" and failed.text == ""
        assert failed.reason.error is not None and failed.reason.error.code == "RATE_LIMIT"
        capped = await agent.run_turn("more")
        assert (capped.reason.kind, capped.text) == ("max-tokens", "cut short")

        async def cancel_soon() -> None:
            await hanging.wait()
            agent.cancel("user")

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_soon)
            with anyio.fail_after(10):
                aborted = await agent.run_turn("hang")
        assert aborted.reason.kind == "aborted"
        assert aborted.reason.cause is not None and type(aborted.reason.cause).__struct_config__.tag == "user"


async def test_resume_takes_provider_model_and_system_from_the_stored_header(tmp_path: Path) -> None:
    async with open_sessions(tmp_path) as sessions:
        agent = await sessions.create(
            "s1", ScriptedAdapter([TextResponse("a")]), provider="acme", model="m-1", system="Be brief."
        )
        await agent.run_turn("one")
    async with open_sessions(tmp_path) as sessions:
        model = ScriptedAdapter([TextResponse("b")], provider="ignored", model="ignored")
        agent = await sessions.resume("s1", model)
        assert (agent.provider, agent.model, agent.system) == ("acme", "m-1", "Be brief.")
        await agent.run_turn("two")
        assert model.requests[0].system == "Be brief."
        assert model.requests[0].config == {"provider": "acme", "model": "m-1"}


async def test_fork_a_stored_session_by_turn_without_writing_the_parent(tmp_path: Path) -> None:
    async with open_sessions(tmp_path) as sessions:
        agent = await sessions.create("parent", ScriptedAdapter([TextResponse("one"), TextResponse("two")]))
        await agent.run_turn("first")
        await agent.run_turn("second")
        agent.session.append("turn/start", {"turn": 3})  # a turn left open, as a crash leaves it
    before = stored_files(tmp_path)
    async with open_sessions(tmp_path) as sessions:
        # The open turn 3 ends "interrupted" in the repaired view (never written to the parent); turn 4 never started.
        with pytest.raises(SessionForkError, match=r"turn 4 .* has not ended \(last ended turn: 3\)") as info:
            await sessions.fork("parent", ScriptedAdapter([]), turn=4, child_id="nope")
        assert info.value.code == "INVALID_BOUNDARY"
        assert isinstance(info.value, SessionPersistenceError)  # the library's one error base (and a ValueError)
        with pytest.raises(SessionForkError, match="positive integer"):
            await sessions.fork("parent", ScriptedAdapter([]), turn=0)
        model = ScriptedAdapter([TextResponse("other two")])
        child = await sessions.fork("parent", model, turn=1, child_id="child")
        assert child.session.header.parent_session == "parent"
        result = await child.run_turn("second, differently")
        assert (result.turn, result.text) == (2, "other two")
        assert [m.role for m in model.requests[0].messages] == ["user", "assistant", "user"]
    after = stored_files(tmp_path)
    parent_files = {k: v for k, v in before.items() if "parent" in k}
    # The parent is byte-identical: no seed marker, and its open turn 3 was not repaired (a load would have).
    assert parent_files and all(after[k] == v for k, v in parent_files.items())
    async with open_sessions(tmp_path) as sessions:
        view = await sessions.inspect("child")
        starts = [e.data.turn for e in view.events if type(e) is TurnStart]
        assert starts == [1, 2] and view.inherited_event_count > 0


async def test_fork_of_a_live_session_by_turn(tmp_path: Path) -> None:
    async with open_sessions(tmp_path) as sessions:
        parent = await sessions.create("p", ScriptedAdapter([TextResponse("one"), TextResponse("two")]))
        await parent.run_turn("first")
        await parent.run_turn("second")
        child = await sessions.fork("p", ScriptedAdapter([TextResponse("alt")]), turn=1, child_id="c")
        assert (await child.run_turn("alt")).turn == 2
        assert parent.last_turn() == 2


async def test_body_error_propagates_unwrapped_and_the_session_is_kept(tmp_path: Path) -> None:
    class Boom(Exception):
        pass

    async def use() -> None:
        async with open_sessions(tmp_path) as sessions:
            agent = await sessions.create("s1", ScriptedAdapter([TextResponse("hi")]))
            await agent.run_turn("hello")
            raise Boom

    with pytest.raises(Boom):
        await use()
    async with open_sessions(tmp_path) as sessions:
        view = await sessions.inspect("s1")
        assert [e.type for e in view.events][-1] == "turn/end"
        assert [h.id for h in await sessions.list()] == ["s1"]


async def test_unknown_backend_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(BackendNotFoundError, match=r'unknown backend "nope" \(installed: .*jsonl'):
        async with open_sessions(tmp_path, backend="nope"):
            pass


async def test_default_root_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSH_SESSIONS_ROOT", str(tmp_path / "env-root"))
    async with open_sessions() as sessions:
        await (await sessions.create("s1", ScriptedAdapter([TextResponse("hi")]))).run_turn("hello")
    assert any(p.name.startswith("session.jsonl") for p in (tmp_path / "env-root").rglob("*"))


async def test_sessions_close_retires_one_agent(tmp_path: Path) -> None:
    async with open_sessions(tmp_path) as sessions:
        agent = await sessions.create("s1", ScriptedAdapter([TextResponse("hi")]))
        await agent.run_turn("hello")
        await sessions.close(agent)
        assert sessions.store.get("s1") is None
        again = await sessions.resume("s1", ScriptedAdapter([TextResponse("yo")]))
        assert (await again.run_turn("again")).turn == 2
