"""A throwaway pgbouncer in transaction mode in front of a test cluster (Debian's ``pgbouncer`` package).

Started in the foreground as a child process (as the cluster's unprivileged user when the tests run as root:
pgbouncer refuses root), on a free loopback port, with a small server pool so that clients really share
server connections. Without the binary the tests skip, or fail under ``DSH_REQUIRE_POSTGRES=1``.
``DSH_KEEP_BOUNCER_LOG=1`` keeps its directory (``pgbouncer.log``) for a post-mortem.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ._pgserver import PgCluster, free_port, missing

__all__ = ["Bouncer", "running_bouncer"]

_HINT = "run tools/postgres-setup (installs Debian's postgresql and pgbouncer packages)"


def _find_pgbouncer() -> str:
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )
    if found:
        return found
    missing(f"pgbouncer not found: {_HINT}")


@dataclass
class Bouncer:
    """A running pgbouncer: where clients connect."""

    port: int
    dbname: str
    user: str
    root: Path

    @property
    def dsn(self) -> str:
        return (
            f"host=127.0.0.1 port={self.port} dbname={self.dbname} user={self.user} sslmode=disable connect_timeout=10"
        )


@contextlib.contextmanager
def running_bouncer(cluster: PgCluster, pool_size: int = 2) -> Iterator[Bouncer]:
    """pgbouncer (``pool_mode = transaction``) in front of ``cluster``; stopped and removed afterwards."""
    binary = _find_pgbouncer()
    root = Path(tempfile.mkdtemp(prefix="dsh-pgbouncer-"))
    port = free_port()
    (root / "users.txt").write_text(f'"{cluster.user}" ""\n')
    (root / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{cluster.dbname} = host=127.0.0.1 port={cluster.port} dbname={cluster.dbname} user={cluster.user}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {root / 'users.txt'}\n"
        f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 200\n"
        f"logfile = {root / 'pgbouncer.log'}\n"
    )
    argv = [binary, str(root / "pgbouncer.ini")]
    if cluster.run_as is not None:
        entry = pwd.getpwnam(cluster.run_as)
        for path in (root, *root.iterdir()):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        argv = ["runuser", "-u", cluster.run_as, "--", *argv]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        limit = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None or time.monotonic() > limit:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                log = root / "pgbouncer.log"
                raise RuntimeError(f"pgbouncer did not start: {out}\n{log.read_text() if log.exists() else ''}")
            time.sleep(0.05)
        yield Bouncer(port=port, dbname=cluster.dbname, user=cluster.user, root=root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if not os.environ.get("DSH_KEEP_BOUNCER_LOG"):
            shutil.rmtree(root, ignore_errors=True)
