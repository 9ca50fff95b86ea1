"""Exit codes and the one error type every command raises for an expected failure."""

from __future__ import annotations

__all__ = [
    "EXIT_DAMAGED",
    "EXIT_DECLINED",
    "EXIT_DEMO_FAILED",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_KEY",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "KEY_HINT",
    "CliError",
    "key_hint",
]

EXIT_OK = 0
#: Stored data is damaged, or intact but in a format this build refuses (``verify`` found a bad session).
EXIT_DAMAGED = 1
#: Bad flags or arguments (argparse uses 2 as well), or a confirmation that cannot be asked.
EXIT_USAGE = 2
#: The session id does not exist in the selected root/backend.
EXIT_NOT_FOUND = 3
#: The storage cannot be used: unreadable or non-directory root, permission denied, a backend that fails to open.
EXIT_UNAVAILABLE = 4
#: The user answered "no" to ``repair``'s confirmation.
EXIT_DECLINED = 5
#: ``demo`` could not complete (the child did not reach its kill point, or the resumed log is not as expected).
EXIT_DEMO_FAILED = 6
#: An encrypted session cannot be opened: its key is not provided (or the key source holds none), or a batch fails
#: authentication (the key is wrong, or its bytes were altered or moved). Never reported as damage.
EXIT_KEY = 7
#: Appended to a missing-key message when no keys were given: where the CLI takes keys from.
KEY_HINT = " (give the store's keys: --key-env NAME or --key-file PATH)"


def key_hint(keys: tuple[str, str] | None) -> str:
    """What to append to a key error: where to give keys, or, when keys were given, which ones (never "give")."""
    return KEY_HINT if keys is None else f" (keys given: --key-{keys[0]} {keys[1]})"


#: A bug: an unexpected exception (run with ``DSH_SESSIONS_DEBUG=1`` for the traceback).
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """An expected failure: printed as one line on stderr, the process exits with ``code``."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
