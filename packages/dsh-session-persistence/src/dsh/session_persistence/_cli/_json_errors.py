"""Errors as a JSON document on stdout under ``--json``: ``{"error": {"code", "exit", "message"}}``.

A script that asked for JSON gets JSON on failure too: the same one-line message as on stderr, the exit code
the process exits with, and a stable symbolic ``code`` to branch on. The human line still goes to stderr.
"""

from __future__ import annotations

import sys
from typing import TextIO

from .._model.errors import (
    EncryptionUnavailableError,
    LifecycleArgumentError,
    SessionChangedError,
    SessionCursorError,
    SessionDecryptError,
    SessionFormatUnsupportedError,
    SessionKeyError,
    SessionLiveError,
    SessionLockedError,
    SessionNeedsRepairError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionStorageError,
)
from ._demo_model import ModelAdapterMissingError
from ._errors import (
    EXIT_DAMAGED,
    EXIT_DECLINED,
    EXIT_DEMO_FAILED,
    EXIT_INTERNAL,
    EXIT_KEY,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
)
from ._output import write_json

if sys.version_info < (3, 11):  # pragma: no cover - exercised on 3.10 only
    from exceptiongroup import BaseExceptionGroup

__all__ = ["error_code", "wants_json", "write_error_json"]

# Most specific first: the first class the exception is an instance of names the code.
_BY_TYPE: tuple[tuple[type[BaseException], str], ...] = (
    (ModelAdapterMissingError, "adapter_missing"),
    (SessionCursorError, "bad_cursor"),
    (LifecycleArgumentError, "bad_argument"),
    (SessionNotFoundError, "not_found"),
    (SessionLockedError, "locked"),
    (SessionLiveError, "live"),
    (SessionChangedError, "changed"),
    (SessionNeedsRepairError, "needs_repair"),
    (SessionKeyError, "key_missing"),
    (EncryptionUnavailableError, "encryption_unavailable"),
    (SessionDecryptError, "decrypt_failed"),
    (SessionFormatUnsupportedError, "unsupported"),
    (SessionPersistenceCorruptionError, "damaged"),
    (SessionStorageError, "unavailable"),
    (OSError, "unavailable"),
)
_BY_EXIT = {
    EXIT_DAMAGED: "damaged",
    EXIT_USAGE: "usage",
    EXIT_NOT_FOUND: "not_found",
    EXIT_UNAVAILABLE: "unavailable",
    EXIT_DECLINED: "declined",
    EXIT_DEMO_FAILED: "demo_failed",
    EXIT_KEY: "key",
    EXIT_INTERNAL: "internal",
}


def wants_json(argv: list[str] | None) -> bool:
    """Whether ``--json`` was given (before a ``--``), known even when parsing the rest fails."""
    words = sys.argv[1:] if argv is None else argv
    for word in words:
        if word == "--":
            return False
        if word == "--json":
            return True
    return False


def _root_cause(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def error_code(error: CliError | None, exc: BaseException) -> str:
    """The symbolic code: from the typed error behind the failure, else from the exit code."""
    cause: BaseException | None = _root_cause(exc)
    while cause is not None:
        for kind, code in _BY_TYPE:
            if isinstance(cause, kind):
                return code
        cause = cause.__cause__
    if error is None:
        return "internal"
    return _BY_EXIT.get(error.code, "error")


def write_error_json(out: TextIO, code: str, exit_code: int, message: str) -> None:
    """The error document, on stdout."""
    write_json(out, {"error": {"code": code, "exit": exit_code, "message": message}})
