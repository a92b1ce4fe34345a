"""The one HTTP/1.1 server of every program: the sidecar's and the fleet's endpoints and the IMDS simulator.

h11 (a dependency of httpx) parses, asyncio serves, in one thread of its own per server. Chosen over aiohttp's web
server for three reasons, each checked: h11's ``max_incomplete_event_size`` caps the *whole* request head and
answers 431 as soon as that many bytes are buffered, where aiohttp's parser caps a line (8,190 bytes) and a count
(128 headers), so about 1 MiB of head is read and held before a 400; the simulator's fault injection needs raw
bytes on the socket (truncated, dripped, mis-chunked answers), which a bare transport gives and a framework hides;
and importing it costs a small fraction of aiohttp.web's memory, while an idle loop with no timers sleeps in the
kernel without a single wake-up (aiohttp's keep-alive handling arms timers). Figures: docs/performance.md.

Bounds (``Bounds``; the README's "HTTP endpoints" lists them), each counted by ``reason`` when hit:

* ``header_bytes``: a request head (request line and headers) of more than 16 KiB is answered 431 once that much
  is buffered; the rest is never read into memory.
* ``deadline``: a head must arrive whole within 5 s of the connection (or, on a kept-alive connection, of its first
  byte), a body within 5 s of its head: a client that drips bytes holds a connection 5 s at most (408).
* ``body_bytes``: a body of more than 64 KiB is answered 413 without being read (a chunked one as soon as its
  declared chunk sizes pass the cap).
* ``connections``: at most 256 connections. A new one past that closes the connection that has waited longest
  without a complete request head (idle kept-alive ones included): a flood of slow or silent clients churns among
  itself while a scrape, whose head comes at once, is read and answered. Only when every connection is busy
  answering is the newcomer answered 503.
* ``malformed``: a request h11 cannot parse is answered 400.
* ``write_deadline``: a client that does not read its answer for 10 s is disconnected.

A kept-alive connection idle for 60 s is closed (not counted: that is ordinary). Connections are accepted one per
loop turn and what came with one is read at once; a connection whose head has come (read, or still unread in the
kernel: peeked) no longer counts as waiting, so it is never the one closed to make room.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, TypeVar

import h11
from prometheus_client import CollectorRegistry, Counter

from se_exporter.core.errors import ConfigError
from se_exporter.infra.logs import Throttle
from se_exporter.infra.options import Listen
from se_exporter.infra.platform_io import PLATFORM

log = logging.getLogger("se_exporter")

REASONS = ("header_bytes", "deadline", "body_bytes", "connections", "malformed", "write_deadline")
LISTEN_BACKLOG = 512  # connections the kernel queues during a burst (the kernel may lower it: net.core.somaxconn)
READ_CHUNK = 8192  # bytes read at a time: what one connection buffers stays near 40 KiB (16 KiB head cap included)
LINGER_SECONDS = 1.0  # after an error answer, how long unread request bytes are drained so the client can read it
LINGER_BYTES = 256 * 1024
ACCEPT_FAILURE_LOG_EVERY = 60.0  # seconds between two lines about the same accept() failure


@dataclass(frozen=True)
class Bounds:
    """What one client may take; the defaults are the README's."""

    head_bytes: int = 16 * 1024
    head_timeout: float = 5.0
    body_bytes: int = 64 * 1024
    body_timeout: float = 5.0
    connections: int = 256
    idle_timeout: float = 60.0
    write_timeout: float = 10.0


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...] = ()  # names in lower case, values as sent (latin-1)
    body: bytes = b""
    raw: RawWriter | None = None  # None when called in-process (tests, benchmarks)

    def header(self, name: str, default: str = "") -> str:
        """The last value of the header ``name`` (lower case)."""
        found = default
        for key, value in self.headers:
            if key == name:
                found = value
        return found


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str | None = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False  # close the connection after this answer


# A handler's answer: a Response, or None when it wrote its answer itself (``HttpRequest.raw``) or wants the
# connection closed without one; either way the connection is then closed.
Handler = Callable[[HttpRequest], Awaitable["Response | None"]]
Page = Callable[[HttpRequest], Response]


