"""The coordinator's host plugin: its session lifecycle hook implementations, each handed to the part it
concerns (publication, events and flushes to the live path, disposal to retirement).

The parts are named by what the hooks need of them (:class:`LiveSide`, :class:`RetiringSide`), so this module
sits low in the wing: the service builds the parts and hands them in.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable
from typing import Protocol

from .._host.host import Host, hookimpl
from .._host.session import Session
from .._model.events import SessionEvent
from .state import CoordinatorCore

__all__ = ["LiveSide", "RetiringSide", "SessionHooks", "owners_of"]


class LiveSide(Protocol):
    """What the hooks need of the live path."""

    @property
    def running(self) -> bool: ...

    def on_created(self, session: Session) -> None: ...

    def enqueue(self, session: Session, event: SessionEvent) -> None: ...

    def flush(self, session: Session) -> Awaitable[None]: ...


class RetiringSide(Protocol):
    """What the hooks need of retirement."""

    def on_disposed(self, session: Session) -> None: ...


class SessionHooks:
    """The host plugin of one coordinator (``owner``, kept so the host can find its open coordinators)."""

    def __init__(self, owner: object, core: CoordinatorCore, live: LiveSide, retirement: RetiringSide) -> None:
        self.owner = owner
        self.core = core
        self.live = live
        self.retirement = retirement

    @hookimpl
    def session_created(self, session: Session) -> None:
        # What this coordinator acknowledges must load: from here on an append that breaks a turn rule the loader
        # enforces is refused before it reaches the log (O(1) per event; nothing to walk at creation).
        session.enforce_turn_rules()
        self.live.on_created(session)

    @hookimpl
    def session_event(self, session: Session, event: SessionEvent) -> None:
        self.live.enqueue(session, event)

    @hookimpl
    def session_flush(self, session: Session) -> Awaitable[None]:
        return self.live.flush(session)

    @hookimpl
    def session_disposed(self, session: Session) -> None:
        self.retirement.on_disposed(session)


def owners_of(host: Host) -> builtins.list[object]:
    """The owners (coordinators) of the open coordinator plugins registered in ``host``."""
    return [p.owner for p in host.get_plugins() if isinstance(p, SessionHooks) and p.live.running and not p.core.closed]
