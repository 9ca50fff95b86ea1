"""Where the sessions are and how to open them: root resolution, backend discovery and construction.

The root comes from ``--root``, else ``DSH_SESSIONS_ROOT``, else the user's XDG data directory
(``$XDG_DATA_HOME/dsh-sessions``, or ``~/.local/share/dsh-sessions``); never the process's working directory.
Backends are found through the ``dsh.session`` entry points (``Host.load_entrypoints`` + ``Host.dsh_session_backends``).
Keys for encrypted stores (``--key-env NAME``, ``--key-file PATH``) are turned into constructor options by the
backend class itself (``SupportsKeySources``): the core never reads a key or imports a cipher.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from .._backends.protocol import SessionBackend, SupportsKeySources
from .._coordinator.service import PersistenceCoordinator
from .._host.host import Host
from .._model.errors import SessionStorageError
from ._errors import EXIT_UNAVAILABLE, EXIT_USAGE, CliError

__all__ = [
    "DEFAULT_BACKEND",
    "KeySource",
    "Stack",
    "build_backend",
    "default_root",
    "key_options",
    "load_host",
    "open_stack",
    "require_root",
    "resolve_root",
]

DEFAULT_BACKEND = "jsonl"
ROOT_ENV = "DSH_SESSIONS_ROOT"
ROOT_DIRNAME = "dsh-sessions"


def default_root(environ: Mapping[str, str] | None = None) -> str:
    """``$XDG_DATA_HOME/dsh-sessions`` (an absolute XDG_DATA_HOME only, per the XDG spec) or ``~/.local/share/...``."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_DATA_HOME", "")
    if xdg and os.path.isabs(xdg):
        return os.path.join(xdg, ROOT_DIRNAME)
    home = env.get("HOME") or os.path.expanduser("~")
    if not home or not os.path.isabs(home):
        raise CliError(
            f"cannot find a data directory (HOME is not set); pass --root or set {ROOT_ENV}", EXIT_UNAVAILABLE
        )
    return os.path.join(home, ".local", "share", ROOT_DIRNAME)


def resolve_root(option: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The absolute session root: ``--root``, else ``DSH_SESSIONS_ROOT``, else :func:`default_root`."""
    env = os.environ if environ is None else environ
    chosen = option if option else env.get(ROOT_ENV) or None
    if chosen is None:
        return default_root(env)
    # An explicit relative path is the user's choice; make it absolute once so every message shows the real place.
    return os.path.abspath(os.path.expanduser(chosen))


def load_host() -> Host:
    """A host with every installed ``dsh.session`` plugin registered."""
    host = Host()
    try:
        host.load_entrypoints()
    except Exception as exc:
        raise CliError(f"could not load the installed dsh.session plugins: {exc}", EXIT_UNAVAILABLE) from exc
    return host


def _coerce(name: str, raw: str, default: object) -> object:
    if isinstance(default, bool):
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise CliError(f'backend option "{name}" expects true or false, got "{raw}"', EXIT_USAGE)
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise CliError(f'backend option "{name}" expects an integer, got "{raw}"', EXIT_USAGE) from None
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise CliError(f'backend option "{name}" expects a number, got "{raw}"', EXIT_USAGE) from None
    return raw


def parse_options(pairs: list[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` from ``-o/--backend-option`` into a dict (later keys win)."""
    out: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f'backend option must look like KEY=VALUE, got "{pair}"', EXIT_USAGE)
        out[key.strip().replace("-", "_")] = value
    return out


#: ``("env", NAME)`` or ``("file", PATH)``: where ``--key-env`` / ``--key-file`` say the keys are.
KeySource = tuple[str, str]


def key_options(
    name: str, cls: type[object], source: KeySource | None, options: Mapping[str, str]
) -> dict[str, object]:
    """The constructor options backend ``cls`` derives from ``source`` (none without one).

    A backend class without ``key_options`` cannot open encrypted stores: a usage error, not a silent plaintext
    open. Its own errors (a variable that is not set, a key file others can read) propagate typed
    (``SessionKeyError``: exit 7).
    """
    if source is None:
        return {}
    candidate: object = cls  # the protocol describes the class object itself (a classmethod)
    if not isinstance(candidate, SupportsKeySources):
        raise CliError(f'backend "{name}" does not open encrypted stores (--key-env/--key-file)', EXIT_USAGE)
    extra = candidate.key_options(*source)
    clash = sorted(set(extra) & set(options))
    if clash:
        raise CliError(f"-o {clash[0]}=... and --key-{source[0]} both set the backend option {clash[0]!r}", EXIT_USAGE)
    return extra