class RawWriter:
    """Bytes on the socket as they are, bypassing HTTP framing (the simulator's byte-level faults)."""

    def __init__(self, writer: asyncio.StreamWriter, timeout: float) -> None:
        self._writer, self._timeout = writer, timeout

    async def write(self, data: bytes) -> bool:
        """False once the client has gone or has not read for the write timeout."""
        try:
            self._writer.write(data)
            await asyncio.wait_for(self._writer.drain(), self._timeout)
        except (OSError, asyncio.TimeoutError):
            return False
        return True


# ---------------------------------------------------------------------------------------------- pages


def pages(routes: Mapping[str, Page]) -> Handler:
    """A handler serving ``routes`` to GET and HEAD (405 with Allow otherwise), 404 elsewhere."""

    async def handle(request: HttpRequest) -> Response:
        page = routes.get(request.path)
        if page is None:
            return Response(404, b"not found\n")
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", headers=(("Allow", "GET, HEAD"),))
        return page(request)

    return handle


def text(ok: bool, good: str, bad: str) -> Response:
    """200 and ``good``, or 503 and ``bad``: /healthz and /readyz."""
    return Response(200 if ok else 503, ((good if ok else bad) + "\n").encode())


def html_index(title: str) -> Response:
    return Response(200, (f"<html><head><title>{title}</title></head><body><h1>{title}</h1>"
                          "<p><a href='/metrics'>/metrics</a> <a href='/healthz'>/healthz</a> "
                          "<a href='/readyz'>/readyz</a></p></body></html>").encode(),
                    "text/html; charset=utf-8")


METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics(request: HttpRequest, body: bytes) -> Response:
    """The Prometheus text ``body``, gzipped when the request asks for gzip with a quality above zero.

    Level 1, not prometheus-client's 9: metrics text is so repetitive that level 1 is nearly as small at a
    fraction of the CPU (figures: docs/performance.md, "Scrape")."""
    if gzip_wanted(request.header("accept-encoding")):
        return Response(200, gzip.compress(body, compresslevel=1), METRICS_TYPE, (("Content-Encoding", "gzip"),))
    return Response(200, body, METRICS_TYPE)


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


def rejection_counter(registry: CollectorRegistry, namespace: str) -> Callable[[str], None]:
    """``<namespace>_http_rejected_total{reason}``, every reason shown from the start; returns its ``inc``."""
    counter = Counter(f"{namespace}_http_rejected", "HTTP requests or connections refused by a bound, by reason.",
                      ["reason"], registry=registry)
    for reason in REASONS:
        counter.labels(reason)
    return lambda reason: counter.labels(reason).inc()


# ---------------------------------------------------------------------------------------------- the server


class _Evicted(Exception):
    """This connection was closed to admit another."""


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    waiting_since: float | None  # loop time since which it waits for a request head; None once one has come
    transport: asyncio.WriteTransport | None = None
    evicted: bool = False
    _tail: bytes = b""

    def received(self, data: bytes) -> None:
        """Bytes arrived: a head's end among them means it waits no longer (parsed a moment later), so that
        it is never the one evicted meanwhile."""
        if self.waiting_since is not None and (_END in data or _END in self._tail + data[:3]):
            self.waiting_since = None
        self._tail = (self._tail + data[-3:])[-3:]

    def head_pending(self) -> bool:
        """Whether the end of a head already waits in the kernel, unread (peeked)."""
        try:
            return _END in self._tail + self.sock.recv(READ_CHUNK, socket.MSG_PEEK)
        except OSError:
            return False

    def evict(self) -> None:
        self.evicted = True
        if self.transport is not None:
            self.transport.abort()
        else:
            self.sock.close()


_END = b"\r\n\r\n"


@dataclass
class _Limits:
    bounds: Bounds
    reject: Callable[[str], None]
    connections: set[_Connection] = field(default_factory=set)


