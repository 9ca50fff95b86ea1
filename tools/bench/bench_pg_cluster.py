"""Section 7's plumbing: a throwaway PostgreSQL cluster, the backend over a schema, writes and loads through it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any

from bench_common import WriteRun
from bench_workload import CWD, FLUSH, SESSION_ID, Op, raw_json_bytes, workload
from bench_writes import full_stack_write
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
from dsh.session_persistence.backend import SessionHeader, StorageMetadata

# --------------------------------------------------------------------------------------------------------------
# PostgreSQL backend: the same write workload and loads through PostgresBackend


def postgres_unavailable_reason() -> str | None:
    """``None`` when psycopg and the postgres backend import, else "unavailable: <why>"."""
    try:
        import psycopg  # noqa: F401
        from dsh.session_persistence_postgres import PostgresBackend  # noqa: F401
    except Exception as exc:
        return f"unavailable: {type(exc).__name__}: {exc}"
    return None


def find_pg_bin() -> str | None:
    """The directory holding ``initdb`` and ``pg_ctl``: ``$DSH_PG_BIN``, Debian's newest, or ``PATH``.

    The same search as the postgres package's test helper (``tests/_pgserver.py``), copied: a tool does not import
    test modules.
    """
    explicit = os.environ.get("DSH_PG_BIN")
    candidates = [explicit] if explicit else []
    debian = "/usr/lib/postgresql"
    if os.path.isdir(debian):
        versions = sorted((d for d in os.listdir(debian) if d.isdigit()), key=lambda d: int(d), reverse=True)
        candidates += [os.path.join(debian, v, "bin") for v in versions]
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(os.path.dirname(os.path.realpath(on_path)))
    for candidate in candidates:
        if all(os.path.isfile(os.path.join(candidate, tool)) for tool in ("initdb", "pg_ctl")):
            return candidate
    return None


def open_server(dsn: str | None) -> tuple[str | None, ThrowawayCluster | None, str | None]:
    """The server a postgres figure measures: ``dsn`` (``--postgres-dsn``), else a throwaway cluster started here.

    Returns ``(dsn, cluster, reason)``: ``reason`` ("unavailable: <why>", one line) when there is none (psycopg or the
    backend missing, no server binaries, a cluster that would not start; that cluster is closed again); ``cluster``
    is the one to close afterwards, or ``None`` for a caller's server.
    """
    reason = postgres_unavailable_reason()
    if reason is not None or dsn is not None:
        return dsn, None, reason
    bin_dir = find_pg_bin()
    if bin_dir is None:
        return None, None, "unavailable: no PostgreSQL server binaries (initdb, pg_ctl) and no --postgres-dsn"
    cluster = ThrowawayCluster(bin_dir)
    try:
        cluster.start()
    except Exception as exc:
        cluster.close()
        return None, None, " ".join(f"unavailable: throwaway cluster failed to start: {exc}".split())
    return cluster.dsn, cluster, None


class ThrowawayCluster:
    """A PostgreSQL cluster in a temporary directory (``initdb`` + ``pg_ctl``) on a free loopback port.

    Default durability settings (``fsync=on``, ``synchronous_commit=on``): every commit is a durable WAL flush.
    When the bench runs as root the server runs as ``postgres`` (or ``nobody``): initdb refuses root.
    """

    def __init__(self, bin_dir: str) -> None:
        self.bin_dir = bin_dir
        self.run_as: str | None = None
        if os.geteuid() == 0:
            import pwd

            for name in ("postgres", "nobody"):
                try:
                    pwd.getpwnam(name)
                except KeyError:
                    continue
                self.run_as = name
                break
            else:
                raise RuntimeError("running as root without a 'postgres' or 'nobody' user to run the server as")
        self.root = tempfile.mkdtemp(prefix="dsh-bench-pg-")
        if self.run_as is not None:
            import pwd

            entry = pwd.getpwnam(self.run_as)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            self.port: int = sock.getsockname()[1]
        self.data = os.path.join(self.root, "data")
        self.started = False

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname=dsh_bench user=dsh connect_timeout=10"

    def _run(self, *args: str) -> None:
        argv = list(args) if self.run_as is None else ["runuser", "-u", self.run_as, "--", *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise RuntimeError(f"{os.path.basename(args[0])} failed: {(result.stderr or result.stdout).strip()}")

    def start(self) -> None:
        initdb, pg_ctl = os.path.join(self.bin_dir, "initdb"), os.path.join(self.bin_dir, "pg_ctl")
        # --no-sync only skips initdb's own final sync of the fresh cluster, not the server's commit fsyncs.
        self._run(initdb, "-D", self.data, "-U", "dsh", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root}"
        log = os.path.join(self.root, "server.log")
        self._run(pg_ctl, "-D", self.data, "-o", options, "-l", log, "-w", "-t", "60", "start")
        self.started = True
        import psycopg

        admin = f"host=127.0.0.1 port={self.port} dbname=postgres user=dsh connect_timeout=10"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE dsh_bench")

    def close(self) -> None:
        try:
            if self.started:
                self._run(os.path.join(self.bin_dir, "pg_ctl"), "-D", self.data, "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _postgres(dsn: str, schema: str, *, sealed: bool = False) -> Any:
    """A ``PostgresBackend`` on ``schema``; ``sealed``: every event body sealed with the bench key (AES-256-GCM)."""
    from dsh.session_persistence_postgres import PostgresBackend

    if not sealed:
        return PostgresBackend(dsn, schema=schema)
    from dsh.session_persistence.encryption import StaticKeyProvider

    return PostgresBackend(dsn, schema=schema, encryption=StaticKeyProvider("bench", {"bench": bytes(range(32))}))


def pg_schema_bytes(dsn: str, schema: str) -> int:
    """Size of the schema's tables with their TOAST and indexes (``pg_total_relation_size``; WAL not counted)."""
    import psycopg

    query = (
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'"
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, (schema,)).fetchone()
    return int(row[0]) if row else 0


