"""The READMEs' Known Limitations and `dsh-sessions` command lists are tied to the code, so they cannot drift:

* every command list names exactly the parser's commands (the top README's table, the core README's CLI bullet,
  and their Chinese twins);
* a limitation that claims a feature is missing is checked against the public API (it must still be missing), and a
  feature that exists may not be claimed missing (deletion, retention, paging, PostgreSQL on trio, the format
  version);
* each Chinese Known Limitations section names the same code (its backticked spans) as its English twin;
* issue #36's claims: no text anywhere calls the PostgreSQL backend asyncio-only (its tests keep the kit's asyncio
  and trio parametrization); the encryption extra is named one way, the core's, which exists and is the one the
  code names; ``compact``'s docstring says what it writes (v1 plaintext, v2 sealed) and it does; the README's
  ``continue_interrupted()`` with nothing to continue and its garbage-check finding are what the code does.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from dsh.session_persistence import PersistenceCoordinator, Session
from dsh.session_persistence._cli._main import build_parser
from dsh.session_persistence._model.header import SESSION_FORMAT_VERSION
from dsh.session_persistence.testing.fixtures import ANYIO_BACKENDS
from dsh.session_persistence_jsonl import JsonlBackend

REPO = Path(__file__).resolve().parents[3]
TOP = REPO / "README.md"
CORE = REPO / "packages" / "dsh-session-persistence" / "README.md"
JSONL = REPO / "packages" / "dsh-session-persistence-jsonl" / "README.md"
POSTGRES = REPO / "packages" / "dsh-session-persistence-postgres" / "README.md"
READMES = (TOP, CORE)
#: Every README with a Known Limitations section: none may deny a feature that exists.
LIMITED = (TOP, CORE, JSONL, POSTGRES)


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


POSTGRES_TESTS = REPO / "packages" / "dsh-session-persistence-postgres" / "tests"


def postgres_tests_run_on_trio() -> bool:
    """The PostgreSQL backend's tests take the kit's ``anyio_backend`` (asyncio and trio) and none narrows it: no
    module defines, assigns or parametrizes its own."""
    trio_in_kit = any(getattr(p, "id", None) == "trio" for p in ANYIO_BACKENDS)
    conftest = ast.parse((POSTGRES_TESTS / "conftest.py").read_text(encoding="utf-8"))
    imports_kit_fixture = any(
        isinstance(node, ast.ImportFrom)
        and node.module == "dsh.session_persistence.testing.fixtures"
        and any(alias.name == "anyio_backend" for alias in node.names)
        for node in ast.walk(conftest)
    )
    for path in sorted(POSTGRES_TESTS.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "anyio_backend":
                return False
            if isinstance(node, ast.Name) and node.id == "anyio_backend" and isinstance(node.ctx, ast.Store):
                return False
        if re.search(r"parametrize\(\s*[\"']anyio_backend", text):
            return False
    return trio_in_kit and imports_kit_fixture


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
        lambda: hasattr(PersistenceCoordinator, "delete") and hasattr(JsonlBackend, "delete"),
        r"no (?:session )?deletion|session\s+deletion or retention|没有会话删除|会话删除或保留",
    ),
    "retention": (lambda: hasattr(PersistenceCoordinator, "prune"), r"no [^.]*retention|没有[^。]*保留策略"),
    "paging": (
        lambda: hasattr(PersistenceCoordinator, "list_page") and hasattr(JsonlBackend, "list_page"),
        r"unpaginated|不分页",
    ),
    "preparation cache": (
        lambda: "prepared_session_cache_size" in inspect.signature(PersistenceCoordinator).parameters,
        "no preparation cache|not built[^.]*preparation cache|preparation cache[^.]*forward compatibility"
        "|尚无准备缓存|准备缓存\uff08",  # the zh text's full-width parenthesis
    ),
    "rm/prune commands": (lambda: {"rm", "prune"} <= parser_commands(), r"out-of-band|带外"),
    # The PostgreSQL backend's own suite runs every async test on asyncio and trio.
    "postgres on trio": (lambda: postgres_tests_run_on_trio(), r"asyncio[ -]only|PostgreSQL: asyncio|仅支持 asyncio"),
}


@pytest.mark.parametrize("path", [*LIMITED, *map(twin, LIMITED)], ids=lambda p: str(p.relative_to(REPO)))
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


# ----------------------------------------------------------------------------------------------------------------
# Claims outside the Known Limitations (issue #36)

#: Every document a user reads: the READMEs (both languages) and docs/.
ALL_DOCS = sorted([*REPO.glob("README*.md"), *REPO.glob("packages/*/README*.md"), *REPO.glob("docs/*.md")])
_ASYNCIO_ONLY = re.compile(r"asyncio[ -]only|\(asyncio only\b|runs asyncio only|仅 ?asyncio|仅支持 asyncio")


def _blocks(text: str) -> list[str]:
    """Paragraphs, list items and table rows: the unit a claim lives in."""
    return [b for b in re.split(r"\n\s*\n|\n(?=\s*- |\| )", text) if b.strip()]


@pytest.mark.parametrize("doc", ALL_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_text_calls_the_postgres_backend_asyncio_only(doc: Path) -> None:
    assert postgres_tests_run_on_trio()
    for block in _blocks(doc.read_text(encoding="utf-8")):
        if re.search(r"postgres", block, flags=re.IGNORECASE):
            found = _ASYNCIO_ONLY.search(block)
            assert found is None, f"{doc.name} says {found.group(0)!r} of PostgreSQL, which runs on trio: {block!r}"


def _extras(distribution: str) -> dict[str, str]:
    """``{extra: its requirement text}`` of a workspace distribution's pyproject (no TOML parser on 3.10)."""
    text = (REPO / "packages" / distribution / "pyproject.toml").read_text(encoding="utf-8")
    table = re.search(r"^\[project\.optional-dependencies\]\n(.*?)(?=^\[)", text, re.MULTILINE | re.DOTALL)
    assert table is not None, distribution
    return dict(re.findall(r"^([A-Za-z0-9_-]+)\s*=\s*(\[.*?\])", table.group(1), re.MULTILINE))