class Server:
    """One listening socket served by an asyncio loop in a daemon thread; ``shutdown`` stops it."""

    def __init__(self, listen: Listen, handler: Handler, bounds: Bounds, on_reject: Callable[[str], None],
                 name: str) -> None:
        self.socket = _listener(listen)
        self.server_address: tuple[Any, ...] = self.socket.getsockname()
        self.server_port: int = self.server_address[1]
        self._handler, self._limits = handler, _Limits(bounds, on_reject)
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(_quiet)
        self._tasks: set[asyncio.Task[None]] = set()
        self._refusing: set[socket.socket] = set()  # connections answered 503 (every connection busy answering)
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
            accepting.cancel()
            for task in list(self._tasks):
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(accepting, *self._tasks, return_exceptions=True))
            self._loop.run_until_complete(asyncio.sleep(0))  # the aborted transports' last callbacks
            for sock in self._accepted:  # those of tasks cancelled early, of transports still flushing
                sock.close()
            self._loop.close()

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
            first = _first_bytes(sock)
            connection = self._admit(sock, loop.time())
            if connection is not None:
                connection.received(first)  # a whole head came with the connection: it waits for nothing
                self._spawn(_serve(sock, first, connection, self._handler, self._limits))
            elif len(self._refusing) < self._limits.bounds.connections:  # each lingers a second at most
                self._refusing.add(sock)
                self._spawn(self._refuse_busy(sock))
            else:
                sock.close()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _admit(self, sock: socket.socket, now: float) -> _Connection | None:
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
        connection = _Connection(sock, waiting_since=now)
        limits.connections.add(connection)
        return connection

    async def _refuse_busy(self, sock: socket.socket) -> None:
        try:
            reader, writer = await _streams(sock)
        except OSError:
            sock.close()
            self._refusing.discard(sock)
            return
        try:
            await _refuse(reader, writer, _Refused(503, "connections", "every connection is busy answering"),
                          self._limits.bounds, (("Retry-After", "1"),))
            await _close(writer, self._limits.bounds.write_timeout)
        finally:
            writer.transport.abort()
            self._refusing.discard(sock)

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
        if PLATFORM.reuse_address:  # on Windows it would let a second instance share the port
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        PLATFORM.prepare_listener(sock)  # exclusive address use on Windows; [::] is dual stack
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


class _Refused(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


class _Protocol(asyncio.StreamReaderProtocol):
    def __init__(self, reader: asyncio.StreamReader, connection: _Connection | None) -> None:
        super().__init__(reader)
        self._connection = connection

    def data_received(self, data: bytes) -> None:
        if self._connection is not None:
            self._connection.received(data)
        super().data_received(data)


async def _streams(sock: socket.socket, connection: _Connection | None = None,
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An accepted socket as asyncio streams; the reader pauses the socket past 16 KiB unread."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_CHUNK)
    protocol = _Protocol(reader, connection)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock)
    if hasattr(transport, "max_size"):
        # asyncio's selector transport reads up to 256 KiB per recv() before the reader can pause it: with many
        # clients sending huge heads at once that was 8 MB for 32 of them. READ_CHUNK bounds each read.
        transport.max_size = READ_CHUNK
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


def _first_bytes(sock: socket.socket) -> bytes:
    """What the client sent before its connection was accepted (a scrape's whole request, usually): read at once,
    so that a head already here counts as complete before the next accept may need to evict a connection."""
    sock.setblocking(False)
    try:
        return sock.recv(READ_CHUNK)
    except OSError:  # nothing yet (BlockingIOError), or reset: the conversation will see
        return b""


async def _serve(sock: socket.socket, first: bytes, connection: _Connection, handler: Handler,
                 limits: _Limits) -> None:
    bounds = limits.bounds
    try:
        reader, writer = await _streams(sock, connection)
    except OSError:
        limits.connections.discard(connection)
        sock.close()
        return
    transport = writer.transport
    connection.transport = transport
    if connection.evicted:
        transport.abort()
    try:
        try:
            await _converse(reader, writer, first, connection, handler, limits)
        except _Refused as refused:
            limits.reject(refused.reason)
            await _refuse(reader, writer, refused, bounds)
        except (_Evicted, ConnectionError, asyncio.IncompleteReadError):
            connection.evicted = True  # nothing more to send: close at once
        except Exception:
            log.exception("HTTP request failed")
        finally:
            limits.connections.discard(connection)
        await _close(writer, 0.0 if connection.evicted else bounds.write_timeout)
    except BaseException:  # cancelled: the server is stopping
        transport.abort()
        raise


async def _close(writer: asyncio.StreamWriter, flush_timeout: float) -> None:
    """Close after what is still buffered has gone out, or at once when the client does not take it in time."""
    try:
        if flush_timeout > 0:
            writer.close()
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), flush_timeout)
    finally:
        writer.transport.abort()  # no-op once closed


