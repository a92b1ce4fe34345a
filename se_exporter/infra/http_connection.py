"""One connection of the one HTTP server (``http_server``; its bounds: docs/http.md): its request heads and
bodies parsed by h11 within the size caps and deadlines, its answers written, its refusals answered and counted, and
the two rules of RFC 9112 h11 leaves to the server (docs/http.md, "Request framing and targets").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from typing import Any

import h11

from se_exporter.infra.http_pages import Handler, HttpRequest, RawWriter, Response, pieces

log = logging.getLogger("se_exporter")

JOIN_BELOW = 64 * 1024  # bytes of body written in one piece with the head (see _answer)
READ_CHUNK = 8192  # bytes read at a time: what one connection buffers stays near 40 KiB (16 KiB head cap included)
LINGER_SECONDS = 1.0  # after an error answer, how long unread request bytes are drained so the client can read it
LINGER_BYTES = 256 * 1024
_ABSOLUTE_FORM = re.compile(r"https?://[^/?#]*", re.IGNORECASE)  # a target's scheme and authority
_FRAMINGS = frozenset((b"content-length", b"transfer-encoding"))  # h11 gives header names in lower case


@dataclass(frozen=True)
class Bounds:
    """What one client may take; the defaults are docs/http.md's."""

    head_bytes: int = 16 * 1024
    head_timeout: float = 5.0
    body_bytes: int = 64 * 1024
    body_timeout: float = 5.0
    connections: int = 256
    idle_timeout: float = 60.0
    write_timeout: float = 10.0


class _Evicted(Exception):
    """This connection was closed to admit another."""


@dataclass(eq=False)
class Connection:
    """A connection as the server's admission sees it: waiting for a request head (evictable) or not."""

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
class Limits:
    """The server's bounds, its refusal counter and its admitted connections, shared by every connection."""

    bounds: Bounds
    reject: Callable[[str], None]
    connections: set[Connection] = field(default_factory=set)


class _Refused(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


class _Protocol(asyncio.StreamReaderProtocol):
    def __init__(self, reader: asyncio.StreamReader, connection: Connection | None) -> None:
        super().__init__(reader)
        self._connection = connection

    def data_received(self, data: bytes) -> None:
        if self._connection is not None:
            self._connection.received(data)
        super().data_received(data)


async def _streams(sock: socket.socket, connection: Connection | None = None,
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An accepted socket as asyncio streams; the reader pauses the socket past 16 KiB unread."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_CHUNK)
    protocol = _Protocol(reader, connection)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock)
    if hasattr(transport, "max_size"):
        # asyncio's selector transport reads up to 256 KiB per recv() before the reader can pause it: 32 times
        # READ_CHUNK per client sending a huge head, held by every such client at once. READ_CHUNK bounds each read.
        transport.max_size = READ_CHUNK
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


def first_bytes(sock: socket.socket) -> bytes:
    """What the client sent before its connection was accepted (a scrape's whole request, usually): read at once,
    so that a head already here counts as complete before the next accept may need to evict a connection."""
    sock.setblocking(False)
    try:
        return sock.recv(READ_CHUNK)
    except OSError:  # nothing yet (BlockingIOError), or reset: the conversation will see
        return b""


async def serve_connection(sock: socket.socket, first: bytes, connection: Connection, handler: Handler,
                           limits: Limits) -> None:
    """Serve one admitted connection (``first``: the bytes read at accept) until either side closes it; a bound hit
    is answered and counted, and the connection leaves ``limits.connections`` however it ends."""
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


async def refuse_busy(sock: socket.socket, bounds: Bounds) -> None:
    """Answer 503 (Retry-After 1) on a connection accepted while every connection is busy answering, and close it."""
    try:
        reader, writer = await _streams(sock)
    except OSError:
        sock.close()
        return
    try:
        await _refuse(reader, writer, _Refused(503, "connections", "every connection is busy answering"), bounds,
                      (("Retry-After", "1"),))
        await _close(writer, bounds.write_timeout)
    finally:
        writer.transport.abort()


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
                    connection: Connection, handler: Handler, limits: Limits) -> None:
    """Requests of one connection, one after the other, until either side closes it."""
    loop, bounds = asyncio.get_running_loop(), limits.bounds
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=bounds.head_bytes)
    if first:  # (no bytes would tell h11 that the client has closed)
        conn.receive_data(first)
    idle_until = loop.time() + bounds.head_timeout  # the first head: from the connection
    deadline: float | None = idle_until
    while True:
        buffered = len(conn.trailing_data[0])
        event, fed = await _next_event(conn, reader, connection, deadline, idle_until, bounds.head_timeout, "head")
        if isinstance(event, h11.ConnectionClosed):
            return
        assert isinstance(event, h11.Request)  # the only event h11 gives a server before a body
        if buffered + fed - len(conn.trailing_data[0]) > bounds.head_bytes:  # complete, but in a read past the cap
            raise _Refused(431, "header_bytes", "request head too large")
        connection.waiting_since = None
        body = await _body(conn, reader, connection, event, bounds, loop.time() + bounds.body_timeout, writer)
        target = event.target.decode("latin-1")
        path, _, query = _origin_form(target).partition("?")
        method = event.method.decode("latin-1")
        request = HttpRequest(method, path, query,
                              tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers),
                              body, RawWriter(writer, bounds.write_timeout))
        response = _no_resource(method, target) or await handler(request)
        if response is None or connection.evicted:
            return
        if {name for name, _value in event.headers} >= _FRAMINGS:
            response = replace(response, close=True)
        await _answer(conn, writer, response, method == "HEAD", bounds.write_timeout, limits)
        if response.close or conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
            return
        conn.start_next_cycle()
        connection.waiting_since = loop.time()
        deadline, idle_until = None, loop.time() + bounds.idle_timeout


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader, connection: Connection,
                      deadline: float | None, idle_until: float, head_timeout: float, what: str) -> tuple[Any, int]:
    """The next h11 event and the bytes read for it: nothing arriving by ``idle_until`` is an idle close (given as
    ``ConnectionClosed``), a ``what`` (head or body) not complete by ``deadline`` (set on its first byte when None)
    a refusal, as is what h11 cannot parse."""
    loop, fed = asyncio.get_running_loop(), 0
    while True:
        try:
            event = conn.next_event()
        except (h11.RemoteProtocolError, ValueError) as error:  # a bad head or chunk size line, a body cut short
            raise _unparsable(error, reader) from None
        if event is not h11.NEED_DATA:
            return event, fed
        until = deadline if deadline is not None else idle_until
        try:
            data = await asyncio.wait_for(reader.read(READ_CHUNK), max(0.0, until - loop.time()))
        except asyncio.TimeoutError:
            if deadline is None:
                return h11.ConnectionClosed(), fed
            raise _Refused(408, "deadline", f"request {what} not complete in time") from None
        if connection.evicted:
            raise _Evicted
        if data and deadline is None:
            deadline = loop.time() + head_timeout
        fed += len(data)
        conn.receive_data(data)


