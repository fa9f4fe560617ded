"""HTTP serving for the daemons (agent and controller): `/metrics`, `/healthz` and
`/readyz`, read-only.

- `GET /metrics`: the registry in Prometheus text format (or OpenMetrics when the
  scraper asks for it in `Accept`), with the matching content type;
- `GET /healthz`: 200 `ok` while the agent is alive, else 503 with the reason;
- `GET /readyz`: 200 `ok` once the agent is ready (first round done, API reachable
  or writes buffered), else 503 with the reason.

Any other path is 404 and any other method 405. No endpoint changes anything: the
on-demand checks go through Node annotations, where Kubernetes RBAC decides who may
ask. A probe callback that raises answers 503 with the error; it never takes the
server down.

The port is reachable from the pod network, so what connects cannot hold it: a
connection must deliver a request's line and headers within `deadline_s` (15 s) of
opening or of its last answer, else it is closed (an idle keep-alive, a sender that
trickles a byte at a time); at most `max_connections` (64) are open at once, and a
newcomer beyond that closes the oldest one still waiting for its request, so a
flood of idle connections never locks the kubelet's probe out; the listen backlog
is 256. A client that goes away before its answer (a reset, a closed socket) is a
debug line and a count in `healthd_http_clients_gone_total`, never a traceback: the
port is open to anyone on the pod network.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import logging
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import choose_encoder

from healthd.util.exits import port_number

log = logging.getLogger(__name__)

Probe = Callable[[], tuple[bool, str]]
Answer = tuple[int, str, bytes]  # status, content type, body
Route = Callable[[str], Answer]  # the request's Accept header -> the answer
TEXT = "text/plain; charset=utf-8"
REQUEST_DEADLINE_S = 15.0  # from opening (or the last answer) to a request's headers
MAX_CONNECTIONS = 64
BACKLOG = 256


def _metrics_route(registry: CollectorRegistry) -> Route:
    def metrics(accept: str) -> Answer:
        encoder, content_type = choose_encoder(accept)
        try:
            return 200, content_type, encoder(registry)
        except Exception as exc:  # a broken collector must not take the endpoint down
            log.exception("metrics: a collector failed")
            return 500, TEXT, f"cannot collect metrics: {exc}\n".encode()

    return metrics


def _probe_route(name: str, probe: Probe) -> Route:
    def answer(_accept: str) -> Answer:
        try:
            ok, reason = probe()
        except Exception as exc:
            log.exception("%s: the probe failed", name)
            ok, reason = False, f"{name} probe failed: {type(exc).__name__}: {exc}"
        if ok:
            return 200, TEXT, b"ok\n"
        return 503, TEXT, f"{reason or f'not {name}'}\n".encode()

    return answer


def routes(registry: CollectorRegistry, *, healthy: Probe, ready: Probe) -> dict[str, Route]:
    """Path -> what answers it (GET and HEAD only)."""
    return {"/metrics": _metrics_route(registry), "/healthz": _probe_route("healthy", healthy),
            "/readyz": _probe_route("ready", ready)}


class _Connections:
    """The open connections and since when each has been waiting for a request (None
    while one is being answered). Closing one shuts its socket down, which ends the
    blocked read of the thread that serves it."""

    def __init__(self, deadline_s: float, limit: int) -> None:
        self.deadline_s, self.limit = deadline_s, limit
        self._waiting: dict[socket.socket, float | None] = {}
        self._lock = threading.Lock()

    def admit(self, sock: socket.socket) -> bool:
        """Track a new connection; at the limit the oldest waiting one makes room.
        False when every open one is being answered (the newcomer is refused)."""
        with self._lock:
            if len(self._waiting) >= self.limit:
                waiting = [(t, s) for s, t in self._waiting.items() if t is not None]
                if not waiting:
                    return False
                self._close(min(waiting, key=lambda ts: ts[0])[1])
            self._waiting[sock] = time.monotonic()
            return True

    def waiting(self, sock: socket.socket) -> None:
        with self._lock:
            if sock in self._waiting:
                self._waiting[sock] = time.monotonic()

    def busy(self, sock: socket.socket) -> None:
        with self._lock:
            if sock in self._waiting:
                self._waiting[sock] = None

    def forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._waiting.pop(sock, None)

    def expire(self) -> None:
        """Close the connections that waited past the deadline."""
        cutoff = time.monotonic() - self.deadline_s
        with self._lock:
            for sock in [s for s, t in self._waiting.items() if t is not None and t < cutoff]:
                self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        del self._waiting[sock]
        with contextlib.suppress(OSError):  # already gone
            sock.shutdown(socket.SHUT_RDWR)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True  # a scrape in flight must not hold up the daemon's stop
    block_on_close = False
    request_queue_size = BACKLOG

    def __init__(self, address: tuple[str, int], routes: dict[str, Route],
                 token: Any, connections: _Connections, gone: Counter) -> None:
        super().__init__(address, _Handler)
        self.routes = routes
        self.token = token  # the event loop the routes run on
        self.connections = connections
        self.gone = gone

    def process_request(self, request: Any, client_address: Any) -> None:
        if self.connections.admit(request):
            super().process_request(request, client_address)
        else:
            self.shutdown_request(request)

    def service_actions(self) -> None:
        """Between accepts (every poll interval): close connections past the deadline."""
        self.connections.expire()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """What a request's thread raised (the standard library prints a traceback to
        stderr). A peer gone mid-request is the network's doing: counted, logged at
        debug. Anything else is ours: one log record with its traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            self.gone.inc()
            log.debug("HTTP client %s went away: %s", client_address, error)
        else:
            log.exception("HTTP: answering %s failed", client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    """Parses HTTP on the server's thread; the routes run on the daemon's event loop,
    where the state they read lives."""

    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive for scrapers

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.connections.deadline_s)  # no read blocks longer

    def finish(self) -> None:
        self.server.connections.forget(self.connection)
        super().finish()

    def handle_one_request(self) -> None:
        self.server.connections.waiting(self.connection)
        super().handle_one_request()

    def parse_request(self) -> bool:
        """The request line and headers are in: no deadline while it is answered."""
        self.server.connections.busy(self.connection)
        return super().parse_request()

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def _refuse(self) -> None:
        if self._path() in self.server.routes:
            self._send((405, TEXT, b"method not allowed\n"), allow="GET, HEAD")
        else:
            self._send((404, TEXT, b"not found\n"))

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _refuse

    def _path(self) -> str:
        return self.path.split("?", 1)[0]

    def _answer(self, *, with_body: bool) -> None:
        route = self.server.routes.get(self._path())
        if route is None:
            self._send((404, TEXT, b"not found\n"), with_body=with_body)
            return
        try:
            answer = anyio.from_thread.run_sync(route, self.headers.get("Accept", ""),
                                                token=self.server.token)
        except RuntimeError:  # the event loop is gone: the daemon is stopping
            answer = 503, TEXT, b"stopping\n"
        self._send(answer, with_body=with_body)

    def _send(self, answer: Answer, *, with_body: bool = True, allow: str = "") -> None:
        status, content_type, body = answer
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if allow:
            self.send_header("Allow", allow)
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log: scrapes every few seconds would drown the daemon's own


