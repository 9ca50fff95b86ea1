"""Host: registration rules of the boundary hooks, isolated notifications, flush order, discovery."""

from __future__ import annotations

import gc
import importlib.metadata
import logging
import sys
import textwrap
import types
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pluggy
import pytest
from dsh.session_persistence._host.boundaries import (
    CancelSignal,
    Deferred,
    ModelRequest,
    PreStepDecision,
    PreStepInput,
    ToolExecution,
    ToolExecutionResult,
    aborted_before_dispatch_result,
)
from dsh.session_persistence._host.host import Host, hookimpl
from dsh.session_persistence._host.session import SessionStore
from dsh.session_persistence._model.errors import SessionLifecycleError

BOUNDARY_HOOKS = ("llm_stream", "tools_execute", "agent_pre_step")


class FakeSession:
    def __init__(self, session_id: str = "s1") -> None:
        self.id = session_id


def registry(host: Host) -> dict[str, list[tuple[str, object]]]:
    """Everything registration can change: the plugins and, per hook, the ordered impls."""
    hooks = {
        name: [(impl.plugin_name, impl.function) for impl in caller.get_hookimpls()]
        for name, caller in vars(host.plugin_manager.hook).items()
        if not name.startswith("_")
    }
    return {"plugins": sorted(host.list_name_plugin(), key=lambda pair: pair[0]), **hooks}


def execution(**overrides: Any) -> ToolExecution:
    fields: dict[str, Any] = {"call_id": "c1", "name": "echo", "arguments": {"x": 1}, "signal": CancelSignal()}
    fields.update(overrides)
    return ToolExecution(**fields)


def pre_step_input() -> PreStepInput:
    return PreStepInput(messages=(), turn=1, step=1, signal=CancelSignal(), default=PreStepDecision.enter())


def model_request() -> ModelRequest:
    return ModelRequest(session_id="s1", messages=(), config={}, signal=CancelSignal())


# --- terminals owned by "runtimes" ---------------------------------------------------------------


class StreamTerminal:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    @hookimpl(trylast=True)
    async def llm_stream(self, request: ModelRequest) -> AsyncIterator[str]:
        self.log.append("adapter")
        yield "chunk-1"
        yield "chunk-2"


class ToolTerminal:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    @hookimpl(trylast=True)
    async def tools_execute(self, execution: ToolExecution) -> ToolExecutionResult:
        self.log.append("body")
        return ToolExecutionResult(content=({"type": "text", "text": "ok"},))


class PreStepTerminal:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    @hookimpl(trylast=True)
    async def agent_pre_step(self, agent: object, pre_step: PreStepInput) -> PreStepDecision:
        self.log.append("default")
        return pre_step.default


TERMINALS: dict[str, Callable[[list[str]], object]] = {
    "llm_stream": StreamTerminal,
    "tools_execute": ToolTerminal,
    "agent_pre_step": PreStepTerminal,
}


# --- refused terminals ----------------------------------------------------------------------------


class EagerStream:
    @hookimpl(trylast=True)
    def llm_stream(self, request: ModelRequest) -> object:
        async def gen() -> AsyncIterator[str]:
            yield "x"

        return gen()


class CoroutineStream:  # async def but not an async generator: awaitable, not an iterator
    @hookimpl(trylast=True)
    async def llm_stream(self, request: ModelRequest) -> object:
        return None


class EagerTool:
    @hookimpl(trylast=True)
    def tools_execute(self, execution: ToolExecution) -> object:
        return None


class AsyncGenTool:
    @hookimpl(trylast=True)
    async def tools_execute(self, execution: ToolExecution) -> AsyncIterator[object]:
        yield None


class EagerPreStep:
    @hookimpl(trylast=True)
    def agent_pre_step(self, agent: object, pre_step: PreStepInput) -> object:
        return None