async def _body(conn: h11.Connection, reader: asyncio.StreamReader, connection: Connection, request: h11.Request,
                bounds: Bounds, deadline: float, writer: asyncio.StreamWriter) -> bytes:
    """The request's body, whole, within the bounds; a declared size over the cap is refused before reading."""
    declared = next((value for name, value in request.headers if name == b"content-length"), None)
    if declared is not None and (len(declared) > 12 or int(declared) > bounds.body_bytes):
        raise _Refused(413, "body_bytes", "request body too large")
    if conn.they_are_waiting_for_100_continue:
        writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
    parts, size = [], 0
    while True:
        event, _fed = await _next_event(conn, reader, connection, deadline, deadline, 0.0, "body")
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


def _origin_form(target: str) -> str:
    """``target`` without an absolute form's scheme and authority (``http://host:port/metrics?x`` is
    ``/metrics?x``; ``http://host`` is ``/``): the host is not checked, since we answer for no other (never proxy)."""
    authority = _ABSOLUTE_FORM.match(target)
    if authority is None:
        return target
    rest = target[authority.end():]
    return rest if rest.startswith("/") else "/" + rest


def _no_resource(method: str, target: str) -> Response | None:
    """405 (allowing nothing) for CONNECT host:port and OPTIONS *, a proxy's and the server-wide form: no resource
    of ours answers them (RFC 9110), where a handler would have taken the target for a path and answered 404."""
    if method == "CONNECT" or target == "*":
        return Response(405, b"method not allowed\n", headers=(("Allow", ""),))
    return None


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


async def _answer(conn: h11.Connection, writer: asyncio.StreamWriter, response: Response, head_only: bool,
                  timeout: float, limits: Limits) -> None:
    headers = [(name, value) for name, value in (("Content-Type", response.content_type),) if value is not None]
    size = response.size
    headers += [("Content-Length", str(size)), *response.headers]
    if response.close:
        headers.append(("Connection", "close"))
    head = conn.send(h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status)))
    parts = () if head_only else response.stream or ((response.body,) if response.body else ())
    deadline = asyncio.get_running_loop().time() + timeout  # the whole answer's, however many pieces
    if size <= JOIN_BELOW or head_only:  # one write: a head and a small body written apart stall a keep-alive client
        # by a delayed ACK at every request (a scrape's too): about 200 times a small answer's own time (http.client)
        body = b"".join(conn.send(h11.Data(data=piece)) or b"" for piece in pieces(parts))
        writer.write((head or b"") + body + (conn.send(h11.EndOfMessage()) or b""))
        await _drain(writer, deadline, limits)
        return
    writer.write(head or b"")  # a large body is not copied to be joined: each piece follows once the last is read
    for piece in pieces(parts):
        writer.write(conn.send(h11.Data(data=piece)) or b"")
        await _drain(writer, deadline, limits)
    end = conn.send(h11.EndOfMessage())  # empty with a Content-Length; it readies h11 for the next request
    if end:
        writer.write(end)
        await _drain(writer, deadline, limits)


async def _drain(writer: asyncio.StreamWriter, deadline: float, limits: Limits) -> None:
    """Until the transport's buffer is low again (the client read it), by the answer's deadline."""
    try:
        await asyncio.wait_for(writer.drain(), max(0.0, deadline - asyncio.get_running_loop().time()))
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
