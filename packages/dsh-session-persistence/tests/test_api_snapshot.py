"""The public API of every face, recorded as text: a change to a face is deliberate (it shows in a diff).

Each face module's ``__all__`` is rendered one name a line: its kind and, for functions and classes, the call
signature (annotations as written). Regenerate after a deliberate change with::

    python packages/dsh-session-persistence/tests/test_api_snapshot.py --write
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

import msgspec
import pytest

SNAPSHOTS = Path(__file__).resolve().parent / "api"
FACES = (
    "dsh.session_persistence",
    "dsh.session_persistence.events",
    "dsh.session_persistence.backend",
    "dsh.session_persistence.encryption",
    "dsh.session_persistence.hookspecs",
    "dsh.session_persistence.invariant",
    "dsh.session_persistence.loop",
    "dsh.session_persistence.repair",
    "dsh.session_persistence.testing",
    "dsh.session_persistence.testing.fixtures",
)


def _signature(obj: object) -> str:
    try:
        text = str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "(...)"
    return re.sub(r" at 0x[0-9a-f]+>", ">", text)  # a default's repr must not depend on the process


def _struct_fields(cls: type) -> str:
    """A msgspec Struct's fields as written in the source (annotations are strings here), in declaration order."""
    hints: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for field, hint in vars(klass).get("__annotations__", {}).items():
            hints[field] = str(hint)
    shown = [f"{f}: {hints.get(f, '?')}" for f in cls.__struct_fields__]  # type: ignore[attr-defined]
    return "{" + ", ".join(shown) + "}"


def _protocol_members(cls: type) -> str:
    """A Protocol's attributes and methods, each with its annotation or signature as written."""
    shown: list[str] = []
    for member, hint in vars(cls).get("__annotations__", {}).items():
        shown.append(f"{member}: {hint}")
    for member, value in vars(cls).items():
        if not member.startswith("_") and callable(value):
            shown.append(f"{member}{_signature(value)}")
    return "{" + "; ".join(shown) + "}"


def _methods(cls: type) -> list[str]:
    """The public methods and properties a core class defines itself (inherited ones belong to their own class),
    plus those of its private base classes (named ``_...``, e.g. the conformance kit's groups of cases), which
    belong to no face of their own."""
    if not cls.__module__.startswith("dsh."):
        return []
    # A private base listed under a public class of the face that inherits it belongs there, not here too.
    public_bases = [k for k in cls.__mro__[1:] if not k.__name__.startswith("_") and k.__module__.startswith("dsh.")]
    own: dict[str, object] = {}
    for klass in reversed(cls.__mro__):
        private = klass.__name__.startswith("_") and klass.__module__.startswith("dsh.")
        if klass is cls or (private and not any(issubclass(base, klass) for base in public_bases)):
            own.update(vars(klass))
    out: list[str] = []
    for member, value in sorted(own.items()):
        if member.startswith("_"):
            continue
        if isinstance(value, property):
            out.append(f"    .{member} (property)")
        elif isinstance(value, (staticmethod, classmethod)):
            out.append(f"    .{member}{_signature(value.__func__)}")
        elif inspect.isfunction(value):
            out.append(f"    .{member}{_signature(value)}")
    return out


def _describe(name: str, obj: object) -> str:
    if inspect.isclass(obj):
        bases = ", ".join(b.__name__ for b in obj.__bases__ if b is not object)
        if issubclass(obj, BaseException):
            return f"error {name}({bases})"
        if issubclass(obj, msgspec.Struct):
            return f"struct {name}({bases}) {_struct_fields(obj)}"
        if getattr(obj, "_is_protocol", False):
            return f"protocol {name} {_protocol_members(obj)}"
        head = f"class {name}" + (f"({bases})" if bases else "") + f" {_signature(obj)}"
        return "\n".join([head, *_methods(obj)])
    if inspect.isfunction(obj):
        return f"def {name}{_signature(obj)}"
    if type(obj).__module__ in ("typing", "types", "typing_extensions"):
        return f"alias {name}"  # a Union or Callable alias: its repr differs between Python versions
    if isinstance(obj, (str, int, float, bool)):
        return f"const {name} = {obj!r}"
    if isinstance(obj, frozenset):
        return f"const {name} = frozenset({sorted(obj)!r})"
    if callable(obj):
        return f"callable {name}"
    return f"value {name}: {type(obj).__name__}"


def render(face: str) -> str:
    module = importlib.import_module(face)
    names = list(module.__all__)
    lines = [f"# {face}: {len(names)} names"]
    lines += [_describe(name, getattr(module, name)) for name in sorted(names, key=str.lower)]
    return "\n".join(lines) + "\n"


def _path(face: str) -> Path:
    return SNAPSHOTS / f"{face}.txt"


@pytest.mark.parametrize("face", FACES)
def test_public_api_matches_its_snapshot(face: str) -> None:
    expected = _path(face).read_text(encoding="utf-8")
    assert render(face) == expected, (
        f"the public API of {face} changed; if deliberate, run "
        "python packages/dsh-session-persistence/tests/test_api_snapshot.py --write and commit the snapshot"
    )


def test_every_public_module_of_the_core_has_a_snapshot() -> None:
    package = Path(importlib.import_module("dsh.session_persistence").__file__ or "").parent
    public = {"dsh.session_persistence"}
    for path in [*package.glob("*.py"), *package.glob("*/*.py")]:
        parts = path.relative_to(package).with_suffix("").parts
        if not any(part.startswith("_") for part in parts):
            public.add(".".join(("dsh.session_persistence", *parts)))
        elif parts[-1] == "__init__" and not any(part.startswith("_") for part in parts[:-1]):
            public.add(".".join(("dsh.session_persistence", *parts[:-1])))
    assert public == set(FACES)


def test_faces_export_only_names_they_define_or_re_export() -> None:
    for face in FACES:
        module = importlib.import_module(face)
        assert len(set(module.__all__)) == len(module.__all__), face
        for name in module.__all__:
            assert hasattr(module, name), f"{face}.__all__ names {name}, which it does not define"


def _documented(face: str) -> list[tuple[str, str]]:
    """(where, docstring) for the face module, each name in its ``__all__`` and a core class's public members."""
    module = importlib.import_module(face)
    out = [(face, module.__doc__ or "")]
    for name in module.__all__:
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue  # constants and aliases carry their type's docstring, not their own
        out.append((f"{face}.{name}", obj.__doc__ or ""))
        if inspect.isclass(obj) and obj.__module__.startswith("dsh."):
            for member, value in vars(obj).items():
                if not member.startswith("_"):
                    out.append((f"{face}.{name}.{member}", getattr(value, "__doc__", None) or ""))
    return out


@pytest.mark.parametrize("face", FACES)
def test_public_docstrings_stand_alone(face: str) -> None:
    # A user reading help() has no design documents: no section references.
    offenders = [where for where, doc in _documented(face) if "§" in doc]
    assert not offenders


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: test_api_snapshot.py --write")
    SNAPSHOTS.mkdir(exist_ok=True)
    for face in FACES:
        _path(face).write_text(render(face), encoding="utf-8")
        print(f"wrote {_path(face)}")
