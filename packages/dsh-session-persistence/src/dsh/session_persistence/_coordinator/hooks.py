"""The coordinator's host plugin: its session lifecycle hook implementations, each handed to the part it
concerns (publication and events to the live path, flushes to the live path, disposal to retirement)."""

from __future__ import annotations

from collections.abc import Awaitable

from .._host.host import hookimpl
from .._host.session import Session
from .._model.events import SessionEvent
from .live_path import LivePath
from .retirement import Retirement
from .state import CoordinatorCore

__all__ = ["SessionHooks"]


class SessionHooks:
    """The host plugin of one coordinator (``owner``, kept so the host can find its open coordinators)."""

    def __init__(self, owner: object, core: CoordinatorCore, live: LivePath, retirement: Retirement) -> None:
        self.owner = owner
        self.core = core
        self.live = live
        self.retirement = retirement

    @hookimpl
    def session_created(self, session: Session) -> None:
        self.live.on_created(session)

    @hookimpl
    def session_event(self, session: Session, event: SessionEvent) -> None:
        self.live.ensure_live(session).writes.enqueue(event)

    @hookimpl
    def session_flush(self, session: Session) -> Awaitable[None]:
        return self.live.flush(session)

    @hookimpl
    def session_disposed(self, session: Session) -> None:
        self.retirement.on_disposed(session)
