"""The root conftest.py's ``LONGEST`` (the test files handed to the xdist workers first) names real test files.

A renamed or split file would silently lose its place at the front and the gate its balance; no test would fail.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _longest() -> tuple[str, ...]:
    spec = importlib.util.spec_from_file_location("dsh_root_conftest", REPO / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    longest: tuple[str, ...] = module.LONGEST
    return longest


def test_every_longest_entry_is_a_test_file_once() -> None:
    longest = _longest()
    assert longest, "LONGEST is empty"
    assert len(set(longest)) == len(longest), "a file is listed twice"
    for path in longest:
        assert (REPO / path).is_file(), f"{path} (in conftest.py's LONGEST) does not exist"
        assert Path(path).name.startswith("test_"), f"{path} is not a test file"