@pytest.mark.parametrize(
    ("plugin_cls", "hook_name"),
    [
        (EagerStream, "llm_stream"),
        (CoroutineStream, "llm_stream"),
        (EagerTool, "tools_execute"),
        (AsyncGenTool, "tools_execute"),
        (EagerPreStep, "agent_pre_step"),
    ],
)
def test_non_async_terminal_is_refused_and_registry_unchanged(plugin_cls: type, hook_name: str) -> None:
    host = Host()
    host.register(ToolTerminal([]), name="unrelated")  # the registry is not empty before
    before = registry(host)
    plugin = plugin_cls()
    with pytest.raises(pluggy.PluginValidationError, match=f"hook '{hook_name}'.*terminal implementation must be"):
        host.register(plugin, name="bad")
    assert registry(host) == before
    assert not host.is_registered(plugin)
    assert host.get_plugin("bad") is None


def test_rejected_plugin_can_be_fixed_and_registered_under_the_same_name() -> None:
    host = Host()
    with pytest.raises(pluggy.PluginValidationError):
        host.register(EagerTool(), name="tools")
    assert host.register(ToolTerminal([]), name="tools") == "tools"


@pytest.mark.parametrize("hook_name", BOUNDARY_HOOKS)
def test_second_async_terminal_is_refused(hook_name: str) -> None:
    host = Host()
    first = TERMINALS[hook_name]([])
    host.register(first, name="runtime")
    before = registry(host)
    second = TERMINALS[hook_name]([])
    with pytest.raises(pluggy.PluginValidationError, match=r"exactly one terminal.*'runtime' already provides it"):
        host.register(second, name="other-runtime")
    assert registry(host) == before
    assert host.is_registered(first)
    assert not host.is_registered(second)


class StreamWrapper:
    @hookimpl(wrapper=True)
    def llm_stream(self, request: ModelRequest) -> Any:
        inner = yield
        return inner


class ToolWrapper:
    @hookimpl(wrapper=True)
    def tools_execute(self, execution: ToolExecution) -> Any:
        inner = yield
        return inner


class PreStepWrapper:
    @hookimpl(wrapper=True)
    def agent_pre_step(self, agent: object, pre_step: PreStepInput) -> Any:
        inner = yield
        return inner


def test_wrappers_are_accepted_alongside_the_terminal() -> None:
    host = Host()
    for hook_name in BOUNDARY_HOOKS:
        host.register(TERMINALS[hook_name]([]))
    wrappers = [StreamWrapper(), StreamWrapper(), ToolWrapper(), ToolWrapper(), PreStepWrapper()]
    for wrapper in wrappers:
        assert host.register(wrapper) is not None
    assert len(host.plugin_manager.hook.llm_stream.get_hookimpls()) == 3
    assert len(host.plugin_manager.hook.tools_execute.get_hookimpls()) == 3
    assert len(host.plugin_manager.hook.agent_pre_step.get_hookimpls()) == 2


def test_wrappers_before_terminal_then_terminal_is_accepted() -> None:
    host = Host()
    host.register(ToolWrapper())
    host.register(ToolTerminal([]))
    with pytest.raises(pluggy.PluginValidationError):
        host.register(ToolTerminal([]))


class OldStyleToolWrapper:
    @hookimpl(hookwrapper=True)
    def tools_execute(self, execution: ToolExecution) -> Any:
        yield


def test_old_style_hookwrapper_is_refused_on_a_boundary() -> None:
    host = Host()
    host.register(ToolTerminal([]))
    before = registry(host)
    with pytest.raises(pluggy.PluginValidationError, match=r"new-style wrappers \(wrapper=True\) only"):
        host.register(OldStyleToolWrapper())
    assert registry(host) == before


class EventWrapper:
    @hookimpl(wrapper=True)
    def session_event(self, session: FakeSession, event: object) -> Any:
        return (yield)


def test_wrapper_is_refused_on_a_one_by_one_hook() -> None:
    host = Host()
    with pytest.raises(pluggy.PluginValidationError, match="wrappers are not supported on this hook"):
        host.register(EventWrapper())
    assert host.get_plugins() == set()


# --- boundary chains -----------------------------------------------------------------------------


def test_boundary_without_terminal_is_a_clear_error() -> None:
    host = Host()
    with pytest.raises(RuntimeError, match='"tools_execute" has no terminal'):
        host.tools_execute(execution())
    with pytest.raises(RuntimeError, match='"llm_stream" has no terminal'):
        host.llm_stream(model_request())
    with pytest.raises(RuntimeError, match='"agent_pre_step" has no terminal'):
        host.agent_pre_step(object(), pre_step_input())


