"""A throwaway PostgreSQL cluster for the tests: ``initdb`` + ``pg_ctl`` in a temporary directory.

The server listens on a free loopback port (and a Unix socket inside the directory), runs as an unprivileged
user when the tests run as root (initdb refuses root), and is removed afterwards. Without the server binaries
the tests skip, or fail when ``DSH_REQUIRE_POSTGRES=1`` (CI) says the server must be there.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

__all__ = ["PASSWORD_USER", "PgCluster", "find_pg_bin", "free_port", "missing", "require_pg_bin", "running_cluster"]

#: The role that authenticates with a password (scram-sha-256) on every cluster these tests start.
PASSWORD_USER = "dsh_pw"

_SETUP_HINT = "run tools/postgres-setup (installs Debian's postgresql package)"


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", path.parent.name))


def find_pg_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: ``$DSH_PG_BIN``, Debian's newest, or ``PATH``."""
    explicit = os.environ.get("DSH_PG_BIN")
    candidates = [Path(explicit)] if explicit else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for candidate in candidates:
        if (candidate / "initdb").is_file() and (candidate / "pg_ctl").is_file():
            return candidate
    return None


def require_pg_bin() -> Path:
    """:func:`find_pg_bin`, or fail (``DSH_REQUIRE_POSTGRES=1``) / skip with a clear message."""
    found = find_pg_bin()
    if found is not None:
        return found
    missing(
        f"PostgreSQL server binaries (initdb, pg_ctl) not found under /usr/lib/postgresql/*/bin or on PATH: {_SETUP_HINT}"
    )


def missing(message: str) -> NoReturn:
    """A server-side tool is not installed: fail under ``DSH_REQUIRE_POSTGRES=1`` (CI), else skip."""
    if os.environ.get("DSH_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"DSH_REQUIRE_POSTGRES=1 but {message}", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class PgCluster:
    """One throwaway cluster: where it lives, how to reach it, and how to stop and restart it."""

    bin_dir: Path
    root: Path
    port: int
    run_as: str | None  # the unprivileged user the server runs as (when the tests run as root)
    dbname: str = "dsh_test"
    user: str = "dsh"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={self.dbname} user={self.user} connect_timeout=10"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = list(args)
        if self.run_as is not None:
            argv = ["runuser", "-u", self.run_as, "--", *argv]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False
        )
        if check and result.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{' '.join(args)} failed ({result.returncode}): {result.stderr or result.stdout}\n{tail}"
            )
        return result

    def init(self) -> None:
        self._run(
            str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8",
            "--locale=C", "--no-sync",
        )  # fmt: skip
        # One role must prove a password (the wrong-password test); everyone else is trusted.
        hba = self.data / "pg_hba.conf"
        hba.write_text(f"host all {PASSWORD_USER} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
            "-c max_connections=200 -c shared_buffers=32MB"
        )
        self._run(
            str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.root / "server.log"),
            "-w", "-t", "60", "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def is_running(self) -> bool:
        return self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "status", check=False).returncode == 0

    def create_database(self) -> None:
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} dbname=postgres user={self.user}", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{self.dbname}"')


def _unprivileged_user() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root and found neither a 'postgres' nor a 'nobody' user to run the server as")


@contextlib.contextmanager
def running_cluster() -> Iterator[PgCluster]:
    """Start a fresh cluster with a ``dsh_test`` database; stop and delete it afterwards."""
    bin_dir = require_pg_bin()
    run_as = _unprivileged_user()
    root = Path(tempfile.mkdtemp(prefix="dsh-pg-"))
    if run_as is not None:
        entry = pwd.getpwnam(run_as)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    cluster = PgCluster(bin_dir=bin_dir, root=root, port=free_port(), run_as=run_as)
    try:
        cluster.init()
        cluster.start()
        cluster.create_database()
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            if cluster.is_running():
                cluster.stop("fast")
        shutil.rmtree(root, ignore_errors=True)
