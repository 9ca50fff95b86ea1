"""The optional invariant companion: checks every appended event against the turn/step rules.

A session a persistence coordinator holds refuses an append that breaks the turn/step relations (what is
acknowledged must load), and so does every session of a store built with ``check_turns=True``; other live
sessions accept it. This companion is the observing alternative, for tests and debugging: registered on a
:class:`~dsh.session_persistence.Host`, it runs one incremental :class:`TurnValidator` per live session (seeded
from the session's events when it first sees the session, then fed every ``session_event``) and reports a
violation as an error naming the session, the seq and the rule. It never undoes the append: the event is
already committed when ``session_event`` runs. Each violation is logged at ``ERROR`` (logger
``dsh.session_persistence.invariant``) and kept in :attr:`TurnInvariantCompanion.violations`;
:meth:`TurnInvariantCompanion.assert_clean` raises :class:`InvariantViolationError` when there is any.

**Optional by construction.** The companion is *not* in the ``dsh.session`` entry-point group that
``Host.load_entrypoints()`` loads. Every distribution declares its companion under the separate group
:data:`ENTRY_POINT_GROUP` (``dsh.session.invariants``); a process opts in with::

    from dsh.session_persistence.invariant import load_invariant_companions

    load_invariant_companions(host)  # every installed package's companion, by entry point

or registers this package's companion alone with :func:`register`. A companion module exposes
``register(host)``, which registers one plugin under the companion's name (idempotently) and returns it. A package
whose behaviour has no runtime relation to check registers a :class:`NoRuntimeInvariant`, which says so and
records that the package owns its companion slot.

For test suites, :func:`watch_new_hosts` registers the companion on every ``Host`` constructed while it is active
(a conftest fixture wraps it and calls :meth:`HostWatch.assert_clean` at teardown).

After a violation the session's validator state no longer describes a well-formed log, so checking of that
session is suspended (one report per break, not a cascade) until its log is truncated below the break
(``Session.truncate``), which re-seeds the validator.
"""

from __future__ import annotations

import importlib
import logging
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from ._host.host import Host, hookimpl
from ._model.errors import TurnInvariantError
from ._model.validator import TurnValidator, validate_turns

if TYPE_CHECKING:
    from ._host.session import Session
    from ._model.events import SessionEvent

__all__ = [
    "ENTRY_POINT_GROUP",
    "NAME",
    "PACKAGE",
    "HostWatch",
    "InvariantViolation",
    "InvariantViolationError",
    "NoRuntimeInvariant",
    "TurnInvariantCompanion",
    "TurnValidator",
    "find_companion",
    "load_invariant_companions",
    "register",
    "register_no_runtime_invariant",
    "validate_turns",
    "watch_new_hosts",
]

#: Entry-point group of the invariant companions (deliberately not ``dsh.session``: companions are opt-in).
ENTRY_POINT_GROUP = "dsh.session.invariants"
#: Plugin name of this package's companion on a host.
NAME = "session-persistence-invariant"
#: The distribution that owns this companion.
PACKAGE = "dsh-session-persistence"

_logger = logging.getLogger("dsh.session_persistence.invariant")


@dataclass(frozen=True)
class InvariantViolation:
    """One event that broke a turn/step rule: which session, at which seq, which rule, and why."""

    session_id: str
    seq: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f'session "{self.session_id}": seq {self.seq} breaks turn/step rule {self.rule}: {self.message}'


class InvariantViolationError(AssertionError):
    """Raised by ``assert_clean()`` when violations were recorded; ``.violations`` lists them in order."""

    def __init__(self, violations: Sequence[InvariantViolation]) -> None:
        self.violations = tuple(violations)
        lines = "\n".join(f"  {violation}" for violation in self.violations)
        super().__init__(f"{len(self.violations)} turn/step invariant violation(s):\n{lines}")


class _Tracked:
    __slots__ = ("next_seq", "validator")

    def __init__(self) -> None:
        self.validator: TurnValidator | None = TurnValidator()
        self.next_seq = 0


