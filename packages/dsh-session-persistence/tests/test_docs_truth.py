"""The READMEs' Known Limitations and `dsh-sessions` command lists are tied to the code, so they cannot drift:

* every command list names exactly the parser's commands (the top README's table, the core README's CLI bullet,
  and their Chinese twins);
* a limitation that claims a feature is missing is checked against the public API (it must still be missing), and a
  feature that exists may not be claimed missing (deletion, retention, paging, PostgreSQL on trio, the format
  version);
* each Chinese Known Limitations section names the same code (its backticked spans) as its English twin.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from dsh.session_persistence import PersistenceCoordinator, Session
from dsh.session_persistence._cli._main import build_parser
from dsh.session_persistence._model.header import SESSION_FORMAT_VERSION

REPO = Path(__file__).resolve().parents[3]
TOP = REPO / "README.md"
CORE = REPO / "packages" / "dsh-session-persistence" / "README.md"
READMES = (TOP, CORE)


def twin(path: Path) -> Path:
    return path.with_name("README.zh.md")


def parser_commands() -> set[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    choices = sub.choices
    assert isinstance(choices, dict)
    return set(choices)


def _lim(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    (found,) = [p for p in parts if p.startswith(("Known Limitations", "已知限制"))]
    return found


# ----------------------------------------------------------------------------------------------------------------
# Command lists


def top_table_commands(path: Path) -> set[str]:
    rows = re.findall(r"^\| `([a-z-]+)[^`]*` \|", _command_section(path), flags=re.MULTILINE)
    return set(rows)


def _command_section(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    (found,) = [p for p in parts if p.startswith(("The `dsh-sessions` command", "`dsh-sessions` 命令"))]
    return found


def core_bullet_commands(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    match = re.search(
        r"^- \*\*(?:The )?`dsh-sessions` CLI\*\*(?::|\uff1a)(.*?)(?=^- |\n\n)", text, re.MULTILINE | re.DOTALL
    )
    assert match is not None, f"no CLI bullet in {path}"
    # The commands are the backticked spans that start with a lowercase word (`show ID`), not options or variables.
    spans = re.findall(r"`([a-z][a-z-]*)(?: [A-Z.\[\]]+)*`", match.group(1))
    return {s for s in spans if not s.startswith("dsh-")}  # distribution names are not commands


@pytest.mark.parametrize("path", [TOP, twin(TOP)], ids=lambda p: p.name)
def test_top_readme_command_table_is_the_parser(path: Path) -> None:
    assert top_table_commands(path) == parser_commands()


@pytest.mark.parametrize("path", [CORE, twin(CORE)], ids=lambda p: p.name)
def test_core_readme_cli_list_is_the_parser(path: Path) -> None:
    assert core_bullet_commands(path) == parser_commands()


# ----------------------------------------------------------------------------------------------------------------
# Known Limitations


def _missing(cls: type, *names: str) -> Callable[[], bool]:
    return lambda: not any(hasattr(cls, n) for n in names)


# A limitation text that claims something is missing -> the check that it still is.
CLAIMED_MISSING: dict[str, Callable[[], bool]] = {
    r"`prepare`": _missing(PersistenceCoordinator, "prepare"),
    r"`borrow_session`": _missing(PersistenceCoordinator, "borrow_session"),
    r"`replace`": _missing(Session, "replace"),
}

# Features that exist -> phrases that would claim they do not (English and Chinese).
EXISTING: dict[str, tuple[Callable[[], bool], str]] = {
    "deletion": (
        lambda: hasattr(PersistenceCoordinator, "delete"),
        r"no (?:session )?deletion|session\s+deletion or retention|没有会话删除|会话删除或保留",
    ),
    "retention": (lambda: hasattr(PersistenceCoordinator, "prune"), r"no [^.]*retention|没有[^。]*保留策略"),
    "paging": (lambda: hasattr(PersistenceCoordinator, "list_page"), r"unpaginated|不分页"),
    "preparation cache": (
        lambda: "prepared_session_cache_size" in inspect.signature(PersistenceCoordinator).parameters,
        "no preparation cache|not built[^.]*preparation cache|preparation cache[^.]*forward compatibility"
        "|尚无准备缓存|准备缓存\uff08",  # the zh text's full-width parenthesis
    ),
    "rm/prune commands": (lambda: {"rm", "prune"} <= parser_commands(), r"out-of-band|带外"),
    # The PostgreSQL backend's own suite runs every async test on asyncio and trio.
    "postgres on trio": (lambda: True, r"asyncio[ -]only|PostgreSQL: asyncio|仅支持 asyncio"),
}


@pytest.mark.parametrize("path", [*READMES, *map(twin, READMES)], ids=lambda p: str(p.relative_to(REPO)))
def test_no_limitation_denies_a_feature_that_exists(path: Path) -> None:
    text = " ".join(_lim(path).split())
    for feature, (exists, denial) in EXISTING.items():
        assert exists(), feature
        found = re.search(denial, text, flags=re.IGNORECASE)
        assert found is None, f"{path.name}: Known Limitations says {found.group(0)!r}, but {feature} exists"


@pytest.mark.parametrize("path", [*READMES, *map(twin, READMES)], ids=lambda p: str(p.relative_to(REPO)))
def test_claimed_missing_features_are_missing(path: Path) -> None:
    text = _lim(path)
    for claim, still_missing in CLAIMED_MISSING.items():
        if re.search(claim, text):
            assert still_missing(), f"{path.name}: Known Limitations names {claim} as missing, but it exists"


@pytest.mark.parametrize("path", READMES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_stated_format_version_is_the_code(path: Path) -> None:
    for side in (path, twin(path)):
        for stated in re.findall(r"`SESSION_FORMAT_VERSION` (?:is|为) (\d+)", _lim(side)):
            assert int(stated) == SESSION_FORMAT_VERSION, side


@pytest.mark.parametrize("path", READMES, ids=lambda p: str(p.relative_to(REPO)))
def test_chinese_limitations_name_the_same_code(path: Path) -> None:
    def spans(p: Path) -> set[str]:
        return set(re.findall(r"`([^`]+)`", _lim(p)))

    assert spans(twin(path)) == spans(path)