def pg_drop_schemas(dsn: str, schemas: list[str]) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def pg_server_version(dsn: str) -> str:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "unknown"


async def run_postgres(ops: list[Op], dsn: str, schema: str, *, sealed: bool = False) -> WriteRun:
    """Full stack over ``PostgresBackend`` (one transaction per durable point), then a cold reload."""
    seconds, events = await full_stack_write(ops, _postgres(dsn, schema, sealed=sealed), warm=True)
    reload_s, loaded = await load_full_stack(_postgres(dsn, schema, sealed=sealed), SESSION_ID, warm=True)
    if loaded != events:
        raise AssertionError(f"postgres reload returned {loaded} events, expected {events}")
    return WriteRun(seconds, events, pg_schema_bytes(dsn, schema), reload_s)


async def load_full_stack(backend: Any, session_id: str, *, warm: bool = False) -> tuple[float, int]:
    """``PersistenceCoordinator.load`` on a fresh host over ``backend``: (seconds, events)."""
    host = Host()
    SessionStore(host)
    async with PersistenceCoordinator(host, backend) as coordinator:
        if warm:
            await backend.list()
        start = time.perf_counter()
        view = await coordinator.load(session_id)
        seconds = time.perf_counter() - start
    return seconds, len(view.events)


async def write_pg_session(
    dsn: str, schema: str, session_id: str, target_raw: int, *, sealed: bool = False
) -> tuple[int, int]:
    """A session of ``target_raw`` raw JSON bytes written through ``PostgresBackend.append_batch`` directly.

    The same events as :func:`write_session_file`, one transaction per 50 turns (not per durable point), so a
    10 MB session is built in seconds. Returns (events, raw JSON bytes).
    """
    from dsh.session_persistence.backend import decode_event

    backend = _postgres(dsn, schema, sealed=sealed)
    storage = StorageMetadata(SessionHeader(id=session_id, created_at=1_700_000_000_000, cwd=CWD), 0)
    raw = 0
    events = 0
    turn = 1
    try:
        while raw < target_raw:
            chunk_events = [op for op in workload(50, seed=turn, first_turn=turn) if op is not FLUSH]
            for event in chunk_events:
                event["seq"] += events
                if "sourceEventSeqs" in event:
                    event["sourceEventSeqs"] = [s + events for s in event["sourceEventSeqs"]]
            raw += raw_json_bytes(chunk_events)
            await backend.append_batch(storage, [decode_event(e) for e in chunk_events], events > 0)
            events += len(chunk_events)
            turn += 50
    finally:
        await backend.aclose()
    return events, raw
