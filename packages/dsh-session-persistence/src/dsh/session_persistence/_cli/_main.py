"""``dsh-sessions``: argument parsing, dispatch and the error-to-exit-code mapping (sync entry point over anyio)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from typing import NoReturn

import anyio

from .._model.errors import (
    EncryptionUnavailableError,
    LifecycleArgumentError,
    SessionDecryptError,
    SessionFormatUnsupportedError,
    SessionIdError,
    SessionKeyError,
    SessionNotFoundError,
    SessionPersistenceCorruptionError,
    SessionPersistenceError,
    SessionStorageError,
)
from .._model.ids import check_session_id
from ._commands import cmd_export, cmd_plugins, cmd_show, cmd_stats
from ._context import ROOT_ENV, KeySource, load_host, open_stack, parse_options, resolve_root, storage_message
from ._errors import (
    EXIT_DAMAGED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_KEY,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    key_hint,
)
from ._io import Io
from ._json_errors import error_code, wants_json, write_error_json
from ._lifecycle_cmds import cmd_compact, cmd_prune, cmd_reencrypt, cmd_rm
from ._list_cmd import cmd_list
from ._verify import cmd_repair, cmd_verify
from ._version import write_version

if sys.version_info < (3, 11):  # pragma: no cover - exercised on 3.10 only
    from exceptiongroup import BaseExceptionGroup

__all__ = ["build_parser", "main", "run"]

PROG = "dsh-sessions"
DEBUG_ENV = "DSH_SESSIONS_DEBUG"

_EPILOG = f"""\
root: --root, else ${ROOT_ENV}, else $XDG_DATA_HOME/dsh-sessions (~/.local/share/dsh-sessions).
exit codes: 0 ok; 1 corrupt or unsupported data (verify: a session is not loadable), or a live or
locked session; 2 usage error; 3 session not found; 4 storage unavailable (a missing root included);
5 declined at the prompt; 6 demo failed; 7 an encrypted session's key is not provided, or a batch
fails authentication (wrong key, or altered bytes); 70 internal error. With --json, errors are a JSON document
on stdout: {{"error": {{"code": ..., "exit": ..., "message": ...}}}}.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is a :class:`CliError` (one line, exit 2) instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')", EXIT_USAGE)


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # Accepted before and after the command; the subcommand copies must not reset values given before it.
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--root", default=default, help=f"session root (default: ${ROOT_ENV} or the XDG data dir)")
    parser.add_argument("--backend", default=default, help="storage backend by name (default: jsonl)")
    parser.add_argument(
        "-o",
        "--backend-option",
        action="append",
        metavar="KEY=VALUE",
        default=[] if top else argparse.SUPPRESS,
        help="backend constructor option, e.g. -o compression=none (repeatable)",
    )
    parser.add_argument(
        "--key-env",
        default=default,
        metavar="NAME",
        help="keys of an encrypted store from environment variable NAME (id:base64key,..., the first current)",
    )
    parser.add_argument(
        "--key-file", default=default, metavar="PATH", help="keys of an encrypted store from a chmod-600 file"
    )
    parser.add_argument(
        "--json", action="store_true", default=False if top else argparse.SUPPRESS, help="machine-readable output"
    )