def build_backend(
    name: str, cls: type[object], root: str, options: Mapping[str, str], extra: Mapping[str, object] | None = None
) -> SessionBackend:
    """Construct backend ``cls``: a ``root`` parameter gets the session root, ``-o`` options the rest, ``extra``
    (the key options) as given.

    Option values are converted to the type of the parameter's default (bool, int, float), else passed as text.
    """
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # pragma: no cover - a class without an introspectable signature
        params = {}  # type: ignore[assignment]
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs: dict[str, Any] = {}
    for key, raw in options.items():
        param = params.get(key)
        if param is None and not accepts_any:
            known = ", ".join(p for p in params if p not in ("root", "self")) or "none"
            raise CliError(f'backend "{name}" has no option "{key}" (its options: {known})', EXIT_USAGE)
        default = param.default if param is not None else None
        kwargs[key] = _coerce(key, raw, default)
    kwargs.update(extra or {})
    if "root" in params and "root" not in kwargs:
        kwargs["root"] = root
    try:
        backend = cls(**kwargs)
    except TypeError as exc:
        raise CliError(
            f'cannot configure backend "{name}": {exc} (pass options with -o KEY=VALUE)', EXIT_USAGE
        ) from exc
    except SessionStorageError as exc:
        cause = exc.__cause__
        message = storage_message(cause, root) if isinstance(cause, OSError) else str(exc)
        raise CliError(message, EXIT_UNAVAILABLE) from exc
    except ValueError as exc:
        raise CliError(f'cannot configure backend "{name}": {exc}', EXIT_USAGE) from exc
    except OSError as exc:
        raise CliError(storage_message(exc, root), EXIT_UNAVAILABLE) from exc
    return backend  # type: ignore[return-value]


def storage_message(exc: OSError, root: str) -> str:
    """One line for an OS error while reading the storage."""
    where = exc.filename if exc.filename else root
    reason = exc.strerror or str(exc) or type(exc).__name__
    return f"cannot use session root {where}: {reason}"


@dataclass
class Stack:
    """An open persistence stack for one command."""

    host: Host
    backend: SessionBackend
    coordinator: PersistenceCoordinator
    backend_name: str
    root: str
    #: Whether the backend was given keys (``--key-env``/``--key-file``).
    keyed: bool = False
    #: Where they came from (``("env", NAME)`` / ``("file", PATH)``), for error messages.
    keys: KeySource | None = None


def select_backend(host: Host, name: str | None) -> tuple[str, type[object]]:
    """The backend class named ``name`` (default: ``jsonl`` when installed, else the only one installed)."""
    try:
        found = host.dsh_session_backends()
    except (TypeError, ValueError) as exc:
        raise CliError(f"installed backend plugins conflict: {exc}", EXIT_UNAVAILABLE) from exc
    if name is None:
        if DEFAULT_BACKEND in found:
            name = DEFAULT_BACKEND
        else:
            persistent = [n for n in found if n != "memory"]
            if len(persistent) != 1:
                shown = ", ".join(sorted(found)) or "none"
                raise CliError(
                    f"no default backend: the JSONL backend is not installed (installed: {shown}); "
                    "pip install dsh-session-persistence-jsonl or pass --backend NAME",
                    EXIT_UNAVAILABLE,
                )
            name = persistent[0]
    cls = found.get(name)
    if cls is None:
        shown = ", ".join(sorted(found)) or "none"
        raise CliError(f'unknown backend "{name}" (installed: {shown})', EXIT_USAGE)
    return name, cls


def require_root(cls: type[object], root: str, options: Mapping[str, str]) -> None:
    """A backend that stores under the root needs it to exist: a typo must not look like an empty, healthy store.

    Reading commands never create it (the backend creates it on the first write of a session).
    """
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # pragma: no cover - a class without an introspectable signature
        return
    if "root" not in params or "root" in options:
        return
    try:
        os.stat(root)
    except FileNotFoundError:
        raise CliError(
            f"session root {root} does not exist (check --root or ${ROOT_ENV}; reading never creates it)",
            EXIT_UNAVAILABLE,
        ) from None
    except OSError as exc:
        raise CliError(storage_message(exc, root), EXIT_UNAVAILABLE) from exc


@asynccontextmanager
async def open_stack(
    backend_name: str | None, root: str, options: Mapping[str, str], keys: KeySource | None = None
) -> AsyncIterator[Stack]:
    """Host + chosen backend (given the keys of ``keys``, if any) + coordinator, closed on exit."""
    host = load_host()
    name, cls = select_backend(host, backend_name)
    require_root(cls, root, options)
    extra = key_options(name, cls, keys, options)
    backend = build_backend(name, cls, root, options, extra)
    async with PersistenceCoordinator(host, backend) as coordinator:
        yield Stack(
            host=host,
            backend=backend,
            coordinator=coordinator,
            backend_name=name,
            root=root,
            keyed=keys is not None,
            keys=keys,
        )