class LoggingToolWrapper:
    """A wrapper whose effects all live in the Deferred it returns (spec/policy.md §4.2 rule 3)."""

    def __init__(self, log: list[str], label: str) -> None:
        self.log = log
        self.label = label

    async def _around(self, inner: Awaitable[ToolExecutionResult], execution: ToolExecution) -> ToolExecutionResult:
        self.log.append(f"{self.label}:start")
        result = await inner
        self.log.append(f"{self.label}:end")
        return result

    @hookimpl(wrapper=True)
    def tools_execute(self, execution: ToolExecution) -> Any:
        inner = yield
        return Deferred(self._around, inner, execution)


@pytest.mark.anyio
async def test_tool_wrapper_chain_runs_nothing_at_hook_call_time() -> None:
    log: list[str] = []
    host = Host()
    host.register(ToolTerminal(log))
    host.register(LoggingToolWrapper(log, "inner"))
    host.register(LoggingToolWrapper(log, "outer"))  # last registered = outermost
    chain = host.tools_execute(execution())
    assert log == []
    result = await chain
    assert log == ["outer:start", "inner:start", "body", "inner:end", "outer:end"]
    assert result.content == ({"type": "text", "text": "ok"},)


class AbandoningToolWrapper:
    """Declines to run the inner chain (like a cooperative abort during a checkpoint)."""

    async def _refuse(self, inner: Deferred[ToolExecutionResult]) -> ToolExecutionResult:
        inner.close()
        return aborted_before_dispatch_result()

    @hookimpl(wrapper=True)
    def tools_execute(self, execution: ToolExecution) -> Any:
        inner = yield
        return Deferred(self._refuse, inner)


@pytest.mark.anyio
async def test_abandoned_chain_never_runs_the_terminal_and_never_warns() -> None:
    log: list[str] = []
    host = Host()
    host.register(ToolTerminal(log))
    host.register(LoggingToolWrapper(log, "inner"))
    host.register(AbandoningToolWrapper())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = await host.tools_execute(execution())
        gc.collect()
    assert result == aborted_before_dispatch_result()
    assert log == []
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


class LoggingStreamWrapper:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def _around(self, inner: AsyncIterator[str]) -> AsyncIterator[str]:
        self.log.append("wrapper:start")
        async for chunk in inner:
            yield chunk.upper()

    @hookimpl(wrapper=True)
    def llm_stream(self, request: ModelRequest) -> Any:
        inner = yield
        return self._around(inner)


@pytest.mark.anyio
async def test_stream_chain_is_lazy_until_the_first_pull() -> None:
    log: list[str] = []
    host = Host()
    host.register(StreamTerminal(log))
    host.register(LoggingStreamWrapper(log))
    stream = host.llm_stream(model_request())
    assert log == []
    chunks: list[object] = [chunk async for chunk in stream]
    assert chunks == ["CHUNK-1", "CHUNK-2"]
    assert log == ["wrapper:start", "adapter"]


@pytest.mark.anyio
async def test_pre_step_terminal_returns_the_default_through_a_wrapper() -> None:
    log: list[str] = []
    host = Host()
    host.register(PreStepTerminal(log))
    host.register(PreStepWrapper())
    pre_step = pre_step_input()
    chain = host.agent_pre_step(object(), pre_step)
    assert log == []
    assert await chain is pre_step.default
    assert log == ["default"]


# --- session lifecycle ---------------------------------------------------------------------------


class Listener:
    def __init__(self, calls: list[str], label: str, *, fail: bool = False) -> None:
        self.calls = calls
        self.label = label
        self.fail = fail

    def _hit(self, what: str) -> None:
        self.calls.append(f"{self.label}:{what}")
        if self.fail:
            raise RuntimeError(f"boom from {self.label}")

    @hookimpl
    def session_event(self, session: FakeSession, event: object) -> None:
        self._hit("event")

    @hookimpl
    def session_disposed(self, session: FakeSession) -> None:
        self._hit("disposed")

    @hookimpl
    def agent_error(self, agent: object, turn: int, step: int, error: Exception) -> None:
        self._hit("error")

    @hookimpl
    def agent_status(self, agent: object, status: str) -> None:
        self._hit(status)


