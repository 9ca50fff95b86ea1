"""The server fixture's contract when the PostgreSQL binaries are missing: fail under CI, skip elsewhere."""

from __future__ import annotations

import pytest

from . import _pgserver


def test_missing_server_fails_when_required_and_skips_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pgserver, "find_pg_bin", lambda: None)
    monkeypatch.setenv("DSH_REQUIRE_POSTGRES", "1")
    with pytest.raises(
        pytest.fail.Exception, match=r"DSH_REQUIRE_POSTGRES=1 but PostgreSQL server binaries .*tools/postgres-setup"
    ):
        _pgserver.require_pg_bin()
    monkeypatch.delenv("DSH_REQUIRE_POSTGRES")
    with pytest.raises(pytest.skip.Exception, match=r"not found .* run tools/postgres-setup"):
        _pgserver.require_pg_bin()
