"""``python -m dsh.session_persistence._cli``: the same as the ``dsh-sessions`` console script."""

from __future__ import annotations

import sys

from ._main import main

sys.exit(main())
