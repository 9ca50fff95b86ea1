"""The session header: immutable metadata stored beside the log, never as an event."""

from __future__ import annotations

import os
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from .jsonvalue import NotLosslessJsonError, is_safe_int, snapshot_json

__all__ = [
    "READABLE_FORMAT_VERSIONS",
    "SESSION_FORMAT_VERSION",
    "SessionHeader",
    "check_header_cwd",
    "header_from_builtins",
    "header_from_stored",
    "header_to_builtins",
]

#: The log format this build writes: v1 (declared batches in the JSONL backend).
SESSION_FORMAT_VERSION = 1
#: Every log format this build reads: v0 logs (written by 0.1) keep loading; a backend upgrades or refuses
#: them on their first write.
READABLE_FORMAT_VERSIONS = frozenset({0, 1})


class SessionHeader(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Header of one session. Optional fields are left out of the wire form when unset.

    ``is_seeded`` says the session inherited history from a fork parent; the exact inherited cut
    (``inherited_event_count``) travels beside the header on every body-bearing read, never inside it.
    """

    version: int = SESSION_FORMAT_VERSION
    id: str
    created_at: int
    cwd: str | UnsetType = UNSET
    parent_session: str | UnsetType = UNSET
    is_seeded: bool = False
    origin: Literal["subagent"] | UnsetType = UNSET
    delegation_depth: int | UnsetType = UNSET
    agent_preset: str | UnsetType = UNSET

    def __post_init__(self) -> None:
        # Every way of building a header (the live path, PersistenceCoordinator.create, a decoded log) gets the
        # same rule: a relative cwd would name a different project directory from every other process.
        if self.cwd is not UNSET:
            check_header_cwd(self.cwd)


def check_header_cwd(cwd: object) -> None:
    """Raise ``ValueError`` unless ``cwd`` is an absolute path string (the one rule for every create path)."""
    if type(cwd) is not str:
        raise ValueError("session header cwd must be a string")
    if not os.path.isabs(cwd):
        raise ValueError(f'session header cwd must be an absolute path, got "{cwd}"')


def header_to_builtins(header: SessionHeader) -> dict[str, Any]:
    """The header as a plain JSON object (camelCase keys, unset fields absent)."""
    out: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(header))
    return out


def _non_negative_safe_int(value: object) -> bool:
    return is_safe_int(value) and value >= 0  # type: ignore[operator]


def header_from_builtins(obj: object, *, expected_id: str | None = None) -> SessionHeader:
    """Validate a plain JSON header and build a frozen :class:`SessionHeader`.

    Fields are checked in a fixed order and the first failure wins, as a ``ValueError`` naming the field.
    Extra keys other than the retired ``seedLength`` are tolerated (and not kept).
    """
    if type(obj) is not dict:
        raise ValueError("session header is not a plain JSON record")
    try:
        data = snapshot_json(obj, "session header")
    except NotLosslessJsonError as exc:
        raise ValueError("session header is not losslessly JSON-serializable") from exc
    assert isinstance(data, dict)
    if "seedLength" in data:
        raise ValueError('session header has invalid field "seedLength"')
    version = data.get("version")
    if not is_safe_int(version) or version not in READABLE_FORMAT_VERSIONS:
        raise ValueError(f"session header version must be {SESSION_FORMAT_VERSION}, got {version!r}")
    sid = data.get("id")
    if type(sid) is not str or (expected_id is not None and sid != expected_id):
        raise ValueError(f'session header id "{sid}" does not match session id "{expected_id or sid}"')
    if not sid:
        raise ValueError("session header id must be a non-empty string")
    created_at = data.get("createdAt")
    if not _non_negative_safe_int(created_at) or _is_negative_zero(created_at):
        raise ValueError("session header createdAt must be a non-negative safe integer")
    kwargs: dict[str, Any] = {"version": version, "id": sid, "created_at": created_at}
    if "cwd" in data:
        cwd = data["cwd"]
        check_header_cwd(cwd)
        kwargs["cwd"] = cwd
    if "parentSession" in data:
        if type(data["parentSession"]) is not str:
            raise ValueError("session header parentSession must be a string")
        kwargs["parent_session"] = data["parentSession"]
    if "isSeeded" in data:
        if type(data["isSeeded"]) is not bool:
            raise ValueError("session header isSeeded must be a boolean")
        kwargs["is_seeded"] = data["isSeeded"]
    if "origin" in data:
        if data["origin"] != "subagent":
            raise ValueError('session header origin must be "subagent"')
        kwargs["origin"] = "subagent"
    if "delegationDepth" in data:
        if not _non_negative_safe_int(data["delegationDepth"]):
            raise ValueError("session header delegationDepth must be a non-negative safe integer")
        kwargs["delegation_depth"] = data["delegationDepth"]
    if "agentPreset" in data:
        if type(data["agentPreset"]) is not str:
            raise ValueError("session header agentPreset must be a string")
        kwargs["agent_preset"] = data["agentPreset"]
    return SessionHeader(**kwargs)


def header_from_stored(obj: object, *, expected_id: str | None = None) -> SessionHeader:
    """A header as a backend read it back: :func:`header_from_builtins`, except that the version is kept.

    Any safe-integer version is accepted and kept as it is, so that the coordinator reports a header written by
    another format version as a format refusal (:class:`SessionFormatUnsupportedError`, "upgrade the harness"),
    not as corruption. Every other field is validated exactly as :func:`header_from_builtins` does; a bad one,
    or a version that is not a safe integer, raises ``ValueError``.
    """
    if type(obj) is dict:
        version = obj.get("version")
        if version != SESSION_FORMAT_VERSION and is_safe_int(version):
            header = header_from_builtins({**obj, "version": SESSION_FORMAT_VERSION}, expected_id=expected_id)
            return msgspec.structs.replace(header, version=version)
    return header_from_builtins(obj, expected_id=expected_id)


def _is_negative_zero(value: object) -> bool:
    return type(value) is float and value == 0 and str(value).startswith("-")
