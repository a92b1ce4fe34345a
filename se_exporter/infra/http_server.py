"""The one HTTP/1.1 server of every program: the sidecar's and the fleet's endpoints and the IMDS simulator.

h11 parses, asyncio serves, in one thread of its own per server (why not aiohttp's web server:
docs/architecture.md, "The HTTP server"). Every bound (``Bounds``) is counted by ``reason`` when hit; what each
caps and how a scrape keeps its place past the connection cap: docs/http.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from se_exporter.core.errors import ConfigError
from se_exporter.infra.host_os import HOST_OS
from se_exporter.infra.http_connection import Bounds, Connection, Limits, first_bytes, refuse_busy, serve_connection
from se_exporter.infra.http_pages import (
    REASONS,
    Handler,
    HttpRequest,
    Page,
    RawWriter,
    Response,
    html_index,
    metrics,
    pages,
    rejection_counter,
    text,
)
from se_exporter.infra.logs import Throttle
from se_exporter.infra.options import Listen

# The one front door of every program's HTTP: what handlers use (http_pages) and the bounds (http_connection).
__all__ = ["REASONS", "Bounds", "Handler", "HttpRequest", "Page", "RawWriter", "Response", "Server", "bind",
           "html_index", "metrics", "pages", "rejection_counter", "serve", "text"]

log = logging.getLogger("se_exporter")

LISTEN_BACKLOG = 512  # connections the kernel queues during a burst (the kernel may lower it: net.core.somaxconn)
STOP_RECANCEL_EVERY = 0.1  # seconds between two cancellations of a task that has not ended on stop
ACCEPT_FAILURE_LOG_EVERY = 60.0  # seconds between two lines about the same accept() failure


class Server:
    """One listening socket served by an asyncio loop in a daemon thread; ``shutdown`` stops it."""

    def __init__(self, listen: Listen, handler: Handler, bounds: Bounds, on_reject: Callable[[str], None],
                 name: str) -> None:
        self.socket = _listener(listen)
        self.server_address: tuple[Any, ...] = self.socket.getsockname()
        self.server_port: int = self.server_address[1]
        self._handler, self._limits = handler, Limits(bounds, on_reject)
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(_quiet)
        self._tasks: set[asyncio.Task[None]] = set()
        self._refusing: set[asyncio.Task[None]] = set()  # answering 503 (every connection busy answering)
        self._accepted: set[socket.socket] = set()  # every accepted socket not known to be closed
        self._accept_failures = Throttle(ACCEPT_FAILURE_LOG_EVERY)  # out of descriptors: retried 10 times a second
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        accepting = self._loop.create_task(self._accept())
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._stop_tasks(accepting))
            self._loop.run_until_complete(asyncio.sleep(0))  # the aborted transports' last callbacks
            for sock in self._accepted:  # those of tasks cancelled early, of transports still flushing
                sock.close()
            self._loop.close()

    async def _stop_tasks(self, accepting: asyncio.Task[None]) -> None:
        """Cancel every task until each has ended: one cancellation is not always honoured (before Python 3.12,
        ``asyncio.wait_for`` drops it when what it waits for completes in the same step), and a conversation that
        lost it would go on serving a client that keeps its connection busy, with ``shutdown`` waiting for ever.
        Their connections are aborted too, so nothing is left to serve."""
        pending = {accepting, *self._tasks}
        while pending:
            for connection in list(self._limits.connections):
                if connection.transport is not None:
                    connection.transport.abort()
            for task in pending:
                task.cancel()
            _done, pending = await asyncio.wait(pending, timeout=STOP_RECANCEL_EVERY)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(self.socket)
            except OSError as error:  # out of descriptors, a connection reset before accept: go on
                if self._accept_failures.due(type(error).__name__ + str(error.errno), loop.time()):
                    log.warning("HTTP accept failed: %s (logged once a minute while it lasts)", error)
                await asyncio.sleep(0.1)
                continue
            if len(self._accepted) > 4 * self._limits.bounds.connections:
                self._accepted = {known for known in self._accepted if known.fileno() != -1}
            self._accepted.add(sock)
            first = first_bytes(sock)
            connection = self._admit(sock, loop.time())
            if connection is not None:
                connection.received(first)  # a whole head came with the connection: it waits for nothing
                self._spawn(serve_connection(sock, first, connection, self._handler, self._limits))
            elif len(self._refusing) < self._limits.bounds.connections:  # each lingers a second at most
                refusing = self._spawn(refuse_busy(sock, self._limits.bounds))
                self._refusing.add(refusing)
                refusing.add_done_callback(self._refusing.discard)
            else:
                sock.close()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = self._loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _admit(self, sock: socket.socket, now: float) -> Connection | None:
        """A place for a new connection: free, or made by closing the connection that has waited longest for a
        request head (skipping one whose head has come, unread yet); None when every connection is busy."""
        limits = self._limits
        if len(limits.connections) >= limits.bounds.connections:
            limits.reject("connections")
            waiting = sorted((c for c in limits.connections if c.waiting_since is not None),
                             key=lambda c: c.waiting_since or 0.0)
            for candidate in waiting:
                if candidate.head_pending():
                    candidate.waiting_since = None
                    continue
                limits.connections.discard(candidate)
                candidate.evict()
                break
            else:
                return None
        connection = Connection(sock, waiting_since=now)
        limits.connections.add(connection)
        return connection

    def shutdown(self) -> None:
        """Stop serving (open connections are closed) and wait until the thread has ended."""
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()

    def server_close(self) -> None:
        """Close the listening socket (after ``shutdown``)."""
        self.shutdown()
        self.socket.close()


_S = TypeVar("_S")


def bind(listen: Listen, make: Callable[[], _S]) -> _S:
    """``make()``, a server bound to ``listen``; a port that cannot be had is a configuration error (one line naming
    --listen), for every program."""
    try:
        return make()
    except OSError as error:
        raise ConfigError(f"--listen {listen}: cannot listen there ({error.strerror or error})") from None


def serve(listen: Listen, handler: Handler, bounds: Bounds | None = None,
          on_reject: Callable[[str], None] | None = None, name: str = "http") -> Server:
    """Bind exactly where configured ('' = all interfaces; OSError if the port cannot be had) and serve
    ``handler`` in a daemon thread called ``name``."""
    return Server(listen, handler, bounds or Bounds(), on_reject or (lambda reason: None), name)


def _listener(listen: Listen) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in listen.host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        if HOST_OS.reuse_address:  # on Windows it would let a second instance share the port
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        HOST_OS.prepare_listener(sock)  # exclusive address use on Windows; [::] is dual stack
        sock.bind((listen.host, listen.port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Clients hanging up are not news; anything else is logged."""
    error = context.get("exception")
    if isinstance(error, (ConnectionError, TimeoutError)):
        return
    log.error("HTTP server: %s", context.get("message"), exc_info=error)
