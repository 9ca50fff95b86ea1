"""Array parameters as PostgreSQL array literals, rendered in one pass instead of through psycopg's list dumpers.

A write sends its rows as arrays (``%(seqs)s::bigint[]``, ``%(bodies)s::bytea[]``...). psycopg's client-side binding
adapts a Python list element by element in Python (a dumper lookup and a quote per element), which cost more CPU
than the rest of a group transaction's client side together. Here each array is rendered as the text of its literal
(``{1,2}``, ``{"\\\\x6869",NULL}``) in a few string operations, and psycopg quotes that one string like any other
text parameter; the statement's cast parses it on the server. The text is exact: integers in decimal, booleans as
``t``/``f``, bytea in hex, text elements double-quoted with ``\\`` and ``"`` escaped (inside double quotes nothing
else is special to the array parser), ``None`` as an unquoted ``NULL``.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["bigint_array", "bool_array", "bytea_array", "text_array"]


def bigint_array(values: Iterable[int]) -> str:
    """``{1,2,3}``: the literal of a ``bigint[]`` (every value an ``int``)."""
    return "{" + ",".join([str(int(value)) for value in values]) + "}"


def bool_array(values: Iterable[bool]) -> str:
    """``{t,f}``: the literal of a ``boolean[]``."""
    return "{" + ",".join(["t" if value else "f" for value in values]) + "}"


def bytea_array(values: Iterable[bytes | None]) -> str:
    """``{"\\\\x6869",NULL}``: the literal of a ``bytea[]`` in hex (the array parser turns ``\\\\`` into ``\\``)."""
    return "{" + ",".join(['"\\\\x' + value.hex() + '"' if value is not None else "NULL" for value in values]) + "}"


def text_array(values: Iterable[str | None]) -> str:
    """``{"a","b\\"c",NULL}``: the literal of a ``text[]``, every element quoted."""
    return "{" + ",".join([_quoted(value) if value is not None else "NULL" for value in values]) + "}"


def _quoted(value: str) -> str:
    if "\\" in value or '"' in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + value + '"'
