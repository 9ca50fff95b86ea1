"""The front door: open a session store in one line and create, resume or fork agents on it.

::

    async with open_sessions(root) as sessions:
        agent = await sessions.resume_or_create("support-42", adapter, tools)
        result = await agent.run_turn("Where is my order?")
        print(result.reason.kind, result.text)

:func:`open_sessions` builds what a program otherwise composes by hand: a :class:`Host` with every installed
``dsh.session`` plugin (the checkpoint policy, the backends), a :class:`SessionStore`, the default backend found by
entry point (JSONL when installed) and a :class:`PersistenceCoordinator`. Leaving the block flushes and retires
every session opened through it.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from msgspec import UNSET

from .._backends.protocol import SessionBackend
from .._coordinator.service import PersistenceCoordinator
from .._host.fork import fork_seed, turn_boundary
from .._host.host import Host
from .._host.reconcile import DEFAULT_RECONCILE_TIMEOUT_S
from .._host.session import Session, SessionStore
from .._model.errors import SessionNotFoundError, SessionPersistenceError
from .._model.events import SessionEvent
from .._model.header import SessionHeader
from .._model.views import SessionInspection
from .agent import AgentLoop, _check_checkpoint_policy
from .protocols import DEFAULT_MAX_PARALLEL_TOOL_CALLS, ModelAdapter, Tool

__all__ = ["DEFAULT_BACKEND", "ROOT_ENV", "BackendNotFoundError", "Sessions", "default_sessions_root", "open_sessions"]

#: The backend :func:`open_sessions` picks when none is named (when installed).
DEFAULT_BACKEND = "jsonl"

#: The environment variable naming the session root when none is passed.
ROOT_ENV = "DSH_SESSIONS_ROOT"


class BackendNotFoundError(SessionPersistenceError, LookupError):
    """No installed backend matches the request (none installed, or an unknown name)."""


def default_sessions_root() -> Path:
    """``$DSH_SESSIONS_ROOT``, else ``$XDG_DATA_HOME/dsh-sessions``, else ``~/.local/share/dsh-sessions``."""
    explicit = os.environ.get(ROOT_ENV)
    if explicit:
        return Path(explicit).absolute()
    xdg = os.environ.get("XDG_DATA_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "dsh-sessions"
    return Path.home() / ".local" / "share" / "dsh-sessions"


def _backend_class(host: Host, name: str | None) -> type[Any]:
    found = host.dsh_session_backends()
    if name is None:
        if DEFAULT_BACKEND in found:
            return found[DEFAULT_BACKEND]
        persistent = [n for n in found if n != "memory"]
        if len(persistent) != 1:
            shown = ", ".join(sorted(found)) or "none"
            raise BackendNotFoundError(
                f"no default backend: the JSONL backend is not installed (installed: {shown}); "
                "pip install dsh-session-persistence-jsonl or pass backend=NAME"
            )
        return found[persistent[0]]
    if name not in found:
        shown = ", ".join(sorted(found)) or "none"
        raise BackendNotFoundError(f'unknown backend "{name}" (installed: {shown})')
    return found[name]


def _build_backend(cls: type[Any], root: Path, options: dict[str, Any]) -> SessionBackend:
    params = inspect.signature(cls).parameters
    kwargs = dict(options)
    if "root" in params and "root" not in kwargs:
        kwargs["root"] = str(root)
    backend: SessionBackend = cls(**kwargs)
    return backend


class Sessions:
    """An open session store: create, resume and fork :class:`AgentLoop` agents; read stored sessions.

    Made by :func:`open_sessions`. ``host``, ``store``, ``persistence`` (the coordinator) and ``backend`` are the
    parts, for anything the front door does not cover. Loop options (``provider``, ``model``, ``system``,
    ``max_parallel_tool_calls``) default to the adapter's ``provider``/``model`` attributes, and on resume and fork
    to the stored session's last request header.
    """

    def __init__(
        self,
        host: Host,
        store: SessionStore,
        persistence: PersistenceCoordinator,
        *,
        require_checkpoint_policy: bool = True,
    ) -> None:
        self.host = host
        self.store = store
        self.persistence = persistence
        self.require_checkpoint_policy = require_checkpoint_policy
        self._agents: list[AgentLoop] = []

    @property
    def backend(self) -> SessionBackend:
        """The storage backend."""
        return self.persistence.backend

    async def create(
        self,
        session_id: str | None,
        adapter: ModelAdapter,
        tools: Iterable[Tool] = (),
        *,
        provider: str | None = None,
        model: str | None = None,
        system: str | None = None,
        max_parallel_tool_calls: int = DEFAULT_MAX_PARALLEL_TOOL_CALLS,
    ) -> AgentLoop:
        """A new session (``None``: the store picks an id) driven by a new agent.

        An id that is already stored raises ``SessionIdCollisionError`` (resume it instead); nothing is written.
        """
        agent = AgentLoop(
            self.host,
            self.store,
            adapter,
            tools,
            provider=provider,
            model=model,
            session_id=session_id,
            system=system,
            max_parallel_tool_calls=max_parallel_tool_calls,
            require_checkpoint_policy=self.require_checkpoint_policy,
        )
        await agent.ready()
        self._agents.append(agent)
        return agent

    async def resume(
        self,
        session_id: str,
        adapter: ModelAdapter,
        tools: Iterable[Tool] = (),
        *,
        provider: str | None = None,
        model: str | None = None,
        system: str | None = None,
        max_parallel_tool_calls: int = DEFAULT_MAX_PARALLEL_TOOL_CALLS,
        reconcile: bool = True,
        reconcile_timeout: float = DEFAULT_RECONCILE_TIMEOUT_S,
    ) -> AgentLoop:
        """Continue a stored session (crash-repaired first); ``SessionNotFoundError`` if there is none.

        As in :meth:`AgentLoop.resume`, each unknown-outcome call of a tool that offers a reconciliation check is
        checked first (``reconcile=False`` skips that); ``agent.interrupted_turn`` then says whether a crash cut
        the last turn, and ``await agent.continue_interrupted()`` carries it on without a new user message.
        """
        agent = await AgentLoop.resume(
            self.host,
            self.store,
            self.persistence,
            session_id,
            adapter,
            tools,
            provider=provider,
            model=model,
            system=system,
            max_parallel_tool_calls=max_parallel_tool_calls,
            require_checkpoint_policy=self.require_checkpoint_policy,
            reconcile=reconcile,
            reconcile_timeout=reconcile_timeout,
        )
        self._agents.append(agent)
        return agent

    async def resume_or_create(
        self,
        session_id: str,
        adapter: ModelAdapter,
        tools: Iterable[Tool] = (),
        *,
        provider: str | None = None,
        model: str | None = None,
        system: str | None = None,
        max_parallel_tool_calls: int = DEFAULT_MAX_PARALLEL_TOOL_CALLS,
        reconcile: bool = True,
        reconcile_timeout: float = DEFAULT_RECONCILE_TIMEOUT_S,
    ) -> AgentLoop:
        """:meth:`resume` the session if it is stored, else :meth:`create` it."""
        options: dict[str, Any] = {
            "provider": provider,
            "model": model,
            "system": system,
            "max_parallel_tool_calls": max_parallel_tool_calls,
        }
        try:
            return await self.resume(
                session_id, adapter, tools, reconcile=reconcile, reconcile_timeout=reconcile_timeout, **options
            )
        except SessionNotFoundError:
            return await self.create(session_id, adapter, tools, **options)

    async def fork(
        self,
        source_id: str,
        adapter: ModelAdapter,
        tools: Iterable[Tool] = (),
        *,
        turn: int,
        child_id: str | None = None,
        provider: str | None = None,
        model: str | None = None,
        system: str | None = None,
        max_parallel_tool_calls: int = DEFAULT_MAX_PARALLEL_TOOL_CALLS,
    ) -> AgentLoop:
        """A new session that inherits ``source_id`` up to the end of turn ``turn``, driven by a new agent.

        The source may be live here or only stored; a stored source is read, never written (no repair is
        committed, nothing is appended to it). ``SessionForkError`` (code ``INVALID_BOUNDARY``) if turn ``turn``
        did not end in the source; ``SessionNotFoundError`` if there is no such session.
        """
        if self.require_checkpoint_policy:
            _check_checkpoint_policy(self.host)  # before the child is made (a disposed child is still stored)
        live = self.store.get(source_id)
        if live is not None:
            child = self.store.fork(live, turn_boundary(source_id, live.events, turn), child_id)
        else:
            view = await self.persistence.inspect(source_id)
            child = self._seed_child(source_id, view, turn, child_id)
        try:
            agent = AgentLoop._continuing(
                self.host,
                self.store,
                child,
                adapter,
                tools,
                provider,
                model,
                system,
                max_parallel_tool_calls,
                self.require_checkpoint_policy,
            )
        except BaseException:
            self.store.dispose(child)
            raise
        self._agents.append(agent)
        return agent

    def _seed_child(self, source_id: str, view: SessionInspection, turn: int, child_id: str | None) -> Session:
        events: Sequence[SessionEvent] = view.events
        boundary = turn_boundary(source_id, events, turn)
        # The same prefix checks as a live fork, on a detached copy of the stored log.
        detached = Session(source_id, header=view.meta, seed=events, inherited_event_count=view.inherited_event_count)
        seed = fork_seed(detached, boundary)
        meta: dict[str, Any] = {"parentSession": source_id, "isSeeded": True}
        if view.meta.cwd is not UNSET:
            meta["cwd"] = view.meta.cwd
        return self.store.create(child_id, seed=seed, meta=meta, inherited_event_count=len(seed))

    async def close(self, agent: AgentLoop) -> None:
        """Make everything ``agent`` appended durable, then detach it and retire its session."""
        try:
            if self.store.is_live(agent.session):
                await self.store.flush(agent.session)
        finally:
            self._retire(agent)

    def _retire(self, agent: AgentLoop) -> None:
        agent.close()
        if self.store.is_live(agent.session):
            self.store.dispose(agent.session)
        if agent in self._agents:
            self._agents.remove(agent)

    async def load(self, session_id: str) -> SessionInspection:
        """The balanced view of a session (a stored one is crash-repaired first, which writes the repair)."""
        return await self.persistence.load(session_id)

    async def inspect(self, session_id: str) -> SessionInspection:
        """The balanced view of a session without writing anything."""
        return await self.persistence.inspect(session_id)

    async def list(self) -> list[SessionHeader]:
        """The headers of every stored session."""
        return await self.persistence.list()

    async def _finish(self, *, flush: bool) -> None:
        errors: list[BaseException] = []
        for agent in list(self._agents):
            try:
                if flush and self.store.is_live(agent.session):
                    await self.store.flush(agent.session)
            except Exception as exc:
                errors.append(exc)
            finally:
                self._retire(agent)
        if errors:
            raise errors[0]


@asynccontextmanager
async def open_sessions(
    root: str | os.PathLike[str] | None = None,
    *,
    backend: str | SessionBackend | None = None,
    host: Host | None = None,
    require_checkpoint_policy: bool = True,
    **backend_options: Any,
) -> AsyncIterator[Sessions]:
    """Open the session store at ``root`` for the duration of an ``async with`` block.

    :param root: The session root directory (default: :func:`default_sessions_root`).
    :param backend: A backend name (default: ``jsonl`` when installed, else the only installed persistent one) or
        a ready backend instance (then ``root`` and ``backend_options`` are not used).
    :param host: The plugin host to use; by default a new one with every installed ``dsh.session`` plugin loaded
        (the checkpoint policy, which makes each model request and tool call durable first, when installed).
    :param require_checkpoint_policy: Agents started here (``create``, ``resume``, ``resume_or_create``, ``fork``)
        refuse with ``CheckpointPolicyMissingError`` when no checkpoint policy is registered (``pip install
        dsh-session-checkpoint-policy``, or ``pip install dsh-sessions`` for the safe set): without one nothing is
        made durable before a model request or a tool call. ``False`` opts out and runs them without checkpoints.
        Reading (``list``, ``inspect``, ``load``) never needs the policy.
    :param backend_options: Constructor options of the backend (e.g. ``compression="none"``).

    On leaving the block every session opened through it is flushed and retired, then the coordinator closes.
    ``BackendNotFoundError`` when no backend is installed or the named one is not.
    """
    if host is None:
        host = Host()
        host.load_entrypoints()
    if isinstance(backend, str) or backend is None:
        where = Path(root) if root is not None else default_sessions_root()
        instance = _build_backend(_backend_class(host, backend), where.absolute(), backend_options)
    else:
        instance = backend
    store = host.sessions if host.sessions is not None else SessionStore(host)
    async with PersistenceCoordinator(host, instance) as persistence:
        sessions = Sessions(host, store, persistence, require_checkpoint_policy=require_checkpoint_policy)
        try:
            yield sessions
        except BaseException:
            await sessions._finish(flush=False)
            raise
        await sessions._finish(flush=True)