class TurnInvariantCompanion:
    """The pluggy plugin that checks every live session's appends against the turn/step rules.

    It implements ``session_created``, ``session_event`` and ``session_disposed`` and never raises out of them
    (a raising ``session_created`` would veto the session). Register it with :func:`register`.
    """

    def __init__(self) -> None:
        self._violations: list[InvariantViolation] = []
        # Keyed by the Session object (not its id): a disposed id may be reused by a new session.
        self._sessions: weakref.WeakKeyDictionary[Session, _Tracked] = weakref.WeakKeyDictionary()

    @property
    def violations(self) -> tuple[InvariantViolation, ...]:
        """Every violation recorded so far, in the order they were seen."""
        return tuple(self._violations)

    def clear(self) -> None:
        """Forget the recorded violations (the per-session validators are kept)."""
        self._violations.clear()

    def assert_clean(self) -> None:
        """Raise :class:`InvariantViolationError` if any violation was recorded."""
        if self._violations:
            raise InvariantViolationError(self._violations)

    # ------------------------------------------------------------------------------------------------------------
    # Hooks

    @hookimpl
    def session_created(self, session: Session) -> None:
        try:
            self._seed(session, session.events)
        except Exception:  # pragma: no cover - defensive: a raising session_created would veto the session
            _logger.exception('session "%s": invariant companion failed to seed its validator', session.id)

    @hookimpl
    def session_event(self, session: Session, event: SessionEvent) -> None:
        tracked = self._sessions.get(session)
        if tracked is None or event.seq != tracked.next_seq:
            # First sight (registered after the session was created) or the log was truncated since the last
            # event: re-seed from the events before this one. The event is already committed at index ``seq``.
            tracked = self._seed(session, session.events[: event.seq])
        tracked.next_seq = event.seq + 1
        if tracked.validator is not None:
            self._check(session, tracked, event)

    @hookimpl
    def session_disposed(self, session: Session) -> None:
        self._sessions.pop(session, None)

    # ------------------------------------------------------------------------------------------------------------

    def _seed(self, session: Session, events: Sequence[SessionEvent]) -> _Tracked:
        tracked = _Tracked()
        self._sessions[session] = tracked
        for event in events:
            if tracked.validator is None:
                break
            self._check(session, tracked, event)
        tracked.next_seq = len(events)
        return tracked

    def _check(self, session: Session, tracked: _Tracked, event: SessionEvent) -> None:
        assert tracked.validator is not None
        try:
            tracked.validator.check(event)
        except TurnInvariantError as exc:
            error = exc
        else:
            return
        tracked.validator = None
        message = str(error)
        suffix = f" (seq {error.seq}, rule {error.rule})"
        if message.endswith(suffix):
            message = message[: -len(suffix)]
        violation = InvariantViolation(session.id, error.seq, error.rule, message)
        if violation not in self._violations:  # a re-seed after truncation must not report a break twice
            self._violations.append(violation)
            # No traceback: the violation is in the data, and the append it describes already stands.
            _logger.error("%s (the append stands; checking of this session is suspended)", violation)


@dataclass(frozen=True, eq=False)  # identity equality: pluggy looks registered plugins up by ==
class NoRuntimeInvariant:
    """The companion of a package that has no runtime relation to check: a hookless plugin that says why.

    Registering it records that ``package`` owns its companion slot on the host (a second registration under the
    same name is refused by pluggy), so an inventory of companions accounts for every installed package.
    """

    package: str
    reason: str

    def assert_clean(self) -> None:
        """Nothing is checked at runtime, so nothing can be recorded."""


def register(host: Host) -> TurnInvariantCompanion:
    """Register this package's :class:`TurnInvariantCompanion` on ``host`` (or return the one already there)."""
    existing = host.get_plugin(NAME)
    if existing is not None:
        if not isinstance(existing, TurnInvariantCompanion):
            raise TypeError(f"plugin name {NAME!r} is taken by {existing!r}")
        return existing
    companion = TurnInvariantCompanion()
    host.register(companion, name=NAME)
    return companion


def register_no_runtime_invariant(host: Host, name: str, package: str, reason: str) -> NoRuntimeInvariant:
    """Register a :class:`NoRuntimeInvariant` for ``package`` under ``name`` (or return the one already there)."""
    existing = host.get_plugin(name)
    if existing is not None:
        if not isinstance(existing, NoRuntimeInvariant) or existing.package != package:
            raise TypeError(f"plugin name {name!r} is taken by {existing!r}")
        return existing
    companion = NoRuntimeInvariant(package, reason)
    host.register(companion, name=name)
    return companion


def find_companion(host: Host) -> TurnInvariantCompanion | None:
    """This package's companion registered on ``host``, if any."""
    plugin = host.get_plugin(NAME)
    return plugin if isinstance(plugin, TurnInvariantCompanion) else None


def load_invariant_companions(host: Host) -> dict[str, object]:
    """Register every installed companion (entry-point group :data:`ENTRY_POINT_GROUP`) on ``host``.

    Each entry point names a module exposing ``register(host)``. Returns ``{entry point name: registered plugin}``.
    """
    loaded: dict[str, object] = {}
    for entry_point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        module = importlib.import_module(entry_point.value.split(":", 1)[0])
        register_fn: Any = getattr(module, "register", None)
        if not callable(register_fn):
            raise TypeError(f"invariant companion {entry_point.name!r} ({entry_point.value}) has no register(host)")
        loaded[entry_point.name] = register_fn(host)
    return loaded


@dataclass
class HostWatch:
    """The companions :func:`watch_new_hosts` registered, one per host constructed while it was active."""

    companions: list[TurnInvariantCompanion] = field(default_factory=list)

    @property
    def violations(self) -> tuple[InvariantViolation, ...]:
        """Every violation recorded by any watched host."""
        return tuple(violation for companion in self.companions for violation in companion.violations)

    def assert_clean(self) -> None:
        """Raise :class:`InvariantViolationError` if any watched host recorded a violation."""
        violations = self.violations
        if violations:
            raise InvariantViolationError(violations)


@contextmanager
def watch_new_hosts() -> Iterator[HostWatch]:
    """Register the companion on every ``Host`` constructed inside the block (a test-suite aid).

    It wraps ``Host.__init__`` for the duration of the block and restores it afterwards; hosts constructed
    before the block are not watched. Not for production code.
    """
    watch = HostWatch()
    original = Host.__init__

    def init(self: Host) -> None:
        original(self)
        watch.companions.append(register(self))

    Host.__init__ = init  # type: ignore[method-assign]
    try:
        yield watch
    finally:
        Host.__init__ = original  # type: ignore[method-assign]
