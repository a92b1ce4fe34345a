"""A client for IMDS on the standard library's ``http.client``: the IMDS hot path.

Hand-built on purpose, the one such client kept: a poll of an unchanged document is one small GET on a kept-alive
connection, and its cost is mostly the client's. ``http.client``'s C-accelerated parsing under this thin layer is
what keeps a poll under the Go peer's CPU (the figure it guards: ``make bench``'s "CPU time per poll at 20 Hz,
metrics only", target 1.0x the peer); httpx's own transport, or a bare httpcore pool, costs several times as much
per GET (figures: docs/performance.md, "Poll"). It uses ``http.client``'s public API only (its connections
override ``connect``).

One way in, ``get``, for the sidecar and its tests alike: it takes and returns plain values and imports nothing but
the standard library (and ``infra/outbound.py``'s guard, on the standard library too), so a sidecar that polls IMDS
never loads httpx. Its failures are this module's
``TransportError`` classes, named as httpx names the same failures.

What this transport does and does not do, on purpose:

* HTTP/1.1 with keep-alive; idle connections are kept per origin and reused (two threads may ask
  at once: the poll loop and the identity watcher);
* a reused connection the server closed meanwhile is retried once on a new one (a GET is
  idempotent; httpcore does the same by checking an idle socket before reuse);
* GET only: any other method is refused before a byte is sent;
* never a proxy (``http.client`` reads no environment) and never a redirect (it follows none);
* one deadline for the whole exchange when the request asks for it (``get``'s ``total``, seconds):
  connect, request, status line, headers and every byte of the body must be done by then, so a server that
  drips one byte at a time cannot hold a poll past it. It is enforced by the socket itself: before every
  receive and send the socket's timeout is set to what is left (see ``_arm``), so no thread or timer is needed;
* an answer cut anywhere is an error, never handed out as if it were whole: ``http.client`` quietly takes
  whatever it has at end-of-file for the whole status line, the whole header section or the whole body, so
  ``_Response`` and ``_Body`` check that each ended where it says (a line break, the blank line, the
  ``Content-Length``; a chunked body must reach its last chunk), and a ``Content-Length`` that is not one
  plain number is refused (a body of unknown length cannot be told from a cut one);
* every failure is raised as this module's twin of the exception httpcore would raise, so callers classify one way.
"""

from __future__ import annotations

import http.client
import math
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from se_exporter.infra.outbound import get_only

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

# Errors meaning "the idle connection was closed by the server before our request reached it".
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


REARM_AFTER = 0.01  # seconds: how stale a socket timeout may be (so how far past the deadline a request may end)


class TransportError(Exception):
    """A request that failed below HTTP. The subclasses bear the names of httpx's exceptions for the same
    failures, so a message reads as it would from any Python HTTP client."""


class TimeoutException(TransportError):
    pass


class ConnectTimeout(TimeoutException):
    pass


class ReadTimeout(TimeoutException):
    pass


class ConnectError(TransportError):
    pass


class ReadError(TransportError):
    pass


class RemoteProtocolError(TransportError):
    pass


class UnsupportedProtocol(TransportError):
    pass


Origin = tuple[str, str, int]  # scheme, host, port


