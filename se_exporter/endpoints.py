"""The HTTP endpoints: /metrics (gzip when asked), /healthz and /readyz, and the bounded server they run in.

The server binds exactly where configured and serves in daemon threads, one per connection up to a limit; the
sidecar (``se-exporter run``) and the fleet (``se-exporter fleet``) both serve through ``serve``.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import logging
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from se_exporter.options import Listen
from se_exporter.platform_io import PLATFORM

log = logging.getLogger("se_exporter")
TEXT_FORMAT = "text/plain; version=0.0.4"


class Status(Protocol):
    """What /healthz and /readyz report (the poller)."""

    @property
    def healthy(self) -> bool: ...

    @property
    def ready(self) -> bool: ...


def make_http_app(registry: CollectorRegistry, status: Status) -> Callable[..., Iterable[bytes]]:
    """/metrics from prometheus-client, /healthz and /readyz from the poller's state."""
    metrics_app = make_wsgi_app(registry, disable_compression=True)  # compressed below, faster

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") == "HEAD":
            return _head(answer, environ, start_response)
        return answer(environ, start_response)

    def answer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return _metrics(metrics_app, environ, start_response)
        if path == "/healthz":
            return _text(start_response, status.healthy, "poll loop running", "poll loop stalled")
        if path == "/readyz":
            return _text(start_response, status.ready, "valid document read",
                         "no valid document read yet")
        if path == "/":
            page = (b"<html><head><title>se-exporter</title></head><body><h1>se-exporter</h1>"
                    b"<p><a href='/metrics'>/metrics</a> <a href='/healthz'>/healthz</a> "
                    b"<a href='/readyz'>/readyz</a></p></body></html>")
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [page]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found\n"]

    return app


def _head(answer: Callable[..., Iterable[bytes]], environ: dict[str, Any],
          start_response: Callable[..., Any]) -> list[bytes]:
    """HEAD answers as GET does (status, headers, the Content-Length of the body) without the body, on every path:
    prometheus-client's app itself answers HEAD /metrics with 405."""
    status_line: list[tuple[str, list[tuple[str, str]]]] = []
    body = b"".join(answer({**environ, "REQUEST_METHOD": "GET"},
                           lambda status, headers: status_line.append((status, headers))))
    status, headers = status_line[0]
    if not any(name.lower() == "content-length" for name, _ in headers):
        headers = [*headers, ("Content-Length", str(len(body)))]
    start_response(status, headers)
    return []


def gzip_wanted(accept_encoding: str) -> bool:
    """Whether Accept-Encoding asks for gzip: listed with a quality above zero (``gzip;q=0`` means "not gzip",
    RFC 9110 12.5.3; prometheus-client's ``gzip_accepted`` reads only the name)."""
    for item in accept_encoding.split(","):
        name, *parameters = (part.strip() for part in item.split(";"))
        if name.lower() != "gzip":
            continue
        quality = next((value for key, _, value in (p.partition("=") for p in parameters)
                        if key.strip().lower() == "q"), "1")
        try:
            return float(quality) > 0
        except ValueError:
            return False
    return False


def _metrics(metrics_app: Callable[..., Iterable[bytes]], environ: dict[str, Any],
             start_response: Callable[..., Any]) -> Iterable[bytes]:
    # Always the Prometheus text format, as Go's client_golang serves by default: Prometheus asks for
    # OpenMetrics first, and prometheus-client's OpenMetrics writer takes twice as long (38 vs 18 ms with
    # 1,000 events listed) for nothing we use (no exemplars; _created series are off).
    environ = {**environ, "HTTP_ACCEPT": TEXT_FORMAT}
    if not gzip_wanted(environ.get("HTTP_ACCEPT_ENCODING", "")):
        return metrics_app(environ, start_response)
    answer: list[tuple[str, list[tuple[str, str]]]] = []
    body = b"".join(metrics_app(environ, lambda status, headers: answer.append((status, headers))))
    status, headers = answer[0]
    if not status.startswith("200"):
        start_response(status, headers)
        return [body]
    # Level 1, not prometheus-client's 9: metrics text is so repetitive that level 1 is within 8% of the
    # size (20.6 vs 19.1 KB with 1,000 events listed) at a quarter of the CPU (0.6 vs 2.4 ms).
    start_response(status, [*headers, ("Content-Encoding", "gzip")])
    return [gzip.compress(body, compresslevel=1)]


def _text(start_response: Callable[..., Any], ok: bool, good: str, bad: str) -> list[bytes]:
    start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
    return [((good if ok else bad) + "\n").encode()]


# Bounds of the HTTP server. A scraper is a well-behaved client on a private network, but nothing a
# client does may exhaust the process: every connection holds one thread, so their number is capped,
# and a request must arrive whole within REQUEST_DEADLINE (a per-read timeout alone lets a client that
# sends a byte every few seconds hold its thread for ever).
MAX_CONNECTIONS = 32
REQUEST_DEADLINE = 10.0  # seconds to send the request line and headers (Prometheus sends them at once)
WRITE_TIMEOUT = 10.0  # seconds any one write of the answer may block on a client that does not read
SLOT_WAIT = 1.0  # seconds a new connection may wait for a free thread before it is answered 503
LISTEN_BACKLOG = 512  # connections the kernel queues while all threads are busy (the kernel may lower it)
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\n"
         b"Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n")