ENCRYPTION_EXTRA = "dsh-session-persistence[encryption]"


def test_the_encryption_extra_is_the_cores_and_the_code_names_it() -> None:
    assert "cryptography" in _extras("dsh-session-persistence")["encryption"]
    source = (REPO / "packages/dsh-session-persistence/src/dsh/session_persistence/encryption.py").read_text()
    assert set(re.findall(r"pip install '?([a-z-]+\[[a-z-]+\])", source)) == {ENCRYPTION_EXTRA}


@pytest.mark.parametrize("doc", ALL_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_docs_name_the_encryption_extra_one_way(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    for dist, extra in re.findall(r"\b(dsh-session[a-z-]*)\[([a-z-]+)\]", text):
        if (REPO / "packages" / dist).is_dir():  # (`dsh-session-persistence[safe]` is named as what does not exist)
            assert extra in _extras(dist) or extra == "safe", f"{doc.name}: {dist}[{extra}] is no extra"
        if extra == "encryption":
            assert f"{dist}[{extra}]" == ENCRYPTION_EXTRA, f"{doc.name} names {dist}[{extra}], not {ENCRYPTION_EXTRA}"


@pytest.mark.anyio
async def test_compact_writes_what_its_docstring_says(tmp_path: Path) -> None:
    """v1 from a backend without keys; v2 (sealed) from one with them, a sealed log staying sealed."""
    from dsh.session_persistence.backend import StorageMetadata
    from dsh.session_persistence.testing import meta, one_turn_log
    from dsh.session_persistence_jsonl.encryption import StaticKeyProvider

    doc = inspect.getdoc(JsonlBackend.compact) or ""
    assert "always" not in doc and "v1" in doc and "v2" in doc and "stays v2" in doc
    keys = StaticKeyProvider("k1", {"k1": bytes(range(32))})
    for session_id, provider in (("plain", None), ("sealed", keys)):
        backend = JsonlBackend(tmp_path, compression="none", encryption=provider)
        await backend.append_batch(StorageMetadata(meta(session_id)), one_turn_log(), False)
        revision = await backend.read_stored_revision(session_id)
        stored = await backend.load_stored(session_id)
        assert revision is not None and stored is not None
        await backend.compact(StorageMetadata(stored.meta), stored.events, revision)
        data = await anyio.Path(backend.locate(meta(session_id)).path).read_bytes()
        (header,) = [line for line in data.split(b"\n") if b'"id":"%s"' % session_id.encode() in line]
        version = re.search(rb'"version":(\d)', header)
        assert version is not None and version.group(1) == (b"2" if provider is not None else b"1"), header


def _readme_block(marker: str) -> str:
    """The README bullet (or paragraph) that starts with ``marker``."""
    (block,) = [b for b in _blocks(TOP.read_text(encoding="utf-8")) if b.lstrip().startswith(marker)]
    return " ".join(block.split())


@pytest.mark.anyio
async def test_continue_with_nothing_to_continue_is_what_the_readme_says(tmp_path: Path) -> None:
    from dsh.session_persistence import NoInterruptedTurnError, open_sessions
    from dsh.session_persistence.testing import ScriptedAdapter, TextResponse

    said = _readme_block("- **Continue.**")
    assert "With nothing to continue" in said and "`NoInterruptedTurnError`" in said and "writes nothing" in said
    async with open_sessions(tmp_path, require_checkpoint_policy=False) as sessions:
        agent = await sessions.create("calm", ScriptedAdapter([TextResponse("hi")]))
        await agent.run_turn("Hello")
        assert agent.interrupted_turn is None
        before = (await sessions.inspect("calm")).events
        with pytest.raises(NoInterruptedTurnError):
            await agent.continue_interrupted()
        assert (await sessions.inspect("calm")).events == before


@pytest.mark.anyio
async def test_a_garbage_check_is_recorded_as_the_readme_says(tmp_path: Path) -> None:
    """A crash left call c1 of tool "probe" unknown; its check answers ``True``: the README's finding, quoted."""
    from dsh.session_persistence import open_sessions
    from dsh.session_persistence.backend import StorageMetadata
    from dsh.session_persistence.loop import FunctionTool
    from dsh.session_persistence.testing import (
        ScriptedAdapter,
        TextResponse,
        assistant_message,
        meta,
        step_start,
        tool_call,
        turn_start,
        user_message,
    )

    said = _readme_block("- **Reconcile.**")
    quoted = re.search(r"returns anything but a `Reconciliation`.*?stored as `(\w+)`.*?\(`([^`]+)`\)", said)
    assert quoted is not None, said
    crashed = [
        turn_start(0, 1),
        user_message(1, "pay"),
        step_start(2, 1, 1),
        assistant_message(3, "on it", tool_calls=["c1"]),
    ]
    await JsonlBackend(tmp_path).append_batch(StorageMetadata(meta("paid")), [*crashed, tool_call(4, "c1")], False)

    def probe(call_id: str) -> str:  # never run here: a resume does not re-run a tool
        raise AssertionError("re-run")

    def garbage(call_id: str) -> bool:
        return True

    tools = [FunctionTool("probe", probe, with_call_id=True, check=garbage)]
    async with open_sessions(tmp_path, require_checkpoint_policy=False) as sessions:
        await sessions.resume("paid", ScriptedAdapter([TextResponse("ok")]), tools)
        events = (await sessions.inspect("paid")).events
    (finding,) = [e for e in events if e.type == "tool/reconcile"]
    assert (finding.data.outcome, finding.data.detail) == (quoted.group(1), quoted.group(2))
