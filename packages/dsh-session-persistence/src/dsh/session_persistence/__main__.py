"""``python -m dsh.session_persistence``: the ``dsh-sessions`` command line, for when only the interpreter is at
hand (a venv that is not activated, a tool that starts ``sys.executable``)."""

from __future__ import annotations

import sys

from ._cli._main import main  # the function itself: ``_cli/__init__`` only re-exports it for the console script

if __name__ == "__main__":  # importing the module (an API walk, a docs tool) runs nothing
    sys.exit(main())