class _DeadlineReader(io.RawIOBase):
    """The socket as a stream whose reads all end by one deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request did not arrive in time")
        self._sock.settimeout(remaining)
        return self._sock.recv_into(buffer)


class _QuietHandler(WSGIRequestHandler):
    disable_nagle_algorithm = True  # separate header and body writes must not wait for a delayed ACK
    timeout = WRITE_TIMEOUT
    request_deadline = REQUEST_DEADLINE

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, time.monotonic() + self.request_deadline))

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.connection.settimeout(self.timeout)  # the request is in: the answer gets the ordinary timeout
        return parsed

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds are not news."""


class _SleepingServerMixIn:
    """socketserver's accept loop without its polling: it sleeps until a connection or shutdown() arrives.

    socketserver.BaseServer.serve_forever wakes every ``poll_interval`` only to see whether shutdown() was
    called: at 0.05 s that was 20 wake-ups a second and most of the sidecar's idle CPU. Here shutdown()
    writes a byte to a socket pair that the loop waits on beside the listening socket, so the loop has no
    timeout at all and still stops at once.
    """

    socket: socket.socket

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._stop_requested = False
        self._stopped = threading.Event()
        try:
            super().__init__(*args, **kwargs)  # binds: may fail (address in use), and the pair must not leak
        except BaseException:
            self._wake_read.close()
            self._wake_write.close()
            raise

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Handle connections until shutdown(); ``poll_interval`` is ignored (nothing is polled)."""
        self._stopped.clear()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self.socket, selectors.EVENT_READ)
                selector.register(self._wake_read, selectors.EVENT_READ)
                while not self._stop_requested:
                    ready = {key.fileobj for key, _ in selector.select()}
                    if self._stop_requested:
                        break
                    if self.socket in ready:
                        self._handle_request_noblock()  # type: ignore[attr-defined]
        finally:
            with contextlib.suppress(OSError):  # empty the pair, so that the loop could be run again
                while self._wake_read.recv(64):
                    pass
            self._stop_requested = False
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop the loop and wait until it has stopped (as socketserver's: call it while the loop runs)."""
        self._stop_requested = True
        with contextlib.suppress(OSError):
            self._wake_write.send(b"\0")
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()  # type: ignore[misc]
        self._wake_read.close()
        self._wake_write.close()


def serve(listen: Listen, app: Callable[..., Iterable[bytes]], max_connections: int = MAX_CONNECTIONS,
          request_deadline: float = REQUEST_DEADLINE, slot_wait: float = SLOT_WAIT) -> ThreadingWSGIServer:
    """Bind exactly where configured ('' = all interfaces) and serve in a daemon thread, one thread per
    connection up to ``max_connections``; past that a connection waits ``slot_wait`` and is answered 503."""

    class Handler(_QuietHandler):
        pass

    Handler.request_deadline = request_deadline

    class Server(_SleepingServerMixIn, ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
        request_queue_size = LISTEN_BACKLOG
        allow_reuse_address = PLATFORM.reuse_address  # on Windows it would let a second instance share the port
        _slots = threading.BoundedSemaphore(max_connections)
        _refusing = False

        def server_bind(self) -> None:
            PLATFORM.prepare_listener(self.socket)  # exclusive address use on Windows; [::] is dual stack
            super().server_bind()

        def process_request(self, request: Any, client_address: Any) -> None:
            # Only the first connection past the limit waits for a thread: while refusing, the accept loop must not
            # wait slot_wait per queued connection, or a flood of them would delay every answer (a /healthz probe
            # too) by that much each.
            if not self._slots.acquire(timeout=0 if self._refusing else slot_wait):
                self._refuse(request)
                return
            if self._refusing:
                log.info("HTTP connections below the limit of %d again", max_connections)
                self._refusing = False
            try:
                super().process_request(request, client_address)
            except BaseException:
                self._slots.release()
                raise

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self._slots.release()

        def _refuse(self, request: socket.socket) -> None:
            if not self._refusing:  # one line per episode, not per connection
                log.warning("HTTP connection limit of %d reached: answering 503 until a connection ends",
                            max_connections)
                self._refusing = True
            with contextlib.suppress(OSError):
                request.settimeout(0.1)
                request.sendall(_BUSY)
            self.shutdown_request(request)

        def handle_error(self, request: Any, client_address: Any) -> None:
            """A scraper hanging up or too slow is no reason for a traceback; anything else is logged."""
            if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError, TimeoutError)):
                return
            log.exception("HTTP request from %s failed", client_address)

    server = make_server(listen.host, listen.port, app, server_class=Server, handler_class=Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
