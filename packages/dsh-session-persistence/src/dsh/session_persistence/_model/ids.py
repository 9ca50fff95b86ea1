"""What a session id may be: the one rule every entry that takes an id applies, before any I/O."""

from __future__ import annotations

from .errors import SessionIdError

__all__ = ["check_session_id"]


def check_session_id(session_id: object) -> str:
    """``session_id`` if it can name a session, else :class:`SessionIdError`.

    A session id is a non-empty ``str`` of text: a lone surrogate code point (what undecodable bytes become in
    Python) can be written to no log and named by no file, so it is refused here instead of deep in a backend.
    """
    if type(session_id) is not str or not session_id:
        raise SessionIdError(f"a session id must be a non-empty string, got {session_id!r}")
    if not session_id.isascii():  # ASCII cannot hold a surrogate: the common case costs one scan in C
        try:
            session_id.encode("utf-8")
        except UnicodeEncodeError:
            message = f"a session id must be text, got {session_id!r} (a lone surrogate code point)"
            raise SessionIdError(message) from None
    return session_id
