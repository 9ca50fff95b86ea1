"""Parent side of the crash tests: spawn ``crash_child.py``, wait for its marker, SIGKILL it, verify the reload.

Used by ``test_crash.py`` and by ``tools/crash-torture``. :func:`kill_child` follows spec/policy.md §3 (readiness by
marker *content*, polled every 10 ms for up to 30 s; SIGKILL with no graceful step). :func:`verify` reloads the
session in a fresh host (store + coordinator + JSONL on the same root) and reports what the kill did.

No child outlives its run: :func:`kill_child` kills and reaps its child on every path, :func:`stop_children` (the
torture tool's interrupt) kills every running one and refuses new ones, and :func:`process_group` runs the torture
tool as a process group of its own that is stopped, crash children included, however the test leaves it (a
failure, pytest-timeout, KeyboardInterrupt).
``sealed=True`` runs both sides on an encrypting backend (keys in ``DSH_CRASH_KEYS``, fixed test keys) and checks
that what the child stored cannot be read without them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from dsh.session_persistence import Host, PersistenceCoordinator, SessionStore
from dsh.session_persistence.backend import (
    SessionDecryptError,
    SessionKeyError,
    SessionPersistenceCorruptionError,
    encode_event,
    event_to_builtins,
)
from dsh.session_persistence.events import (
    AssistantMessage,
    SessionEvent,
    ToolCall,
    ToolCallBlock,
    ToolResult,
    TurnStart,
)
from dsh.session_persistence.invariant import validate_turns
from dsh.session_persistence.loop import AgentLoop
from dsh.session_persistence.repair import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN, has_open_turn
from dsh.session_persistence.testing import ScriptedAdapter, TextResponse

HERE = Path(__file__).resolve().parent
CHILD = HERE / "crash_child.py"
SESSION_ID = "semantic-checkpoint-crash"
POLICY_PLUGIN = "session-checkpoint-policy"
MARKERS = {
    "request": "request-dispatched",
    "tool": "tool-side-effect",
    "between": "between-steps",
    "random": "running",
}
KEYS_ENV = "DSH_CRASH_KEYS"
#: A fixed test key (id ``crash``, 32 bytes 0x5a), never used outside the crash tests.
CRASH_KEYS = "crash:" + base64.b64encode(b"\x5a" * 32).decode()
POLL_S = 0.010
READY_TIMEOUT_S = 30.0
#: How long a stopped torture tool gets to kill and reap its crash children before its whole group is SIGKILLed.
STOP_GRACE_S = 30.0


class ChildError(AssertionError):
    """The child did not reach its kill point (message includes its stderr)."""


# The children kill_child is running now (one per torture thread), so an interrupt can kill them all at once.
_live_lock = threading.Lock()
_live: set[subprocess.Popen[bytes]] = set()
_stopped = False


def stop_children() -> None:
    """SIGKILL every child a :func:`kill_child` call is running, and make every later call refuse to start one.

    For an interrupted torture run: each killed child is reaped by the thread that started it (its ``finally``),
    which then sees it gone and raises :class:`ChildError`.
    """
    global _stopped
    with _live_lock:
        _stopped = True
        for child in _live:
            with contextlib.suppress(ProcessLookupError):
                child.kill()


def _start(argv: list[str], stderr: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with _live_lock:  # started and registered at once: stop_children never misses one
        if _stopped:
            raise ChildError("the run was stopped: no new child")
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        _live.add(child)
        return child


def kill_child(
    mode: str,
    root: Path,
    *,
    policy: bool = True,
    window_ms: int = 200,
    seed: int = 0,
    backend: str = "asyncio",
    kill_delay: float = 0.0,
    compression: str = "none",
    sealed: bool = False,
) -> int:
    """Run the child in ``mode`` on ``root``, SIGKILL it once ready (+ ``kill_delay`` s); return its returncode."""
    root.mkdir(parents=True, exist_ok=True)
    marker = root / "marker"
    marker.write_bytes(b"")  # readiness is the marker's content, never its existence
    expected = MARKERS[mode]
    argv = [sys.executable, str(CHILD), mode, str(root), str(marker), f"--window-ms={window_ms}", f"--seed={seed}"]
    argv.append(f"--backend={backend}")
    argv.append(f"--compression={compression}")
    if sealed:
        argv.append("--sealed")
    if not policy:
        argv.append("--no-policy")
    stderr_path = root / "child.stderr"
    with stderr_path.open("wb") as stderr:
        child = _start(argv, stderr, {**os.environ, KEYS_ENV: CRASH_KEYS})
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            content = marker.read_text() if marker.exists() else ""
            if content == expected:
                break
            if not expected.startswith(content):
                raise ChildError(f"unexpected failpoint {content!r}\n{stderr_path.read_text()}")
            if child.poll() is not None:
                raise ChildError(f"child exited with {child.returncode} before {expected!r}\n{stderr_path.read_text()}")
            if time.monotonic() > deadline:
                raise ChildError(
                    f"child did not reach {expected!r} within {READY_TIMEOUT_S}s\n{stderr_path.read_text()}"
                )
            time.sleep(POLL_S)
        if kill_delay:
            time.sleep(kill_delay)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        with _live_lock:
            _live.discard(child)
        if child.poll() is None:
            child.kill()
        child.wait()  # reaped on every path: SIGKILL cannot be ignored, so this returns
    if child.returncode != -signal.SIGKILL:
        raise ChildError(f"child exited with {child.returncode}, expected SIGKILL\n{stderr_path.read_text()}")
    return child.returncode


@dataclass
class Verdict:
    """What a reload after a kill found."""

    stored: int = 0  #: events durable on disk before repair
    events: list[SessionEvent] = field(default_factory=list)  #: the repaired (balanced) log
    closers: list[SessionEvent] = field(default_factory=list)  #: what repair appended
    acked: int = 0  #: the highest acknowledged event count
    lost: list[str] = field(default_factory=list)  #: acknowledged or side-effected facts missing from disk
    damaged: str | None = None  #: the log was refused as corrupt (SessionPersistenceCorruptionError)
    compression: str = "none"
    sealed: bool = False
    unbalanced: list[str] = field(default_factory=list)  #: structural problems of the repaired log
    not_started: int = 0
    outcome_unknown: int = 0
    resumed_turn: int | None = None

    @property
    def clean(self) -> bool:
        """No repair was needed (the kill landed between turns)."""
        return not self.closers

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def tool_results(self) -> list[dict[str, Any]]:
        return [event_to_builtins(e)["data"] for e in self.events if type(e) is ToolResult]


def _read_acks(root: Path) -> list[tuple[int, str]]:
    path = root / "acks"
    if not path.exists():
        return []
    acks = []
    for line in path.read_text().split("\n")[:-1]:  # only complete lines
        count, event_type = line.split(" ", 1)
        acks.append((int(count), event_type))
    return acks


def _read_acked_events(root: Path) -> list[bytes]:
    """The wire JSON of every acknowledged event, in seq order (complete lines only)."""
    path = root / "acked.jsonl"
    if not path.exists():
        return []
    return path.read_bytes().split(b"\n")[:-1]


def _check_acked_bytes(stored: list[SessionEvent], acked: list[bytes], lost: list[str]) -> None:
    """Every acknowledged event is on disk byte for byte (its wire JSON), not just its count and type."""
    if len(acked) > len(stored):
        lost.append(f"acknowledged {len(acked)} events (wire), only {len(stored)} durable")
    for index, (event, wire) in enumerate(zip(stored, acked, strict=False)):
        if encode_event(event) != wire:
            lost.append(f"acknowledged event {index} differs on disk: {wire[:120]!r}")
            return


def _check_balance(events: list[SessionEvent], problems: list[str]) -> None:
    for index, event in enumerate(events):
        if event.seq != index:
            problems.append(f"seq {event.seq} at index {index}")
            return
    try:
        validate_turns(events)
    except ValueError as exc:
        problems.append(f"turn invariant: {exc}")
    if has_open_turn(events):
        problems.append("open turn after load")
    requested: dict[str, int] = {}
    answered: set[str] = set()
    for event in events:
        if type(event) is AssistantMessage:
            for block in event.data.message.content:
                if type(block) is ToolCallBlock:
                    requested[block.id] = event.seq
        elif type(event) is ToolResult:
            call_id = getattr(event.data.message.source, "call_id", None)
            if call_id is not None:
                answered.add(call_id)
    for call_id in requested.keys() - answered:
        problems.append(f"tool call {call_id!r} has no result")


async def _readable_without_keys(backend_cls: Any, root: Path, compression: str) -> bool:
    """Whether a backend without keys reads the stored events (it must not, for a sealed log with events)."""
    try:
        stored = await backend_cls(root / "sessions", compression=compression).load_stored(SESSION_ID)
    except SessionKeyError:
        return False
    return stored is not None and bool(stored.events)


async def verify(
    root: Path, *, resume: bool = True, check_effects: bool = True, compression: str = "none", sealed: bool = False
) -> Verdict:
    """Reload ``root`` in a fresh host and check the invariants (see the module docstring)."""
    verdict = Verdict(compression=compression, sealed=sealed)
    host = Host()
    host.load_entrypoints()
    store = SessionStore(host)
    backend_cls: Any = host.dsh_session_backends()["jsonl"]
    keys = backend_cls.key_options("env", KEYS_ENV) if sealed else {}
    backend = backend_cls(root / "sessions", compression=compression, **keys)
    if sealed and await _readable_without_keys(backend_cls, root, compression):
        verdict.lost.append("the sealed child's log reads without its keys: it was stored in plaintext")
    async with PersistenceCoordinator(host, backend) as coordinator:
        try:
            stored = await backend.load_stored(SESSION_ID)
        except (SessionPersistenceCorruptionError, SessionDecryptError, SessionKeyError) as exc:
            verdict.damaged = str(exc)
            return verdict
        stored_events = [] if stored is None else list(stored.events)
        _check_acked_bytes(stored_events, _read_acked_events(root), verdict.lost)
        verdict.stored = len(stored_events)
        acks = _read_acks(root)
        if acks:
            count, event_type = max(acks)
            verdict.acked = count
            if count > len(stored_events):
                verdict.lost.append(f"acknowledged {count} events, only {len(stored_events)} durable")
            elif stored_events[count - 1].type != event_type:
                verdict.lost.append(f"acknowledged event {count - 1} was {event_type}, disk has another")
        if stored is None:
            if check_effects:
                for path in sorted((root / "effects").glob("*")):
                    verdict.lost.append(f"side effect of {path.name} without any durable log")
            return verdict
        view = await coordinator.load(SESSION_ID)
        verdict.events = list(view.events)
        verdict.closers = verdict.events[len(stored_events) :]
        _check_balance(verdict.events, verdict.unbalanced)
        for closer in verdict.closers:
            if type(closer) is ToolResult:
                code = getattr(closer.data.error, "code", None)
                verdict.not_started += code == TOOL_NOT_STARTED
                verdict.outcome_unknown += code == TOOL_OUTCOME_UNKNOWN
        calls = {e.data.call_id for e in verdict.events if type(e) is ToolCall}
        not_started = {
            closer.data.message.source.call_id  # type: ignore[union-attr]
            for closer in verdict.closers
            if type(closer) is ToolResult and getattr(closer.data.error, "code", None) == TOOL_NOT_STARTED
        }
        if check_effects:
            for path in sorted((root / "effects").glob("*")):
                if path.name not in calls:
                    verdict.lost.append(f"side effect of {path.name} without a durable tool/call")
                if path.name in not_started:
                    verdict.lost.append(f"side effect of {path.name} repaired as TOOL_NOT_STARTED")
        if resume:
            last_turn = max((e.data.turn for e in verdict.events if type(e) is TurnStart), default=0)
            adapter = ScriptedAdapter([TextResponse("resumed fine")])
            loop = await AgentLoop.resume(
                host, store, coordinator, SESSION_ID, adapter, provider="crash", model="crash"
            )
            start = len(verdict.events)
            await loop.run_turn("after the crash")
            events = loop.session.events
            if [e.seq for e in events] != list(range(len(events))):
                verdict.unbalanced.append("resumed log is not contiguous")
            tail = [e.type for e in events[start : start + 2]]
            if tail != ["session/end-seed", "turn/start"]:
                verdict.unbalanced.append(f"resume started with {tail}")
            else:
                verdict.resumed_turn = events[start + 1].data.turn  # type: ignore[union-attr]
                if verdict.resumed_turn != last_turn + 1:
                    verdict.unbalanced.append(f"resumed turn {verdict.resumed_turn}, expected {last_turn + 1}")
            await store.flush(loop.session)
            durable = await backend.load_stored(SESSION_ID)
            if durable is None or len(durable.events) != len(events):
                verdict.unbalanced.append("resumed turn not durable after flush")
            loop.close()
            store.dispose(loop.session)
    return verdict


def verify_sync(root: Path, **kw: Any) -> Verdict:
    if kw.get("sealed"):
        os.environ.setdefault(KEYS_ENV, CRASH_KEYS)  # the verifying side reads the same keys as the child
    return anyio.run(lambda: verify(root, **kw))


def torture_once(root: Path, seed: int, *, sealed: bool = False) -> Verdict:
    """One random kill: window, event loop and delay derived from ``seed``, the encoding alternating with it
    (``sealed``: on an encrypting backend); then :func:`verify`."""
    rng = random.Random(seed)
    window = rng.choice([1, 5, 20, 200, 2000])
    backend = rng.choice(["asyncio", "trio"])
    compression = ("zstd", "none")[seed % 2]
    kill_child(
        "random",
        root,
        window_ms=window,
        seed=seed,
        backend=backend,
        kill_delay=rng.random() * 0.25,
        compression=compression,
        sealed=sealed,
    )
    return verify_sync(root, compression=compression, sealed=sealed)


def _exited(pid: int) -> bool:
    """Whether ``pid`` (a child of this process) has exited, without reaping it (so its pid, which is also its
    process group's id, cannot be reused meanwhile)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


@contextlib.contextmanager
def process_group(argv: list[str], stdout: Path, stderr: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` (the torture tool) as the leader of a process group of its own, output to the two files, and
    stop the whole group however the block is left (a failure, pytest-timeout, KeyboardInterrupt).

    The crash children the tool starts stay in its group. Stopping: SIGTERM, on which the tool kills and reaps its
    children (:func:`stop_children`) and exits; after at most :data:`STOP_GRACE_S` SIGKILL to the whole group, so
    a hung tool or an orphan dies too; then the tool is reaped. The group is signalled only while the tool is
    unreaped, so its id still names it.
    """
    with stdout.open("wb") as out, stderr.open("wb") as err:
        tool = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
    try:
        yield tool
    finally:
        if tool.returncode is None:
            if not _exited(tool.pid):
                os.kill(tool.pid, signal.SIGTERM)  # not send_signal: its poll() could reap the tool, freeing the id
                deadline = time.monotonic() + STOP_GRACE_S
                while not _exited(tool.pid) and time.monotonic() < deadline:
                    time.sleep(POLL_S)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(tool.pid, signal.SIGKILL)
            tool.wait()


def dump(verdict: Verdict) -> str:
    return json.dumps(
        {
            "compression": verdict.compression,
            "sealed": verdict.sealed,
            "types": verdict.types(),
            "lost": verdict.lost,
            "unbalanced": verdict.unbalanced,
            "damaged": verdict.damaged,
        },
        indent=1,
    )


__all__ = [
    "ChildError",
    "Verdict",
    "dump",
    "kill_child",
    "process_group",
    "stop_children",
    "torture_once",
    "verify",
    "verify_sync",
]

if os.name == "nt":  # pragma: no cover
    raise ImportError("crash tests need POSIX signals")