async def _converse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: bytes,
                    connection: _Connection, handler: Handler, limits: _Limits) -> None:
    """Requests of one connection, one after the other, until either side closes it."""
    loop, bounds = asyncio.get_running_loop(), limits.bounds
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=bounds.head_bytes)
    if first:  # (no bytes would tell h11 that the client has closed)
        conn.receive_data(first)
    idle_until = loop.time() + bounds.head_timeout  # the first head: from the connection
    deadline: float | None = idle_until
    while True:
        buffered = len(conn.trailing_data[0])
        try:
            event, fed = await _next_event(conn, reader, connection, deadline, idle_until, bounds.head_timeout)
        except (h11.RemoteProtocolError, ValueError) as error:
            raise _unparsable(error, reader) from None
        except _Timeout as timeout:
            if timeout.idle:
                return
            raise _Refused(408, "deadline", "request head not complete in time") from None
        if isinstance(event, h11.ConnectionClosed):
            return
        assert isinstance(event, h11.Request)  # the only event h11 gives a server before a body
        if buffered + fed - len(conn.trailing_data[0]) > bounds.head_bytes:  # complete, but in a read past the cap
            raise _Refused(431, "header_bytes", "request head too large")
        connection.waiting_since = None
        body = await _body(conn, reader, event, bounds, loop.time() + bounds.body_timeout, writer)
        target = event.target.decode("latin-1")
        path, _, query = target.partition("?")
        method = event.method.decode("latin-1")
        request = HttpRequest(method, path, query,
                          tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers),
                          body, RawWriter(writer, bounds.write_timeout))
        response = _no_resource(method, target) or await handler(request)
        if response is None or connection.evicted:
            return
        await _answer(conn, writer, response, method == "HEAD", bounds.write_timeout, limits)
        if response.close or conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
            return
        conn.start_next_cycle()
        connection.waiting_since = loop.time()
        deadline, idle_until = None, loop.time() + bounds.idle_timeout


class _Timeout(Exception):
    def __init__(self, idle: bool) -> None:
        super().__init__()
        self.idle = idle


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader, connection: _Connection,
                      deadline: float | None, idle_until: float, head_timeout: float) -> tuple[Any, int]:
    """The next h11 event and the bytes read for it: nothing arriving by ``idle_until`` is an idle close, a head
    not complete by ``deadline`` (set on its first byte when None) a refusal."""
    loop, fed = asyncio.get_running_loop(), 0
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event, fed
        until = deadline if deadline is not None else idle_until
        try:
            data = await asyncio.wait_for(reader.read(READ_CHUNK), max(0.0, until - loop.time()))
        except asyncio.TimeoutError:
            raise _Timeout(idle=deadline is None) from None
        if connection.evicted:
            raise _Evicted
        if data and deadline is None:
            deadline = loop.time() + head_timeout
        fed += len(data)
        conn.receive_data(data)