def listeners_host(calls: list[str]) -> Host:
    host = Host()
    host.register(Listener(calls, "a"))
    host.register(Listener(calls, "b", fail=True))
    host.register(Listener(calls, "c"))
    return host


def test_session_event_listener_failure_is_logged_once_and_isolated(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []
    host = listeners_host(calls)
    with caplog.at_level(logging.ERROR, logger="dsh.session_persistence"):
        host.session_event(FakeSession("s1"), object())  # type: ignore[arg-type]
    # pluggy's call order (last registered first); the raising "b" does not stop "a".
    assert calls == ["c:event", "b:event", "a:event"]
    messages = [record.getMessage() for record in caplog.records]
    assert messages == ['session "s1": session/event listener threw: boom from b']
    assert caplog.records[0].exc_info is not None


def test_session_disposed_listener_failure_is_isolated(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []
    host = listeners_host(calls)
    with caplog.at_level(logging.ERROR, logger="dsh.session_persistence"):
        host.session_disposed(FakeSession("s2"))  # type: ignore[arg-type]
    assert calls == ["c:disposed", "b:disposed", "a:disposed"]
    assert [r.getMessage() for r in caplog.records] == ['session "s2": session/disposed listener threw: boom from b']


def test_agent_notifications_are_isolated(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []
    host = listeners_host(calls)
    with caplog.at_level(logging.ERROR, logger="dsh.session_persistence"):
        host.agent_error(object(), 1, 2, ValueError("x"))
        host.agent_status(object(), "idle")
    assert calls == ["c:error", "b:error", "a:error", "c:idle", "b:idle", "a:idle"]
    assert [r.getMessage() for r in caplog.records] == [
        "agent/error listener threw: boom from b",
        "agent/status listener threw: boom from b",
    ]


class EventRecorder:
    """``session_event`` implementations taking the spec's arguments in other shapes (a subset, another order)."""

    def __init__(self, calls: list[object], label: str) -> None:
        self.calls = calls
        self.label = label

    @hookimpl
    def session_event(self, event: object, session: FakeSession) -> None:
        self.calls.append((self.label, session.id, event))


class EventOnly:
    def __init__(self, calls: list[object]) -> None:
        self.calls = calls

    @hookimpl
    def session_event(self, event: object) -> None:
        self.calls.append(("event-only", event))


def test_session_event_follows_registrations_made_after_the_first_event() -> None:
    calls: list[object] = []
    host = Host()
    first = EventRecorder(calls, "first")
    host.register(first)
    host.session_event(FakeSession("s1"), "e1")  # type: ignore[arg-type]
    later = EventRecorder(calls, "later")
    host.register(later)
    host.register(EventOnly(calls), name="event-only")
    host.session_event(FakeSession("s2"), "e2")  # type: ignore[arg-type]
    host.unregister(first)
    host.unregister(name="event-only")
    host.session_event(FakeSession("s3"), "e3")  # type: ignore[arg-type]
    assert calls == [
        ("first", "s1", "e1"),
        ("event-only", "e2"),  # pluggy's order: last registered first
        ("later", "s2", "e2"),
        ("first", "s2", "e2"),
        ("later", "s3", "e3"),
    ]


class AsyncEventListener:
    @hookimpl
    async def session_event(self, session: FakeSession, event: object) -> None:
        raise AssertionError("never runs: the host closes it")


def test_session_event_listener_returning_a_coroutine_is_closed_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = Host()
    host.register(AsyncEventListener(), name="async-listener")
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.ERROR):
        warnings.simplefilter("always")
        host.session_event(FakeSession(), object())  # type: ignore[arg-type]
        gc.collect()
    assert [w for w in caught if "never awaited" in str(w.message)] == []
    assert len(caplog.records) == 1
    assert "returned an awaitable (plugin 'async-listener')" in caplog.records[0].getMessage()


class VetoingCreation:
    @hookimpl
    def session_created(self, session: FakeSession) -> None:
        raise PermissionError("vetoed")


def test_session_created_failure_propagates() -> None:
    host = Host()
    host.register(VetoingCreation())
    with pytest.raises(PermissionError, match="vetoed"):
        host.session_created(FakeSession())  # type: ignore[arg-type]


class FlushListener:
    def __init__(self, log: list[str], label: str, mode: str = "ok") -> None:
        self.log = log
        self.label = label
        self.mode = mode

    async def _flush(self) -> str:
        self.log.append(self.label)
        if self.mode == "async-fail":
            raise OSError(f"{self.label} failed")
        return self.label

    @hookimpl
    def session_flush(self, session: FakeSession) -> Awaitable[str] | None:
        if self.mode == "none":
            self.log.append(f"{self.label}:none")
            return None
        if self.mode == "sync-fail":
            raise OSError(f"{self.label} failed synchronously")
        return self._flush()


class TryFirstFlushListener(FlushListener):
    @hookimpl(tryfirst=True)
    def session_flush(self, session: FakeSession) -> Awaitable[str] | None:
        return super().session_flush(session)


class TryLastFlushListener(FlushListener):
    @hookimpl(trylast=True)
    def session_flush(self, session: FakeSession) -> Awaitable[str] | None:
        return super().session_flush(session)


@pytest.mark.anyio
async def test_flush_awaitables_are_in_registration_order() -> None:
    log: list[str] = []
    host = Host()
    host.register(FlushListener(log, "p1"))
    host.register(TryFirstFlushListener(log, "p2"))  # pluggy would call it first
    host.register(FlushListener(log, "p3", mode="none"))
    host.register(FlushListener(log, "p4", mode="sync-fail"))
    host.register(TryLastFlushListener(log, "p5", mode="async-fail"))  # pluggy would call it last
    host.register(FlushListener(log, "p6"))
    awaitables = host.session_flush(FakeSession())  # type: ignore[arg-type]
    assert log == ["p3:none"]  # only the synchronous parts ran
    assert len(awaitables) == 6
    outcomes: list[object] = []
    for awaitable in awaitables:
        try:
            outcomes.append(await awaitable)
        except OSError as exc:
            outcomes.append(str(exc))
    assert outcomes == ["p1", "p2", None, "p4 failed synchronously", "p5 failed", "p6"]
    assert log == ["p3:none", "p1", "p2", "p5", "p6"]


@pytest.mark.anyio
async def test_flush_implementations_follow_every_registration_after_the_first_barrier() -> None:
    """The barrier's implementations are resolved once, then again after each (un)registration: a plugin registered
    after a barrier is called by the next one, and an unregistered one is not."""
    log: list[str] = []
    host = Host()
    first = FlushListener(log, "p1")
    host.register(first)
    assert [await a for a in host.session_flush(FakeSession())] == ["p1"]  # type: ignore[arg-type]
    host.register(FlushListener(log, "p2"))
    assert [await a for a in host.session_flush(FakeSession())] == ["p1", "p2"]  # type: ignore[arg-type]
    host.unregister(first)
    assert [await a for a in host.session_flush(FakeSession())] == ["p2"]  # type: ignore[arg-type]
    assert log == ["p1", "p1", "p2", "p2"]


def test_flush_awaitables_without_listeners_is_empty() -> None:
    assert Host().session_flush(FakeSession()) == []  # type: ignore[arg-type]


class BadFlushListener:
    @hookimpl
    def session_flush(self, session: FakeSession) -> object:
        return 42


@pytest.mark.anyio
async def test_flush_listener_returning_a_non_awaitable_fails_in_its_slot() -> None:
    host = Host()
    host.register(BadFlushListener(), name="bad-flush")
    (awaitable,) = host.session_flush(FakeSession())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="session_flush of plugin 'bad-flush' returned int"):
        await awaitable


# --- backends ------------------------------------------------------------------------------------


class MemoryBackend:
    NAME = "memory"


class JsonlBackend:
    NAME = "jsonl"


class OtherJsonlBackend:
    NAME = "jsonl"


class Provides:
    def __init__(self, *classes: type) -> None:
        self.classes = list(classes)

    @hookimpl
    def dsh_session_backends(self) -> list[type]:
        return self.classes


def test_backends_are_merged_in_registration_order() -> None:
    host = Host()
    host.register(Provides(MemoryBackend))
    host.register(Provides(JsonlBackend))
    host.register(Provides(MemoryBackend))  # the same class twice is harmless
    backends = host.dsh_session_backends()
    assert backends == {"memory": MemoryBackend, "jsonl": JsonlBackend}
    assert list(backends) == ["memory", "jsonl"]


def test_duplicate_backend_name_is_an_error() -> None:
    host = Host()
    host.register(Provides(MemoryBackend, JsonlBackend))
    host.register(Provides(OtherJsonlBackend))
    with pytest.raises(
        ValueError, match=r'two session backends are named "jsonl": .*JsonlBackend and .*OtherJsonlBackend'
    ):
        host.dsh_session_backends()


def test_backend_without_name_is_an_error() -> None:
    host = Host()
    host.register(Provides(FakeSession))
    with pytest.raises(TypeError, match="must be a class with a non-empty str NAME"):
        host.dsh_session_backends()


# --- entry points --------------------------------------------------------------------------------


@pytest.fixture
def fake_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Callable[[str, str], None]:
    """Install a one-module distribution declaring ``dsh.session`` entry points, and only that one.

    ``importlib.metadata.distributions`` is narrowed to it, so the workspace's real entry points
    (whose modules may not exist yet) do not take part.
    """
    dist_info = tmp_path / "fake_dsh_plugin-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-dsh-plugin\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: [importlib.metadata.PathDistribution(dist_info)])

    def install(module_name: str, source: str) -> None:
        (tmp_path / f"{module_name}.py").write_text(textwrap.dedent(source))
        (dist_info / "entry_points.txt").write_text(f"[dsh.session]\nfake = {module_name}\n")
        request.addfinalizer(lambda: sys.modules.pop(module_name, None))

    return install


def test_load_entrypoints_registers_installed_plugins(fake_distribution: Callable[[str, str], None]) -> None:
    fake_distribution(
        "fake_dsh_plugin_ok",
        """
        from dsh.session_persistence._host.host import hookimpl

        class FakeBackend:
            NAME = "fake"

        @hookimpl
        def dsh_session_backends():
            return [FakeBackend]
        """,
    )
    host = Host()
    assert host.load_entrypoints() == 1
    assert host.has_plugin("fake")
    assert list(host.dsh_session_backends()) == ["fake"]
    assert host.load_entrypoints() == 0  # already registered


def test_load_entrypoints_checks_pending_hooks(fake_distribution: Callable[[str, str], None]) -> None:
    fake_distribution(
        "fake_dsh_plugin_typo",
        """
        from dsh.session_persistence._host.host import hookimpl

        @hookimpl
        def dsh_session_backend():  # typo: the hook is dsh_session_backends
            return []
        """,
    )
    host = Host()
    with pytest.raises(pluggy.PluginValidationError, match="unknown hook 'dsh_session_backend'"):
        host.load_entrypoints()


def test_load_entrypoints_goes_through_the_validating_register(fake_distribution: Callable[[str, str], None]) -> None:
    fake_distribution(
        "fake_dsh_plugin_eager",
        """
        from dsh.session_persistence._host.host import hookimpl

        @hookimpl(trylast=True)
        def tools_execute(execution):
            return None
        """,
    )
    host = Host()
    with pytest.raises(pluggy.PluginValidationError, match="terminal implementation must be a coroutine"):
        host.load_entrypoints()
    assert not host.has_plugin("fake")


# --- the host argument ---------------------------------------------------------------------------


class HostAware:
    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    @hookimpl
    def session_event(self, host: Host, event: object) -> None:  # names a subset, in any order
        self.seen.append(("event", host))

    @hookimpl
    def dsh_session_backends(self, host: Host) -> list[type]:
        self.seen.append(("backends", host))
        return []

    @hookimpl(wrapper=True)
    def tools_execute(self, host: Host, execution: ToolExecution) -> Any:
        self.seen.append(("tools", host))
        return (yield)


def test_every_hook_call_passes_the_host() -> None:
    host = Host()
    plugin = HostAware()
    host.register(ToolTerminal([]))
    host.register(plugin)
    host.session_event(FakeSession(), object())  # type: ignore[arg-type]
    host.dsh_session_backends()
    host.tools_execute(execution()).close()  # type: ignore[attr-defined]
    assert plugin.seen == [("event", host), ("backends", host), ("tools", host)]


def test_two_entry_points_with_one_name_are_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # pluggy would load the first and silently skip the second: a backend would be hidden.
    dists = []
    for tag in ("one", "two"):
        dist_info = tmp_path / f"fake_dsh_{tag}-1.0.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-dsh-{tag}\nVersion: 1.0\n")
        (dist_info / "entry_points.txt").write_text(f"[dsh.session]\nsame = fake_dsh_plugin_{tag}\n")
        (tmp_path / f"fake_dsh_plugin_{tag}.py").write_text(
            "from dsh.session_persistence import hookimpl\n\n"
            f"class B:\n    NAME = {tag!r}\n\n"
            "@hookimpl\ndef dsh_session_backends():\n    return [B]\n"
        )
        request.addfinalizer(lambda tag=tag: sys.modules.pop(f"fake_dsh_plugin_{tag}", None))
        dists.append(importlib.metadata.PathDistribution(dist_info))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: list(dists))
    host = Host()
    with pytest.raises(pluggy.PluginValidationError, match=r"two 'dsh.session' entry points are named 'same'"):
        host.load_entrypoints()
    assert not host.has_plugin("same")
    # The same distribution seen twice (two sys.path entries) is one plugin, not a clash.
    monkeypatch.setattr(importlib.metadata, "distributions", lambda: [dists[0], dists[0]])
    assert host.load_entrypoints() == 1
    assert list(host.dsh_session_backends()) == ["one"]