class KeepAliveTransport:
    """``tls``: the context for https origins (default: the system's trust store); its socket class is replaced."""

    def __init__(self, max_idle_per_origin: int = 2, tls: ssl.SSLContext | None = None) -> None:
        self._idle: dict[Origin, list[http.client.HTTPConnection]] = {}
        self._max_idle = max_idle_per_origin
        self._lock = threading.Lock()
        self._closed = False
        self._tls = tls
        if tls is not None:
            tls.sslsocket_class = _DeadlineTLSSocket  # the deadline survives the TLS wrapping

    def get(self, origin: Origin, target: str, headers: Sequence[tuple[str, str]], timeout: float | None,
            total: float | None = None) -> Answer:
        """GET ``target`` (path and query) from ``origin`` with exactly ``headers`` (Host included): the answer
        with its body still to read. ``timeout`` bounds connecting and each read, ``total`` the whole exchange."""
        if origin[0] not in ("http", "https"):
            raise UnsupportedProtocol(f"unsupported URL scheme {origin[0]!r}")
        limits = _Limits(timeout, timeout, None if total is None else time.monotonic() + total)
        return self._get(origin, target, headers, limits)

    def _get(self, origin: Origin, target: str, headers: Sequence[tuple[str, str]], limits: _Limits) -> Answer:
        connection, reused = self._acquire(origin)
        try:
            try:
                response = _exchange(connection, target, headers, limits)
            except _STALE:
                if not reused:
                    raise
                connection.close()  # the server closed it while idle: one more try on a new connection
                connection, reused = self._acquire(origin, fresh=True)
                response = _exchange(connection, target, headers, limits)
        except Exception as exc:
            connection.close()
            _raise_as_transport_error(exc)
        return Answer(self, origin, connection, response)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [connection for pool in self._idle.values() for connection in pool]
            self._idle.clear()
        for connection in idle:
            connection.close()

    def _acquire(self, origin: Origin, fresh: bool = False) -> tuple[http.client.HTTPConnection, bool]:
        if not fresh:
            with self._lock:
                pool = self._idle.get(origin)
                if pool:
                    return pool.pop(), True
        scheme, host, port = origin
        connection: http.client.HTTPConnection
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
                self._tls.sslsocket_class = _DeadlineTLSSocket  # the deadline survives the TLS wrapping
            connection = _TLSConnection(host, port, context=self._tls)
        else:
            connection = _Connection(host, port)
        return connection, False

    def _release(self, origin: Origin, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            pool = self._idle.setdefault(origin, [])
            if not self._closed and len(pool) < self._max_idle:
                pool.append(connection)
                return
        connection.close()


class _Limits:
    """The timeouts of one request: per step (connect, each read) and, optionally, one monotonic deadline."""

    __slots__ = ("connect", "deadline", "read")

    def __init__(self, connect: float | None, read: float | None, deadline: float | None) -> None:
        self.connect, self.read, self.deadline = connect, read, deadline

    def left(self, step: float | None, now: float | None = None) -> float | None:
        """The timeout for the next step: the step's own, cut to what is left of the deadline."""
        if self.deadline is None:
            return step
        remaining = self.deadline - (time.monotonic() if now is None else now)
        if remaining <= 0:
            raise TimeoutError("the whole request took longer than its total timeout")
        return remaining if step is None or remaining < step else step


def _exchange(connection: http.client.HTTPConnection, target: str, headers: Sequence[tuple[str, str]],
              limits: _Limits) -> http.client.HTTPResponse:
    if connection.sock is None:
        try:
            connection.timeout = limits.left(limits.connect)
            connection.connect()
        except TimeoutError as exc:
            raise ConnectTimeout(str(exc) or "connect timed out") from exc
        except OSError as exc:
            raise ConnectError(str(exc) or type(exc).__name__) from exc
    sock = connection.sock
    if limits.deadline is not None and isinstance(sock, (_DeadlineSocket, _DeadlineTLSSocket)):
        sock.limits, sock.armed_at = limits, -math.inf
    else:
        if isinstance(sock, (_DeadlineSocket, _DeadlineTLSSocket)):
            sock.limits = None
        sock.settimeout(limits.read)
    # skip_host: the caller's headers hold Host. skip_accept_encoding: the caller says what it accepts
    # (ImdsClient asks for identity, so the bytes read are the document and the body cap counts what is on the wire).
    connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
    for name, value in headers:
        connection.putheader(name, value)
    connection.endheaders()
    return connection.getresponse()


class _Response(http.client.HTTPResponse):
    """``http.client``'s response, refusing a status line or header section cut short by the peer closing (which
    ``http.client`` reads as complete) and a ``Content-Length`` that is not one plain number."""

    def begin(self) -> None:
        reader = _HeadReader(self.fp)
        self.fp = reader  # type: ignore[assignment]  # only readline() is used while reading the head
        try:
            super().begin()
        finally:
            if self.fp is reader:  # type: ignore[comparison-overlap]  # it is, unless begin() closed it
                self.fp = reader.inner
        if reader.cut:
            raise http.client.HTTPException("the answer ended inside its status line or headers")
        lengths = self.headers.get_all("content-length")
        if lengths and not self.chunked and (len(set(lengths)) > 1 or not lengths[0].strip().isdigit()):
            raise http.client.HTTPException(f"Content-Length {', '.join(lengths)[:40]!r} is not one length")


class _HeadReader:
    """Passes ``readline`` through, noting a line that did not end with a line break (end-of-file came first)."""

    __slots__ = ("cut", "inner")

    def __init__(self, inner: Any) -> None:
        self.inner, self.cut = inner, False

    def readline(self, limit: int = -1) -> bytes:
        line: bytes = self.inner.readline(limit)
        if not line.endswith(b"\n"):
            self.cut = True
        return line

    def close(self) -> None:  # http.client closes the reader when the peer hung up before answering
        self.inner.close()


class Answer:
    """An answer whose body is still to be read: ``status``, ``reason``, ``headers`` as received, and the body as
    one iterates it. The connection goes back to the pool only when the body was read to its end (otherwise the
    bytes left on it would be read as the next response); ``close`` says when the caller is done."""

    def __init__(self, transport: KeepAliveTransport, origin: Origin, connection: http.client.HTTPConnection,
                 response: http.client.HTTPResponse) -> None:
        self._transport, self._origin = transport, origin
        self._connection, self._response = connection, response
        self.status, self.reason = response.status, response.reason
        self.headers: list[tuple[str, str]] = response.getheaders()
        self._done = False

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (any case), several joined by ", " as httpx joins them; None if absent."""
        values = self._response.headers.get_all(name)
        return None if values is None else ", ".join(values)

    def __iter__(self) -> Iterator[bytes]:
        received = 0
        try:
            while chunk := self._response.read(65536):  # read() closes at Content-Length; read1() does not
                received += len(chunk)
                yield chunk
            if self._response.length:  # http.client ends quietly when the peer closes before Content-Length
                declared = received + self._response.length
                raise RemoteProtocolError(f"body ended after {received} of its {declared} bytes")
        except Exception as exc:
            self._finish(reusable=False)
            _raise_as_transport_error(exc)
        self._finish(reusable=not self._response.will_close)

    def close(self) -> None:
        self._finish(reusable=self._response.isclosed() and not self._response.will_close)

    def _finish(self, reusable: bool) -> None:
        if self._done:
            return
        self._done = True
        if reusable:
            self._transport._release(self._origin, self._connection)
        else:
            self._response.close()
            self._connection.close()


def _arm(sock: _DeadlineSocket | _DeadlineTLSSocket) -> None:
    """Before each receive or send: the socket's timeout becomes what is left of the request's deadline (or the
    per-read timeout, if shorter). Socket timeouts bound one call each, and a buffered read loops over many
    calls, so setting it once per request would let a server that sends a byte now and then go on for ever.

    A timeout set less than ``REARM_AFTER`` ago is kept: it ends at most that much after the deadline, and a poll
    that is read at once (the common case) then costs one ``settimeout`` (a system call), as it did before."""
    limits = sock.limits
    if limits is None:
        return
    now = time.monotonic()
    if now - sock.armed_at < REARM_AFTER:
        return
    sock.armed_at = now
    sock.settimeout(limits.left(limits.read, now))


class _DeadlineSocket(socket.socket):
    """A TCP socket whose every receive and send is bounded by the current request's ``_Limits``."""

    limits: _Limits | None = None
    armed_at = -math.inf

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        _arm(self)
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        _arm(self)
        super().sendall(data, flags)


class _DeadlineTLSSocket(ssl.SSLSocket):
    """The same for https: ``SSLContext.sslsocket_class`` makes the TLS wrapper of a connection this class."""

    limits: _Limits | None = None
    armed_at = -math.inf

    def recv_into(self, buffer: WriteableBuffer, nbytes: int | None = None, flags: int = 0) -> int:
        _arm(self)
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        _arm(self)
        super().sendall(data, flags)


class _Connection(http.client.HTTPConnection):
    """``http.client``'s connection through its public ``connect``: the socket is a ``_DeadlineSocket`` (what
    ``HTTPConnection.connect`` does otherwise: connect, no Nagle; we never tunnel) and answers are ``_Response``."""

    response_class = _Response

    def connect(self) -> None:
        with get_only():  # this client sends GET and nothing else: it may reach IMDS (infra/outbound.py)
            plain = socket.create_connection((self.host, self.port), self.timeout)  # no source_address: never given
        sock = _DeadlineSocket(plain.family, plain.type, plain.proto, plain.detach())
        sock.settimeout(self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock


class _TLSConnection(http.client.HTTPSConnection, _Connection):
    """The same for https: ``HTTPSConnection.connect`` calls ``_Connection.connect`` (next in line), then wraps the
    socket with its context, whose ``sslsocket_class`` (public, meant to be replaced) is ``_DeadlineTLSSocket``."""

    response_class = _Response


def _raise_as_transport_error(exc: Exception) -> NoReturn:
    """Raise the ``TransportError`` for a failure of the standard library, so callers handle one family."""
    if isinstance(exc, TransportError):
        raise exc
    if isinstance(exc, TimeoutError):
        raise ReadTimeout(str(exc) or "timed out") from exc
    if isinstance(exc, http.client.HTTPException):
        raise RemoteProtocolError(f"{type(exc).__name__}: {exc}") from exc
    if isinstance(exc, OSError):
        raise ReadError(str(exc) or type(exc).__name__) from exc
    raise exc
