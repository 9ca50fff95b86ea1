"""The plugin host: a validating ``pluggy.PluginManager`` with one typed method per hook, named after it.

Nobody outside the host calls ``host.hook.<name>(...)``: ``host.session_event(session, event)`` calls the
``session_event`` hook, and so on for every hook. The host owns four things pluggy does not give us:

* **Known hooks only**: every registration (explicit or from an entry point) is checked at once against the
  hook specifications, so a misspelled ``@hookimpl`` fails loudly instead of never being called; and two
  installed entry points with the same name are an error, where pluggy would silently load only one.
* **Registration rules for the agent boundaries**: the one terminal
  implementation of ``llm_stream`` must be an async generator function, that of ``tools_execute`` /
  ``agent_pre_step`` a coroutine function, and there is at most one terminal per boundary. Calling such
  a function runs none of its body, so "the adapter or tool body never runs at hook-call time" holds by
  construction. The check lives in the public :meth:`Host.register` (which pluggy's entry-point loader
  also goes through), because pluggy's own verification hook is private.
* **Isolation of notification hooks**: pluggy stops a hook call at the first raising implementation;
  ``session_event``, ``session_disposed``, ``agent_error`` and ``agent_status`` must not. The host calls
  their implementations one by one, from the public ``HookCaller.get_hookimpls()`` (each ``HookImpl``
  exposes ``function`` and ``argnames``, which is exactly how pluggy itself calls an implementation).
  That bypasses pluggy's wrapper machinery, so wrappers are refused on those hooks at registration
  rather than silently skipped.
* **Registration order for ``session_flush``**: pluggy calls implementations last-registered-first;
  the store needs "the first-registered failure", so the host remembers when each plugin registered.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
import itertools
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pluggy

from .._model.errors import SessionLifecycleError
from . import specs as hookspecs
from .gather import Settled
from .notify import close_quietly, event_call, report_result
from .specs import PROJECT_NAME

if TYPE_CHECKING:
    from .._model.events import SessionEvent, StreamChunk
    from .boundaries import ModelRequest, PreStepDecision, PreStepInput, ToolExecution, ToolExecutionResult
    from .session import Session, SessionStore
    from .specs import Agent

__all__ = ["Host", "hookimpl"]

#: Marker for hook implementations: ``@hookimpl``, ``@hookimpl(wrapper=True)``, ``@hookimpl(trylast=True)``.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

_logger = logging.getLogger("dsh.session_persistence")

#: Boundary hook -> (predicate its terminal must satisfy, description for the error message).
_TERMINAL_KINDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "llm_stream": (inspect.isasyncgenfunction, "an async generator function (async def with yield)"),
    "tools_execute": (inspect.iscoroutinefunction, "a coroutine function (async def)"),
    "agent_pre_step": (inspect.iscoroutinefunction, "a coroutine function (async def)"),
}

#: Hooks whose implementations the host calls one by one (see the module docstring).
_ONE_BY_ONE_HOOKS = frozenset({"session_event", "session_flush", "session_disposed", "agent_error", "agent_status"})


#: The boundaries a checkpoint policy wraps (see :meth:`Host.has_checkpoint_policy`).
_CHECKPOINT_BOUNDARIES = ("agent_pre_step", "llm_stream", "tools_execute")


def _describe(function: object) -> str:
    if inspect.isgeneratorfunction(function):
        kind = "a generator function"
    elif inspect.isfunction(function) or inspect.ismethod(function):
        kind = "a plain function"
    else:
        kind = type(function).__name__
    return f"{kind} {getattr(function, '__qualname__', function)!r}"


def _invoke(impl: pluggy.HookImpl, kwargs: Mapping[str, object]) -> object:
    # Same argument selection as pluggy's own caller: an impl may accept a prefix of the spec's args.
    return impl.function(*[kwargs[name] for name in impl.argnames])


@dataclass(frozen=True, slots=True)
class PluginDistribution:
    """The installed distribution an entry-point plugin came from."""

    project_name: str
    version: str


class Host:
    """The plugin host of a dsh sessions process: a façade over one ``pluggy.PluginManager`` (project
    ``"dsh.session"``) that validates every registration and offers one typed method per hook.

    Construct it, register plugins (or :meth:`load_entrypoints`), then talk to the hooks only through the typed
    methods below. :attr:`plugin_manager` is the wrapped manager, for introspection (hook callers, tracing).
    """

    def __init__(self) -> None:
        self._pm = pluggy.PluginManager(PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._registration_counter = itertools.count()
        self._registration_index: dict[str, int] = {}
        self._sessions: SessionStore | None = None
        self._distributions: list[tuple[object, PluginDistribution]] = []
        # Per notification hook, its implementations in call order (function, argument names, plugin name): built
        # on first use and dropped by every (un)registration, so a per-event hook call copies no pluggy list.
        self._isolated: dict[str, tuple[tuple[Callable[..., object], tuple[str, ...], str], ...]] = {}
        # The same for ``session_event`` (once per appended event), each implementation as a (session, event) callable.
        self._event_impls: tuple[tuple[Callable[[Session, SessionEvent], object], str], ...] | None = None
        # The session_flush implementations in registration order (function, argument names, plugin name): resolved
        # on the first barrier and dropped by every (un)registration, so a barrier neither sorts nor copies.
        self._flush_impls: tuple[tuple[Callable[..., object], tuple[str, ...], str], ...] | None = None

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        """The wrapped pluggy manager: for introspection only; hooks are called through the Host's methods."""
        return self._pm

    # ---------------------------------------------------------------------------------------------
    # Registration

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register ``plugin`` like pluggy does, then enforce the boundary and notification rules.

        Every hook implementation must name a specified hook (unless marked ``optionalhook``): a misspelled
        one fails here. On a violation the plugin is unregistered again (the registry is left as it was) and
        ``pluggy.PluginValidationError`` is raised.
        """
        self._forget_impls()
        plugin_name = self._pm.register(plugin, name)
        if plugin_name is None:
            return None
        try:
            self._check_registration(plugin, plugin_name)
        except BaseException:
            self._pm.unregister(plugin)
            raise
        self._registration_index[plugin_name] = next(self._registration_counter)
        return plugin_name

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any | None:
        """Unregister a plugin (by object or by name) and all its hook implementations; returns the plugin."""
        self._forget_impls()
        return self._pm.unregister(plugin, name)

    def _forget_impls(self) -> None:
        # Every registration change drops the resolved per-hook lists (rebuilt on the next call).
        self._isolated.clear()
        self._event_impls = None
        self._flush_impls = None

    def is_registered(self, plugin: object) -> bool:
        """Whether ``plugin`` is registered."""
        return self._pm.is_registered(plugin)

    def has_plugin(self, name: str) -> bool:
        """Whether a plugin is registered under ``name``."""
        return self._pm.has_plugin(name)

    def get_plugin(self, name: str) -> Any | None:
        """The plugin registered under ``name``, or ``None``."""
        return self._pm.get_plugin(name)

    def get_plugins(self) -> set[Any]:
        """Every registered plugin."""
        return self._pm.get_plugins()

    def list_name_plugin(self) -> list[tuple[str, Any]]:
        """``(name, plugin)`` of every registered plugin."""
        return self._pm.list_name_plugin()

    def list_plugin_distinfo(self) -> list[tuple[Any, PluginDistribution]]:
        """``(plugin, distribution)`` of every plugin :meth:`load_entrypoints` loaded and that is still registered."""
        return [(plugin, dist) for plugin, dist in self._distributions if self._pm.is_registered(plugin)]

    def get_hookcallers(self, plugin: object) -> list[pluggy.HookCaller] | None:
        """The hook callers ``plugin`` implements, or ``None`` if it is not registered."""
        return self._pm.get_hookcallers(plugin)

    def check_pending(self) -> None:
        """Fail on any registered implementation of an unknown hook that is not marked ``optionalhook``."""
        self._pm.check_pending()

    def _check_registration(self, plugin: object, plugin_name: str) -> None:
        for caller in self._pm.get_hookcallers(plugin) or ():
            impls = caller.get_hookimpls()
            mine = [impl for impl in impls if impl.plugin is plugin]
            where = f"plugin {plugin_name!r}, hook {caller.name!r}"
            if not caller.has_spec() and any(not impl.optionalhook for impl in mine):
                close = difflib.get_close_matches(caller.name, hookspecs.__all__, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise pluggy.PluginValidationError(
                    plugin,
                    f"plugin {plugin_name!r}: unknown hook {caller.name!r}, not in the {PROJECT_NAME!r} hook "
                    f"specification{hint}",
                )
            if caller.name in _TERMINAL_KINDS:
                predicate, expected = _TERMINAL_KINDS[caller.name]
                for impl in mine:
                    if impl.hookwrapper:
                        raise pluggy.PluginValidationError(
                            plugin, f"{where}: boundary hooks take new-style wrappers (wrapper=True) only"
                        )
                    if not impl.wrapper and not predicate(impl.function):
                        raise pluggy.PluginValidationError(
                            plugin,
                            f"{where}: a terminal implementation must be {expected}, got "
                            f"{_describe(impl.function)}; anything else must be a wrapper (wrapper=True)",
                        )
                terminals = [impl for impl in impls if not (impl.wrapper or impl.hookwrapper)]
                if len(terminals) > 1 and any(impl.plugin is plugin for impl in terminals):
                    others = ", ".join(repr(impl.plugin_name) for impl in terminals if impl.plugin is not plugin)
                    raise pluggy.PluginValidationError(
                        plugin,
                        f"{where}: a boundary hook has exactly one terminal implementation and "
                        f"{others or 'this plugin'} already provides it; register a wrapper (wrapper=True)",
                    )
            elif caller.name in _ONE_BY_ONE_HOOKS:
                for impl in mine:
                    if impl.wrapper or impl.hookwrapper:
                        raise pluggy.PluginValidationError(
                            plugin,
                            f"{where}: wrappers are not supported on this hook (the host calls each "
                            "implementation on its own)",
                        )

    def load_entrypoints(self) -> int:
        """Register the plugins installed under the ``dsh.session`` entry-point group.

        Two installed entry points with the same name but different targets raise
        ``pluggy.PluginValidationError`` before anything is loaded (pluggy would load the first one and
        silently skip the other), and so does an entry point whose name is already registered for a
        different plugin. Every registration is checked like :meth:`register`, and then every registered
        implementation again (``check_pending``). Returns how many plugins were loaded by this call.
        """
        self._refuse_duplicate_entry_points()
        count = 0
        for dist in importlib.metadata.distributions():
            for entry_point in dist.entry_points:
                name = entry_point.name
                if entry_point.group != PROJECT_NAME or self._pm.get_plugin(name) or self._pm.is_blocked(name):
                    continue
                plugin = entry_point.load()
                # Our register, not pluggy's loader: every entry-point plugin is validated like any other.
                self.register(plugin, name=name)
                self._distributions.append((plugin, PluginDistribution(str(dist.metadata["name"]), dist.version)))
                count += 1
        self._pm.check_pending()
        return count

    def _refuse_duplicate_entry_points(self) -> None:
        seen: dict[str, tuple[str, str]] = {}
        for dist in importlib.metadata.distributions():
            for entry_point in dist.entry_points:
                if entry_point.group != PROJECT_NAME or self._pm.is_blocked(entry_point.name):
                    continue
                where = (str(dist.metadata["name"]), entry_point.value)
                first = seen.setdefault(entry_point.name, where)
                # The same distribution seen twice on sys.path names the same target: that is one plugin.
                if first[1] != where[1]:
                    raise pluggy.PluginValidationError(
                        entry_point.value,
                        f"two {PROJECT_NAME!r} entry points are named {entry_point.name!r}: {first[1]} "
                        f"(distribution {first[0]}) and {where[1]} (distribution {where[0]}); rename one",
                    )
                registered = self._pm.get_plugin(entry_point.name)
                if registered is not None and registered is not entry_point.load():
                    raise pluggy.PluginValidationError(
                        registered,
                        f"entry point {entry_point.name!r} ({entry_point.value}) names a plugin that is already "
                        "registered for a different object",
                    )

    # ---------------------------------------------------------------------------------------------
    # Session lifecycle

    @property
    def sessions(self) -> SessionStore | None:
        """The host's :class:`SessionStore`, or ``None`` before one is built on this host.

        Plugins receive only the host, so the store is reachable from it (the coordinator and the checkpoint
        policy find live sessions here). The store attaches itself when it is constructed; attaching a second,
        different store raises :class:`SessionLifecycleError` (assigning ``None`` detaches).
        """
        return self._sessions

    @sessions.setter
    def sessions(self, store: SessionStore | None) -> None:
        # One store per host: a second one would silently take over, and plugins would flush, repair and look up
        # sessions in the wrong store. Detaching (None) is allowed.
        current = self._sessions
        if store is not None and current is not None and current is not store:
            raise SessionLifecycleError("this host already has a SessionStore; build one store per host")
        self._sessions = store

    def session_created(self, session: Session) -> None:
        """Call ``session_created``; the first raising implementation's exception propagates (veto)."""
        self._pm.hook.session_created(host=self, session=session)

    def session_event(self, session: Session, event: SessionEvent) -> None:
        """Call every ``session_event`` implementation, each isolated (see the hookspec)."""
        # Runs once per appended event: the implementations come from a list resolved once per registration change,
        # each called with two positional arguments; the label is built only if an implementation misbehaves.
        impls = self._event_impls
        if impls is None:
            impls = self._resolve_event_impls()
        for call, plugin_name in impls:
            try:
                result = call(session, event)
            except Exception as exc:
                # The spec fixes the message text, which includes the error; the traceback comes along.
                _logger.exception('session "%s": session/event listener threw: %s', session.id, exc)  # noqa: TRY401
                continue
            if result is not None:
                report_result(result, plugin_name, f'session "{session.id}": session/event')

    def _resolve_event_impls(self) -> tuple[tuple[Callable[[Session, SessionEvent], object], str], ...]:
        """The ``session_event`` implementations in pluggy's call order, each as a ``(session, event)`` callable."""
        impls = self._event_impls = tuple(
            (event_call(self, impl.function, tuple(impl.argnames)), impl.plugin_name)
            for impl in reversed(self._pm.hook.session_event.get_hookimpls())
        )
        return impls

    def session_disposed(self, session: Session) -> None:
        """Call every ``session_disposed`` implementation, each isolated."""
        self._call_isolated(
            "session_disposed", {"host": self, "session": session}, f'session "{session.id}": session/disposed'
        )

    def session_flush(self, session: Session) -> list[Awaitable[object]]:
        """Call every ``session_flush`` implementation; return one awaitable per implementation.

        The list is in **registration order** (pluggy calls implementations last-registered-first),
        so the store can report the first-registered failure. An implementation that returned
        ``None`` gets an already-completed awaitable; one that raised while being called (or returned
        something that is not awaitable) gets an awaitable raising that error, so it keeps its slot.
        Nothing has been awaited yet: the caller runs them (concurrently) and must await every one.
        """
        impls = self._flush_impls
        if impls is None:
            ordered = sorted(
                self._pm.hook.session_flush.get_hookimpls(),
                key=lambda impl: self._registration_index.get(impl.plugin_name, sys.maxsize),
            )
            impls = self._flush_impls = tuple(
                (impl.function, tuple(impl.argnames), impl.plugin_name) for impl in ordered
            )
        awaitables: list[Awaitable[object]] = []
        for function, argnames, plugin_name in impls:
            try:
                # _invoke inlined, on the resolved implementation (this runs per barrier).
                result = function(*[self if name == "host" else session for name in argnames])
            except Exception as exc:
                awaitables.append(Settled(exc))
                continue
            if result is None:
                awaitables.append(Settled(None))
            elif inspect.isawaitable(result):
                awaitables.append(result)
            else:
                awaitables.append(
                    Settled(
                        TypeError(
                            f"session_flush of plugin {plugin_name!r} returned "
                            f"{type(result).__name__}, expected an awaitable or None"
                        )
                    )
                )
        return awaitables

    def has_session_flush(self) -> bool:
        """Whether any plugin implements ``session_flush`` (without one, a flush persists nothing)."""
        impls = self._flush_impls  # resolved by the last barrier (a checkpoint policy asks before each one)
        return bool(impls if impls is not None else self._pm.hook.session_flush.get_hookimpls())

    def has_checkpoint_policy(self) -> bool:
        """Whether one registered plugin wraps all three agent boundaries (``agent_pre_step``, ``llm_stream``,
        ``tools_execute``), as a checkpoint policy does to flush before each step, model request and tool call.

        Recognised by shape, not by name, so any release of ``dsh-session-checkpoint-policy`` (or a policy of the
        caller's own, registered by hand) counts.
        """
        wrapping: list[set[str]] = []
        for name in _CHECKPOINT_BOUNDARIES:
            impls = getattr(self._pm.hook, name).get_hookimpls()
            wrapping.append({impl.plugin_name for impl in impls if impl.wrapper or impl.hookwrapper})
        return bool(set.intersection(*wrapping))

    # ---------------------------------------------------------------------------------------------
    # Agent boundaries

    def llm_stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """Build the (unstarted) ``llm_stream`` chain for ``request``; nothing runs until iterated."""
        result = self._pm.hook.llm_stream(host=self, request=request)
        if result is None:
            raise RuntimeError('hook "llm_stream" has no terminal implementation (the LLM runtime registers it)')
        if not isinstance(result, AsyncIterator):
            close_quietly(result)
            raise TypeError(f'hook "llm_stream" returned {type(result).__name__}, expected an async iterator')
        return result

    def tools_execute(self, execution: ToolExecution) -> Awaitable[ToolExecutionResult]:
        """Build the (unstarted) ``tools_execute`` chain; nothing runs until awaited."""
        return self._awaitable_boundary("tools_execute", self._pm.hook.tools_execute(host=self, execution=execution))

    def agent_pre_step(self, agent: Agent, pre_step: PreStepInput) -> Awaitable[PreStepDecision]:
        """Build the (unstarted) ``agent_pre_step`` chain; nothing runs until awaited."""
        return self._awaitable_boundary(
            "agent_pre_step", self._pm.hook.agent_pre_step(host=self, agent=agent, pre_step=pre_step)
        )

    @staticmethod
    def _awaitable_boundary(name: str, result: object) -> Awaitable[Any]:
        if result is None:
            raise RuntimeError(f'hook "{name}" has no terminal implementation (the owning runtime registers it)')
        if not inspect.isawaitable(result):
            raise TypeError(f'hook "{name}" returned {type(result).__name__}, expected an awaitable')
        return result

    # ---------------------------------------------------------------------------------------------
    # Discovery and notifications

    def dsh_session_backends(self) -> dict[str, type[object]]:
        """Merge every ``dsh_session_backends`` result into ``{NAME: class}`` (registration order).

        Raises ``TypeError`` for an entry that is not a class with a non-empty string ``NAME`` and
        ``ValueError`` when two different classes claim the same ``NAME``.
        """
        found: dict[str, type[object]] = {}
        # pluggy returns results last-registered-first; reverse for a stable, registration-ordered view.
        for provided in reversed(self._pm.hook.dsh_session_backends(host=self)):
            for cls in provided:
                name = getattr(cls, "NAME", None)
                if not isinstance(cls, type) or not isinstance(name, str) or not name:
                    raise TypeError(f"session backend {cls!r} must be a class with a non-empty str NAME")
                existing = found.get(name)
                if existing is not None and existing is not cls:
                    raise ValueError(
                        f'two session backends are named "{name}": '
                        f"{existing.__module__}.{existing.__qualname__} and {cls.__module__}.{cls.__qualname__}"
                    )
                found[name] = cls
        return found

    def backends_by_plugin(self) -> dict[str, list[type[object]] | Exception]:
        """What each plugin's ``dsh_session_backends`` returns, by plugin name (an exception if it raised).

        For listings (``dsh-session plugins``): unlike :meth:`dsh_session_backends` it neither merges nor
        validates, so one broken plugin does not hide the others.
        """
        out: dict[str, list[type[object]] | Exception] = {}
        for impl in reversed(self._pm.hook.dsh_session_backends.get_hookimpls()):
            try:
                provided = _invoke(impl, {"host": self})
                out[impl.plugin_name] = list(provided)  # type: ignore[call-overload]
            except Exception as exc:
                out[impl.plugin_name] = exc
        return out

    def agent_error(self, agent: Agent, turn: int, step: int, error: Exception) -> None:
        """Call every ``agent_error`` implementation, each isolated (a raising one is logged)."""
        self._call_isolated(
            "agent_error", {"host": self, "agent": agent, "turn": turn, "step": step, "error": error}, "agent/error"
        )

    def agent_status(self, agent: Agent, status: str) -> None:
        """Call every ``agent_status`` implementation, each isolated (a raising one is logged)."""
        self._call_isolated("agent_status", {"host": self, "agent": agent, "status": status}, "agent/status")

    # ---------------------------------------------------------------------------------------------

    def _call_isolated(self, hook_name: str, kwargs: Mapping[str, object], what: str) -> None:
        impls = self._isolated.get(hook_name)
        if impls is None:
            caller: pluggy.HookCaller = getattr(self._pm.hook, hook_name)
            # get_hookimpls() is in reverse call order; walk it backwards to keep pluggy's call order
            # (last registered first, tryfirst/trylast honoured), as ``pm.hook.<name>()`` would.
            impls = self._isolated[hook_name] = tuple(
                (impl.function, tuple(impl.argnames), impl.plugin_name) for impl in reversed(caller.get_hookimpls())
            )
        for function, argnames, plugin_name in impls:
            try:
                # _invoke inlined (this runs per appended event).
                result = function(*[kwargs[name] for name in argnames])
            except Exception as exc:
                # The spec fixes the message text, which includes the error; the traceback comes along.
                _logger.exception("%s listener threw: %s", what, exc)  # noqa: TRY401
                continue
            # None (the usual result of a notification) is never awaitable: skip the inspect call for it.
            if result is not None:
                report_result(result, plugin_name, what)