def test_an_entry_point_named_like_a_different_registered_plugin_is_an_error(
    fake_distribution: Callable[[str, str], None],
) -> None:
    fake_distribution(
        "fake_dsh_plugin_named",
        """
        from dsh.session_persistence import hookimpl

        @hookimpl
        def dsh_session_backends():
            return []
        """,
    )
    host = Host()
    other = types.SimpleNamespace()
    host.register(other, name="fake")
    with pytest.raises(pluggy.PluginValidationError, match="already registered for a different object"):
        host.load_entrypoints()


def test_explicit_register_refuses_a_misspelled_hook_and_leaves_the_registry_as_it_was() -> None:
    class Typo:
        @hookimpl
        def session_evnet(self, session: object, event: object) -> None:
            raise AssertionError("never called")

    host = Host()
    with pytest.raises(
        pluggy.PluginValidationError, match=r"unknown hook 'session_evnet'.*did you mean 'session_event'"
    ):
        host.register(Typo(), name="typo")
    assert not host.has_plugin("typo")
    host.check_pending()  # nothing unknown left behind


def test_an_optional_hook_may_be_unknown() -> None:
    class Optional:
        @hookimpl(optionalhook=True)
        def some_future_hook(self) -> None:
            raise AssertionError("never called")

    host = Host()
    assert host.register(Optional(), name="optional") == "optional"


def test_one_store_per_host() -> None:
    host = Host()
    store = SessionStore(host)
    assert host.sessions is store
    host.sessions = store  # the same store again is fine
    with pytest.raises(SessionLifecycleError, match="already has a SessionStore"):
        SessionStore(host)
    assert host.sessions is store
    host.sessions = None  # detaching is allowed, and then a new store may attach
    assert SessionStore(host) is host.sessions


def test_has_session_flush_and_backends_by_plugin() -> None:
    class Backend:
        NAME = "b"

    class Provides:
        @hookimpl
        def dsh_session_backends(self) -> list[type[object]]:
            return [Backend]

    class Broken:
        @hookimpl
        def dsh_session_backends(self) -> list[type[object]]:
            raise RuntimeError("boom")

    class Flushes:
        @hookimpl
        def session_flush(self, session: object) -> None:
            return None

    host = Host()
    assert not host.has_session_flush()
    host.register(Provides(), name="provides")
    host.register(Broken(), name="broken")
    by_plugin = host.backends_by_plugin()
    assert by_plugin["provides"] == [Backend]
    assert isinstance(by_plugin["broken"], RuntimeError)
    host.register(Flushes(), name="flushes")
    assert host.has_session_flush()
