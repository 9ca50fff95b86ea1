"""Write the golden logs of the 0.3 resume shapes (``tool/reconcile``, ``turn/continue``) with the work tree's code.

Run from the repository with the workspace env: ``python tests-integration/golden_v03/generate.py``. Each shape is
a storage root per encoding, ``golden_v03/<encoding>/<shape>/sessions/``, produced by real SIGKILLed children
(``continue_child.py``), exactly as a user's crash would leave and a resume would extend it:

- ``continued-twice``: killed inside ``charge`` (reconciled: happened), then inside the continuation's ``notify``
  (reconciled: happened), then continued again to completion: turns 2 and 3 are continuations;
- ``not-happened``: killed inside ``charge``, the ledger entry removed before the resume: the finding is
  ``not-happened`` and the continuation completes;
- ``cannot-tell``: killed inside ``charge``, the check cannot tell: the finding is ``unknown``, the repair's text
  stays, the continuation completes.

``test_release_reads_new_logs.py`` has the recorded 0.2.0 release load and validate every one of them.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from test_continue_crash import child  # noqa: E402

SHAPES = ("continued-twice", "not-happened", "cannot-tell")


def shape(root: Path, name: str, compression: str) -> None:
    assert child(root, "start", "asyncio", compression, kill_in="charge") == -9
    if name == "continued-twice":
        assert child(root, "resume", "asyncio", compression, kill_in="notify") == -9
        assert child(root, "resume", "asyncio", compression) == 0
    elif name == "not-happened":
        (root / "ledger" / "charge-1").unlink()
        assert child(root, "resume", "asyncio", compression) == 0
    else:
        assert child(root, "resume", "asyncio", compression, check="cannot-tell") == 0


def main() -> None:
    for compression in ("none", "zstd"):
        for name in SHAPES:
            with tempfile.TemporaryDirectory() as tmp:
                root = Path(tmp)
                shape(root, name, compression)
                target = HERE / compression / name
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(root / "sessions", target / "sessions", ignore=shutil.ignore_patterns("*.lock"))
                print(f"{compression}/{name}")


if __name__ == "__main__":
    main()
