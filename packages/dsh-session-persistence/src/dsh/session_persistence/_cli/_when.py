"""Parsing the times an operator types: durations (``30d``, ``12h``, ``1w2d``) and dates (``2026-01-31``)."""

from __future__ import annotations

import datetime
import re

from ._errors import EXIT_USAGE, CliError

__all__ = ["parse_duration", "parse_since"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_PART = re.compile(r"(\d+)([smhdw])")
_WHOLE = re.compile(r"(?:\d+[smhdw])+")
#: Longer than any retention anyone means, short enough that ``now - duration`` stays a valid date.
_MAX = datetime.timedelta(days=365 * 1000)


def parse_duration(text: str, option: str) -> datetime.timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` or a sum such as ``1w2d``; anything else is a usage error."""
    raw = text.strip().lower()
    if not _WHOLE.fullmatch(raw):
        raise CliError(f'{option} expects a duration such as 30d, 12h, 90m, 2w or 1w2d, got "{text}"', EXIT_USAGE)
    seconds = sum(int(count) * _UNITS[unit] for count, unit in _PART.findall(raw))
    if seconds <= 0:
        raise CliError(f'{option} must be a positive duration, got "{text}"', EXIT_USAGE)
    if seconds > _MAX.total_seconds():
        raise CliError(f'{option} is longer than 1000 years: "{text}"', EXIT_USAGE)
    return datetime.timedelta(seconds=seconds)


def parse_since(text: str, now: datetime.datetime | None = None) -> datetime.datetime:
    """An aware datetime from ``2026-01-31``, ``2026-01-31T10:00`` (local time unless an offset is given),
    or a duration back from now (``7d``)."""
    raw = text.strip()
    current = now if now is not None else datetime.datetime.now(datetime.timezone.utc)
    if _WHOLE.fullmatch(raw.lower()):
        return current - parse_duration(raw, "--since")
    try:
        stamp = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(
            f'--since expects a date (2026-01-31), a date and time (2026-01-31T10:00) or a duration (7d), got "{text}"',
            EXIT_USAGE,
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.astimezone()  # the operator's local time, like the times `list` prints
    return stamp