@asynccontextmanager
async def serve_http(
    port: int,
    registry: CollectorRegistry,
    *,
    healthy: Probe,
    ready: Probe,
    host: str = "0.0.0.0",
    deadline_s: float = REQUEST_DEADLINE_S,
    max_connections: int = MAX_CONNECTIONS,
) -> AsyncIterator[int]:
    """Serve the endpoints on host:port while the context is open; yields the bound
    port (port 0 picks a free one). A port that cannot be bound raises OSError with a
    message naming the address.

    The standard library's server on a thread of its own (as prometheus_client's
    own `start_http_server`): it is loaded already for the exposition format, where
    aiohttp's web server would add over 1 MiB to every agent for three read-only
    paths."""
    gone = Counter("healthd_http_clients_gone", "HTTP clients that went away before "
                   "their answer (a reset or closed connection)", registry=None)
    try:
        server = _Server((host, port), routes(registry, healthy=healthy, ready=ready),
                         anyio.lowlevel.current_token(),
                         _Connections(deadline_s, max_connections), gone)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot serve HTTP on {host}:{port}: {exc.strerror}") from exc
    registry.register(gone)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name="http", daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(server.shutdown)
        server.server_close()
        registry.unregister(gone)


def add_http_port_argument(parser: argparse.ArgumentParser) -> None:
    """`--http-port`, where a daemon serves /metrics, /healthz and /readyz."""
    parser.add_argument("--http-port", type=port_number, metavar="N",
                        help="/metrics, /healthz, /readyz")
