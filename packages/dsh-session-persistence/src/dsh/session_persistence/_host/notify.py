"""How the host calls a notification implementation on its own (see :mod:`.host`): the ``session_event``
implementations as ``(session, event)`` callables, and what is done with a result that is not ``None``."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._model.events import SessionEvent
    from .host import Host
    from .session import Session

__all__ = ["close_quietly", "event_call", "report_result"]

_logger = logging.getLogger("dsh.session_persistence")


def close_quietly(obj: object) -> None:
    """Close ``obj`` if it has a ``close`` (an unstarted coroutine or generator), so it does not warn unawaited."""
    close = getattr(obj, "close", None)
    if callable(close):
        close()


def report_result(result: object, plugin_name: str, what: str) -> None:
    """A notification implementation returned ``result`` (not ``None``): an awaitable is closed and logged."""
    if inspect.isawaitable(result):
        # A synchronous notification cannot await: close it so it does not warn unawaited,
        # and say so, since the work it stood for is lost.
        close_quietly(result)
        _logger.error(
            "%s listener returned an awaitable (plugin %r); the hook is synchronous, it was closed unawaited",
            what,
            plugin_name,
        )


def event_call(host: Host, function: Callable[..., object], argnames: tuple[str, ...]) -> Callable[..., object]:
    """``function`` (a ``session_event`` implementation taking ``argnames``) as a ``(session, event)`` callable.

    Same argument selection as pluggy's own caller (an implementation may take any of the spec's arguments, in its
    own order); the usual shapes get no wrapper of their own.
    """
    if argnames == ("session", "event"):
        return function
    if argnames == ("host", "session", "event"):
        return partial(function, host)

    def call(session: Session, event: SessionEvent) -> object:
        kwargs = {"host": host, "session": session, "event": event}
        return function(*[kwargs[name] for name in argnames])

    return call