def build_parser() -> argparse.ArgumentParser:
    """The full ``dsh-sessions`` parser."""
    parser = _Parser(
        prog=PROG,
        description="Inspect, verify, repair and export durable dsh session logs, or run the crash demo.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(parser, top=True)
    parser.add_argument(
        "--version", action="store_true", help="print the core's version and every installed dsh-* distribution's"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        _common(sub, top=False)
        return sub

    listing = command("list", "list sessions, most recent activity first (a page with --limit)")
    listing.add_argument("--limit", type=_positive_int, default=None, metavar="N", help="at most N sessions")
    listing.add_argument("--cursor", default=None, help="continue after a previous page (its nextCursor)")
    listing.add_argument(
        "--order", choices=["recent", "created"], default="recent", help="by last activity (default) or creation"
    )
    listing.add_argument("--since", default=None, metavar="WHEN", help="active since a date (2026-01-31) or 7d ago")
    listing.add_argument("--cwd", default=None, metavar="PATH", help="only sessions started in PATH")
    listing.add_argument("--parent", default=None, metavar="ID", type=_session_id, help="only sessions forked from ID")
    command("show", "print a readable transcript of one session").add_argument(
        "id", type=_session_id, help="session id"
    )
    command("verify", "check integrity without modifying anything").add_argument(
        "id", nargs="?", default=None, type=_session_id, help="session id (default: every session)"
    )
    repair = command("repair", "commit crash repair for one session (cold load)")
    repair.add_argument("id", type=_session_id, help="session id")
    repair.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    repair.add_argument(
        "--discard-damaged-tail",
        action="store_true",
        help="discard a damaged FINAL batch (printing what is lost first); damage elsewhere is never cut",
    )
    export = command("export", "the decoded log as JSONL on stdout (what inspect returns)")
    export.add_argument("id", type=_session_id, help="session id")
    export.add_argument(
        "--salvage", action="store_true", help="of a damaged log, the committed events before the first damage"
    )
    rm = command("rm", "delete sessions for good (durably; a live session is refused)")
    rm.add_argument("ids", nargs="+", metavar="ID", type=_session_id, help="session id")
    rm.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    prune = command("prune", "retention: delete sessions idle for longer than --older-than (dry run without a tty)")
    prune.add_argument("--older-than", default=None, metavar="DURATION", help="e.g. 30d, 12h, 2w")
    prune.add_argument("--keep-last", type=int, default=None, metavar="N", help="always keep the N most recent")
    prune.add_argument("--dry-run", action="store_true", help="only report what would be deleted")
    prune.add_argument("-y", "--yes", action="store_true", help="delete without asking")
    for name, help_text in (
        ("compact", "rewrite closed sessions' logs as one batch each (same events)"),
        ("re-encrypt", "re-seal closed sessions under the current key (as compact: one batch each, atomically)"),
    ):
        rewrite = command(name, help_text)
        rewrite.add_argument("ids", nargs="*", metavar="ID", type=_session_id, help="session id")
        rewrite.add_argument("--all", action="store_true", help="every readable session of the store")
    command("stats", "counts, bytes and compression ratio")
    command("plugins", "loaded dsh.session plugins, their distributions and hooks")
    demo = command("demo", "run a scripted agent, SIGKILL it mid-tool, resume it and show the repaired transcript")
    demo.add_argument("--child-backend", choices=["asyncio", "trio"], default="asyncio", help=argparse.SUPPRESS)
    demo.add_argument(
        "--model",
        default=None,
        metavar="NAME",
        help="run on a real model through dsh-session-adapter-openai instead of the scripted one",
    )
    demo.add_argument(
        "--base-url", default=None, metavar="URL", help="its OpenAI-compatible endpoint (default: $OPENAI_BASE_URL)"
    )
    demo.add_argument(
        "--api-key", default=None, metavar="KEY", help="its key (default: $OPENAI_API_KEY, which keeps it off ps)"
    )
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _session_id(text: str) -> str:
    """A session id argument: non-empty text (argv bytes that are not text arrive as lone surrogates)."""
    try:
        return check_session_id(text)
    except SessionIdError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "error"


def _classify(exc: BaseException, root: str | None, keys: KeySource | None) -> CliError | None:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _classify(exc.exceptions[0], root, keys)
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, SessionNotFoundError):
        return CliError(str(exc), EXIT_NOT_FOUND)
    if isinstance(exc, SessionKeyError):
        return CliError(str(exc) + key_hint(keys), EXIT_KEY)
    if isinstance(exc, EncryptionUnavailableError):  # an installation problem: no key would help
        return CliError(str(exc), EXIT_UNAVAILABLE)
    if isinstance(exc, SessionDecryptError):
        return CliError(str(exc), EXIT_KEY)
    if isinstance(exc, LifecycleArgumentError):
        return CliError(str(exc), EXIT_USAGE)
    if isinstance(exc, SessionStorageError) and isinstance(exc.__cause__, OSError):
        return CliError(storage_message(exc.__cause__, root or "?"), EXIT_UNAVAILABLE)
    if isinstance(exc, SessionStorageError):
        return CliError(str(exc), EXIT_UNAVAILABLE)
    if isinstance(exc, (SessionFormatUnsupportedError, SessionPersistenceCorruptionError, SessionPersistenceError)):
        return CliError(str(exc), EXIT_DAMAGED)
    if isinstance(exc, OSError):
        return CliError(storage_message(exc, root or "?"), EXIT_UNAVAILABLE)
    return None


def _key_source(args: argparse.Namespace) -> KeySource | None:
    env, file = getattr(args, "key_env", None), getattr(args, "key_file", None)
    if env is not None and file is not None:
        raise CliError("give --key-env or --key-file, not both", EXIT_USAGE)
    if env is not None:
        return ("env", env)
    return None if file is None else ("file", file)


async def _dispatch(args: argparse.Namespace, io: Io) -> int:
    if args.command == "plugins":
        return await cmd_plugins(args, load_host(), io)
    root = resolve_root(args.root)
    if args.command == "demo":
        from ._demo import cmd_demo  # imported lazily: only the demo needs subprocess machinery

        return await cmd_demo(args, root, io)
    handlers = {
        "list": cmd_list,
        "show": cmd_show,
        "verify": cmd_verify,
        "repair": cmd_repair,
        "export": cmd_export,
        "stats": cmd_stats,
        "rm": cmd_rm,
        "prune": cmd_prune,
        "compact": cmd_compact,
        "re-encrypt": cmd_reencrypt,
    }
    async with open_stack(args.backend, root, parse_options(args.backend_option), _key_source(args)) as stack:
        return await handlers[args.command](args, stack, io)


def run(argv: list[str] | None, io: Io) -> int:
    """Parse ``argv`` and run the command; returns the exit code (never raises for expected failures)."""
    root: str | None = None
    keys: KeySource | None = None
    as_json = wants_json(argv)
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        if args.version:
            write_version(io, as_json=bool(args.json))
            return EXIT_OK
        if args.command is None:
            parser.print_help(io.err)
            return EXIT_USAGE
        root = args.root
        as_json = bool(getattr(args, "json", False))
        with contextlib.suppress(CliError):  # both sources given: _dispatch reports that
            keys = _key_source(args)
        return anyio.run(_dispatch, args, io, backend="asyncio")
    except KeyboardInterrupt:
        io.err.write(f"{PROG}: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``export ID | head``): not an error of ours. Stop writing to the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except BaseException as exc:
        if not isinstance(exc, Exception) and not isinstance(exc, BaseExceptionGroup):
            raise
        error = _classify(exc, root, keys)
        if as_json:
            message = _one_line(str(error if error is not None else f"internal error: {type(exc).__name__}: {exc}"))
            write_error_json(io.out, error_code(error, exc), EXIT_INTERNAL if error is None else error.code, message)
        if error is None:
            io.err.write(f"{PROG}: internal error: {type(exc).__name__}: {_one_line(str(exc))}\n")
            if os.environ.get(DEBUG_ENV):
                traceback.print_exception(exc, file=io.err)
            else:
                io.err.write(f"{PROG}: set {DEBUG_ENV}=1 for the traceback\n")
            return EXIT_INTERNAL
        io.err.write(f"{PROG}: error: {_one_line(str(error))}\n")
        if os.environ.get(DEBUG_ENV):
            traceback.print_exception(exc, file=io.err)
        return error.code


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point (``dsh-sessions``)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            # A transcript may hold any text; never die on a terminal that cannot show a character.
            reconfigure(errors="backslashreplace")
    return run(sys.argv[1:] if argv is None else argv, Io(out=sys.stdout, err=sys.stderr, inp=sys.stdin))