async def _body(conn: h11.Connection, reader: asyncio.StreamReader, request: h11.Request, bounds: Bounds,
                deadline: float, writer: asyncio.StreamWriter) -> bytes:
    """The request's body, whole, within the bounds; a declared size over the cap is refused before reading."""
    declared = next((value for name, value in request.headers if name == b"content-length"), None)
    if declared is not None and (len(declared) > 12 or int(declared) > bounds.body_bytes):
        raise _Refused(413, "body_bytes", "request body too large")
    if conn.they_are_waiting_for_100_continue:
        writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
    loop, parts, size = asyncio.get_running_loop(), [], 0
    while True:
        try:
            event = conn.next_event()
        except (h11.RemoteProtocolError, ValueError) as error:  # a bad chunk size line, a body cut short
            raise _unparsable(error, reader) from None
        if event is h11.NEED_DATA:
            if size + _chunk_left(conn) > bounds.body_bytes:  # a chunk declared past the cap: refused, not awaited
                raise _Refused(413, "body_bytes", "request body too large")
            try:
                data = await asyncio.wait_for(reader.read(READ_CHUNK), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise _Refused(408, "deadline", "request body not complete in time") from None
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Data):
            size += len(event.data)
            if size > bounds.body_bytes:
                raise _Refused(413, "body_bytes", "request body too large")
            parts.append(bytes(event.data))
            continue
        if isinstance(event, h11.EndOfMessage):
            return b"".join(parts)
        raise _Refused(400, "malformed", "unexpected end of the request")


def _unparsable(error: h11.RemoteProtocolError | ValueError, reader: asyncio.StreamReader) -> Exception:
    """What a request h11 cannot parse (head or body) comes to: a quiet close when the client went away mid-request
    (nobody to answer), 431 for a head over the cap, else 400."""
    if reader.at_eof():
        return ConnectionAbortedError("the client went away mid-request")
    if isinstance(error, h11.RemoteProtocolError) and error.error_status_hint == 431:
        return _Refused(431, "header_bytes", "request head too large")
    return _Refused(400, "malformed", str(error)[:200])


def _no_resource(method: str, target: str) -> Response | None:
    """405 (allowing nothing) for CONNECT host:port and OPTIONS *, a proxy's and the server-wide form: no resource
    of ours answers them (RFC 9110), where a handler would have taken the target for a path and answered 404."""
    if method == "CONNECT" or target == "*":
        return Response(405, b"method not allowed\n", headers=(("Allow", ""),))
    return None


def _chunk_left(conn: h11.Connection) -> int:
    """Bytes the chunk being read still declares (0 outside a chunked body): h11 knows them once it has read the
    chunk's size line, but exposes them on no public attribute; without it (another h11), the sizes read count."""
    left = getattr(getattr(conn, "_reader", None), "_bytes_in_chunk", 0)
    return left if type(left) is int else 0


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


async def _answer(conn: h11.Connection, writer: asyncio.StreamWriter, response: Response, head_only: bool,
                  timeout: float, limits: _Limits) -> None:
    headers = [(name, value) for name, value in (("Content-Type", response.content_type),) if value is not None]
    headers += [("Content-Length", str(len(response.body))), *response.headers]
    if response.close:
        headers.append(("Connection", "close"))
    data = conn.send(h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status)))
    writer.write(data or b"")
    if not head_only and response.body:
        writer.write(conn.send(h11.Data(data=response.body)) or b"")
    writer.write(conn.send(h11.EndOfMessage()) or b"")
    try:
        await asyncio.wait_for(writer.drain(), timeout)
    except asyncio.TimeoutError:
        limits.reject("write_deadline")
        raise ConnectionAbortedError("the client did not read its answer") from None


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, refused: _Refused,
                  bounds: Bounds, headers: tuple[tuple[str, str], ...] = ()) -> None:
    """Answer ``refused`` and close; what the client still sends is read and dropped for a moment (bounded), so
    that closing with unread bytes does not reset the connection before the client has read the answer."""
    body = f"{HTTPStatus(refused.status).phrase.lower()}: {refused}\n".encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers).encode()
    writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n%s"
                 b"Connection: close\r\n\r\n%s" % (refused.status, _reason(refused.status), len(body), extra, body))
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(writer.drain(), bounds.write_timeout)
        if writer.can_write_eof():
            writer.write_eof()
        until, drained = loop.time() + LINGER_SECONDS, 0
        while drained < LINGER_BYTES and loop.time() < until:
            chunk = await asyncio.wait_for(reader.read(READ_CHUNK), until - loop.time())
            if not chunk:
                break
            drained += len(chunk)
    except (OSError, asyncio.TimeoutError):
        pass
