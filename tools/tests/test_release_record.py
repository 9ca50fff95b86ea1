"""tools/releases.toml names real builds: each entry's commit exists and carries that version of that distribution,
every distribution's current version is at least its newest release, and every JSONL release left golden logs."""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "tools" / "releases.toml"
GOLDEN = REPO / "packages" / "dsh-session-persistence-jsonl" / "tests" / "golden"


def _record() -> list[dict[str, Any]]:
    with RECORD.open("rb") as f:
        releases: list[dict[str, Any]] = tomllib.load(f)["release"]
    return releases


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False, timeout=60)


def _version_at(commit: str, dist: str) -> str:
    shown = _git("show", f"{commit}:packages/{dist}/pyproject.toml")
    assert shown.returncode == 0, f"{dist} has no pyproject.toml at {commit}: {shown.stderr}"
    project: dict[str, Any] = tomllib.loads(shown.stdout)["project"]
    assert project["name"] == dist
    return str(project["version"])


def _current_version(dist: str) -> str:
    with (REPO / "packages" / dist / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


RELEASES = _record()


def test_record_entries_are_well_formed_and_unique() -> None:
    seen: set[tuple[str, str]] = set()
    for entry in RELEASES:
        assert set(entry) == {"distribution", "version", "commit", "date"}, entry
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]), f"{entry}: commit must be a full hash"
        assert isinstance(entry["date"], datetime.date), entry
        assert str(Version(entry["version"])) == entry["version"], f"{entry}: not a normalized version"
        key = (entry["distribution"], entry["version"])
        assert key not in seen, f"{key} recorded twice"
        seen.add(key)


@pytest.mark.parametrize("entry", RELEASES, ids=lambda e: f"{e['distribution']}-{e['version']}")
def test_recorded_commit_carries_that_version(entry: dict[str, Any]) -> None:
    commit = entry["commit"]
    exists = _git("cat-file", "-e", f"{commit}^{{commit}}")
    assert exists.returncode == 0, (
        f"commit {commit} of {entry['distribution']} {entry['version']} is not in this clone "
        "(a shallow clone? CI checks out with fetch-depth: 0)"
    )
    assert _version_at(commit, entry["distribution"]) == entry["version"]


def test_current_versions_never_go_below_a_release() -> None:
    newest: dict[str, Version] = {}
    for entry in RELEASES:
        version = Version(entry["version"])
        newest[entry["distribution"]] = max(version, newest.get(entry["distribution"], version))
    for dist, released in newest.items():
        if (REPO / "packages" / dist).is_dir():
            assert Version(_current_version(dist)) >= released, f"{dist} is older than its release {released}"


def test_every_jsonl_release_left_golden_logs() -> None:
    """A JSONL release without golden logs would leave its format unguarded (golden/generate.py writes them)."""
    versions = [e["version"] for e in RELEASES if e["distribution"] == "dsh-session-persistence-jsonl"]
    assert versions
    for version in versions:
        assert (GOLDEN / f"v{version}" / "expected.json").is_file(), f"no golden logs for JSONL {version}"


def _changelog_versions(dist: str) -> list[str]:
    """Versions with a heading in packages/<dist>/CHANGELOG.md: `## 0.1.0 (...)` or `## Unreleased (0.2.0)`."""
    text = (REPO / "packages" / dist / "CHANGELOG.md").read_text(encoding="utf-8")
    found = []
    for line in text.splitlines():
        if m := re.fullmatch(r"## (?:Unreleased \((?P<next>[^)]+)\)|(?P<released>\S+) \(.*\))", line):
            found.append(m.group("next") or m.group("released"))
    return found


@pytest.mark.parametrize(
    "dist", sorted(p.name for p in (REPO / "packages").iterdir() if (p / "pyproject.toml").is_file())
)
def test_every_package_has_a_changelog_entry_for_its_version_and_its_releases(dist: str) -> None:
    versions = _changelog_versions(dist)
    assert _current_version(dist) in versions, f"packages/{dist}/CHANGELOG.md has no entry for its current version"
    for entry in RELEASES:
        if entry["distribution"] == dist:
            assert entry["version"] in versions, (
                f"packages/{dist}/CHANGELOG.md has no entry for release {entry['version']}"
            )


def test_a_package_changed_since_its_release_has_a_new_version() -> None:
    """A version names one build: once a package's code or metadata differs from its newest release, its version
    must move past that release (the changelog then says what changed)."""
    newest: dict[str, dict[str, Any]] = {}
    for entry in RELEASES:
        if entry["distribution"] not in newest or Version(entry["version"]) > Version(
            newest[entry["distribution"]]["version"]
        ):
            newest[entry["distribution"]] = entry
    for dist, entry in sorted(newest.items()):
        if not (REPO / "packages" / dist).is_dir():
            continue
        paths = [f"packages/{dist}/src", f"packages/{dist}/pyproject.toml"]
        diff = _git("diff", "--quiet", entry["commit"], "--", *paths)
        assert diff.returncode in (0, 1), diff.stderr
        if diff.returncode == 1:
            assert Version(_current_version(dist)) > Version(entry["version"]), (
                f"packages/{dist} changed since its release {entry['version']} ({entry['commit'][:12]}) "
                "but still says that version: bump it and add a changelog entry"
            )
