"""A loopback TCP proxy in front of the test server that can lose replies, black-hole connections and add latency.

Pure Python, one thread per direction per connection. The server-to-client direction is parsed as PostgreSQL
protocol messages (the clients connect with ``sslmode=disable``, so after the startup packet every server
message is a type byte and a length), which is what lets the proxy act on one precise reply:

* :meth:`PgProxy.drop_commit_reply` arms the proxy to lose the next ``CommandComplete("COMMIT")``: everything the
  server sent before it is forwarded, then both sockets are closed. The transaction is committed on the server
  and the client sees a dropped connection: the textbook in-doubt write.
* :meth:`PgProxy.blackhole` stops forwarding on every connection open now (bytes are read and thrown away, the
  sockets stay open), like a peer behind a dead route. New connections are forwarded normally, unless
  ``blackhole_new`` is set (then they are black-holed from the start: a connect hangs).
* ``latency`` (seconds) delays every forwarded chunk in both directions.

``client_turns`` counts the round trips: a chunk from the client after the server last spoke starts a new one
(the client sent, then had to wait for an answer before sending more). ``round_trips`` counts the server's
``ReadyForQuery`` messages (one per primitive: each is one simple-protocol message).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import struct
import threading
import time
from collections.abc import Iterator

__all__ = ["PgProxy", "running_proxy"]


class _Link:
    """One proxied connection: the client socket, the upstream socket, and whether it is black-holed."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.blackholed = False
        self.closed = False
        self.server_spoke = True  # a client chunk after a server chunk starts a new client turn
        # Delay lines: (due time, bytes or None for "close after what is queued") per direction.
        self.to_server: queue.SimpleQueue[tuple[float, bytes | None]] = queue.SimpleQueue()
        self.to_client: queue.SimpleQueue[tuple[float, bytes | None]] = queue.SimpleQueue()

    def close(self) -> None:
        self.closed = True
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class PgProxy:
    """Forwards ``127.0.0.1:<port>`` to the server at ``127.0.0.1:<upstream_port>``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.latency = 0.0
        #: While true, new connections are accepted and closed at once (a server that cannot be reached).
        self.refuse_new = False
        #: While true, new connections are accepted and black-holed from the start (a dead route: connects hang).
        self.blackhole_new = False
        self.round_trips = 0
        self.client_turns = 0
        self.commit_replies_dropped = 0
        self._drop_commits = 0
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._running = True
        self._spawn(self._accept)

    def dsn(self, dbname: str, user: str) -> str:
        """A connection string through the proxy (no TLS/GSS negotiation, so the stream stays parseable)."""
        return (
            f"host=127.0.0.1 port={self.port} dbname={dbname} user={user} sslmode=disable gssencmode=disable "
            "connect_timeout=10"
        )

    # -- faults -------------------------------------------------------------------------------------------

    def drop_commit_reply(self, count: int = 1) -> None:
        """Lose the next ``count`` replies to ``COMMIT`` (each one closes its connection)."""
        with self._lock:
            self._drop_commits += count

    def blackhole(self) -> int:
        """Stop forwarding on every connection open now; return how many were black-holed."""
        with self._lock:
            live = [link for link in self._links if not link.closed]
            for link in live:
                link.blackholed = True
        return len(live)

    def close_all(self) -> None:
        """Close every proxied connection (a network reset)."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()

    # -- plumbing -----------------------------------------------------------------------------------------

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while self._running:
            try:
                client, _addr = self._listener.accept()
            except OSError:
                return
            if self.refuse_new:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, upstream)
            link.blackholed = self.blackhole_new
            with self._lock:
                self._links.append(link)
            self._spawn(self._client_to_server, link)
            self._spawn(self._server_to_client, link)
            self._spawn(self._deliver, link, link.to_server, link.upstream)
            self._spawn(self._deliver, link, link.to_client, link.client)

    def _deliver(self, link: _Link, line: queue.SimpleQueue[tuple[float, bytes | None]], sock: socket.socket) -> None:
        """Send each queued chunk once it is due (a propagation delay: chunks in flight overlap)."""
        while True:
            due, chunk = line.get()
            if chunk is None:
                link.close()
                return
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if link.blackholed or link.closed:
                continue
            try:
                sock.sendall(chunk)
            except OSError:
                link.close()
                return

    def _client_to_server(self, link: _Link) -> None:
        try:
            while chunk := link.client.recv(65536):
                if not link.blackholed:
                    if link.server_spoke:
                        link.server_spoke = False
                        with self._lock:
                            self.client_turns += 1
                    link.to_server.put((time.monotonic() + self.latency, chunk))
        except OSError:
            pass
        if not link.blackholed:
            link.to_server.put((0.0, None))

    def _server_to_client(self, link: _Link) -> None:
        buffer = b""
        try:
            while chunk := link.upstream.recv(65536):
                if link.blackholed:
                    continue
                buffer += chunk
                link.server_spoke = True
                out, buffer, drop = self._scan(buffer)
                if out:
                    link.to_client.put((time.monotonic() + self.latency, out))
                if drop:
                    link.to_client.put((0.0, None))
                    return
        except OSError:
            pass
        if not link.blackholed:
            link.to_client.put((0.0, None))

    def _scan(self, buffer: bytes) -> tuple[bytes, bytes, bool]:
        """Split ``buffer`` into whole messages to forward and a partial rest; stop at a reply to be dropped."""
        pos = 0
        while len(buffer) - pos >= 5:
            kind = buffer[pos : pos + 1]
            (length,) = struct.unpack_from("!I", buffer, pos + 1)
            end = pos + 1 + length
            if end > len(buffer):
                break
            if kind == b"Z":
                with self._lock:
                    self.round_trips += 1
            elif kind == b"C" and buffer[pos + 5 : end].rstrip(b"\0") == b"COMMIT":
                with self._lock:
                    if self._drop_commits > 0:
                        self._drop_commits -= 1
                        self.commit_replies_dropped += 1
                        return buffer[:pos], b"", True
            pos = end
        return buffer[:pos], buffer[pos:], False

    def close(self) -> None:
        self._running = False
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.close_all()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.to_server.put((0.0, None))
            link.to_client.put((0.0, None))
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=1)


@contextlib.contextmanager
def running_proxy(upstream_port: int) -> Iterator[PgProxy]:
    """A proxy in front of ``upstream_port``, closed afterwards."""
    proxy = PgProxy(upstream_port)
    try:
        yield proxy
    finally:
        proxy.close()
