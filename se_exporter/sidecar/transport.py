"""A client for IMDS on a bare socket: the IMDS hot path.

Hand-built on purpose, the one such client kept: a poll of an unchanged document is one small GET on a kept-alive
connection, and its cost is mostly the client's. The request is one ``sendall`` of bytes built from plain values, and
the answer is read with ``recv`` and cut at its blank line and its framing (``Content-Length`` or chunks), with no
file object, no e-mail header parser and no response class in between. The figure it guards: ``make bench``'s CPU
per poll at 1 Hz against the Go peer, metrics only (docs/performance.md, with what ``http.client`` costs instead).

One way in, ``get``, for the sidecar and its tests alike: it takes and returns plain values and imports nothing but
the standard library (and ``infra/outbound.py``'s guard, on the standard library too), so a sidecar that polls IMDS
never loads an HTTP client library. Its failures are this module's ``TransportError`` classes, named as httpx names
the same failures, so callers classify one way.

What this transport does and does not do, on purpose:

* HTTP/1.1 with keep-alive; idle connections are kept per origin and reused (two threads may ask at once: the poll
  loop and the identity watcher);
* a reused connection the server closed meanwhile is retried once on a new one (a GET is idempotent; httpcore does
  the same by checking an idle socket before reuse);
* GET only: there is no other method to send;
* never a proxy (it reads no environment) and never a redirect (it follows none);
* one deadline for the whole exchange when the request asks for it (``get``'s ``total``, seconds): before every
  receive and send the socket's timeout is set to what is left, so no thread or timer is needed;
* an answer cut anywhere is an error, never handed out as if it were whole (a ``Content-Length`` that is not one
  plain number is refused: a body of unknown length cannot be told from a cut one);
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Sequence
from typing import NoReturn

from se_exporter.infra.outbound import get_only

MAX_HEAD_BYTES = 64 * 1024  # the status line and headers of one answer (http.client's bound on a line)
MAX_IDLE_PER_ORIGIN = 2  # connections kept: the poll loop and the identity watcher may each hold one
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")  # in a request line or header: it would forge another line
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


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


class _Unanswered(RemoteProtocolError, ConnectionResetError):
    """The server closed the connection before the first byte of an answer: on a reused connection, a stale one."""


Origin = tuple[str, str, int]  # scheme, host, port


class KeepAliveTransport:
    """``tls``: the context for https origins (default: the system's trust store)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._idle: dict[Origin, list[_Connection]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._tls = tls

    def get(self, origin: Origin, target: str, headers: Sequence[tuple[str, str]], timeout: float | None,
            total: float | None = None) -> Answer:
        """GET ``target`` (path and query) from ``origin`` with exactly ``headers`` (Host included): the answer
        with its body still to read. ``timeout`` bounds connecting and each read, ``total`` the whole exchange."""
        if origin[0] not in ("http", "https"):
            raise UnsupportedProtocol(f"unsupported URL scheme {origin[0]!r}")
        lines = [f"GET {target} HTTP/1.1", *(f"{name}: {value}" for name, value in headers)]
        if _UNSAFE.search("".join(lines)) or " " in target:
            raise ValueError(f"a control character or space in the request to {target[:80]!r}")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        limits = _Limits(timeout, None if total is None else time.monotonic() + total)
        connection, reused = self._acquire(origin, limits)
        try:
            try:
                head = connection.exchange(request, limits)
            except ConnectionError:  # reset, broken pipe, or no answer: a reused one was closed while idle
                if not reused:
                    raise
                connection.close()  # the server closed it while idle: one more try on a new connection
                connection, reused = self._acquire(origin, limits, fresh=True)
                head = connection.exchange(request, limits)
            return Answer(self, origin, connection, *head, limits)
        except Exception as exc:
            connection.close()
            _raise_as_transport_error(exc)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [connection for pool in self._idle.values() for connection in pool]
            self._idle.clear()
        for connection in idle:
            connection.close()

    def _acquire(self, origin: Origin, limits: _Limits, fresh: bool = False) -> tuple[_Connection, bool]:
        if not fresh:
            with self._lock:
                pool = self._idle.get(origin)
                if pool:
                    return pool.pop(), True
        scheme, host, port = origin
        try:
            with get_only():  # this client sends GET and nothing else: it may reach IMDS (infra/outbound.py)
                sock = socket.create_connection((host, port), limits.left(limits.step))  # never a source_address
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if scheme == "https":
                    if self._tls is None:
                        self._tls = ssl.create_default_context()
                    sock = self._tls.wrap_socket(sock, server_hostname=host)  # the handshake: within the timeout
            except BaseException:
                sock.close()
                raise
        except TimeoutError as exc:
            raise ConnectTimeout(str(exc) or "connect timed out") from exc
        except OSError as exc:
            raise ConnectError(str(exc) or type(exc).__name__) from exc
        return _Connection(sock), False

    def _release(self, origin: Origin, connection: _Connection) -> None:
        with self._lock:
            pool = self._idle.setdefault(origin, [])
            if not self._closed and len(pool) < MAX_IDLE_PER_ORIGIN:
                pool.append(connection)
                return
        connection.close()


class _Limits:
    """The timeouts of one request: per step (connect, each read or send) and, optionally, one monotonic deadline."""

    __slots__ = ("deadline", "step")

    def __init__(self, step: float | None, deadline: float | None) -> None:
        self.step, self.deadline = step, deadline

    def left(self, step: float | None) -> float | None:
        """The timeout for the next step: the step's own, cut to what is left of the deadline."""
        if self.deadline is None:
            return step
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the whole request took longer than its total timeout")
        return remaining if step is None or remaining < step else step


class _Connection:
    """A socket and the bytes received past what was read of it."""

    __slots__ = ("buffer", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""

    def receive(self, limits: _Limits) -> bytes:
        """The next bytes from the socket (b"" at its end), within what is left of the request's time."""
        self.sock.settimeout(limits.left(limits.step))
        return self.sock.recv(65536)

    def exchange(self, request: bytes, limits: _Limits) -> tuple[int, str, list[tuple[str, str]], bool]:
        """Send the request and read the answer's head: status, reason, headers and whether the server keeps the
        connection open after it (HTTP/1.1 without ``Connection: close``); the body stays in ``buffer`` and on the
        socket. Informational (1xx) answers are skipped, as every client does."""
        self.sock.settimeout(limits.left(limits.step))
        self.sock.sendall(request)
        self.buffer = b""
        while True:
            while (end := self.buffer.find(b"\r\n\r\n")) < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    raise RemoteProtocolError(f"the answer's status line and headers exceed {MAX_HEAD_BYTES} bytes")
                data = self.receive(limits)
                if not data:
                    if self.buffer:
                        raise RemoteProtocolError("the answer ended inside its status line or headers")
                    raise _Unanswered("the server closed the connection without answering")
                self.buffer += data
            head, self.buffer = self.buffer[:end].decode("latin-1"), self.buffer[end + 4:]
            status_line, *lines = head.split("\r\n")
            version, _, rest = status_line.partition(" ")
            code, _, reason = rest.partition(" ")
            if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
                raise RemoteProtocolError(f"malformed status line {status_line[:40]!r}")
            headers = []
            for line in lines:
                name, colon, value = line.partition(":")
                if not colon or not name or name != name.strip():
                    raise RemoteProtocolError(f"malformed header line {line[:40]!r}")
                headers.append((name, value.strip()))
            if not 100 <= int(code) < 200:
                return int(code), reason.strip(), headers, version != "HTTP/1.0"

    def close(self) -> None:
        self.sock.close()


class Answer:
    """An answer whose body is still to be read: ``status``, ``reason``, ``headers`` as received, and the body as
    one iterates it. The connection goes back to the pool only when the body was read to its end (otherwise the
    bytes left on it would be read as the next response); ``close`` says when the caller is done."""

    def __init__(self, transport: KeepAliveTransport, origin: Origin, connection: _Connection, status: int,
                 reason: str, headers: list[tuple[str, str]], kept_open: bool, limits: _Limits) -> None:
        self._transport, self._origin, self._connection, self._limits = transport, origin, connection, limits
        self.status, self.reason, self.headers = status, reason, headers
        self._done = False
        self._whole = False  # the body was read to its end
        chunked = (self.header("transfer-encoding") or "").lower().rsplit(",", 1)[-1].strip() == "chunked"
        lengths = [value for name, value in headers if name.lower() == "content-length"]
        if lengths and not chunked and (len(set(lengths)) > 1 or not lengths[0].isdigit()):
            raise RemoteProtocolError(f"Content-Length {', '.join(lengths)[:40]!r} is not one length")
        self._chunked = chunked
        self._length = 0 if status in (204, 304) else int(lengths[0]) if lengths and not chunked else None
        self._reusable = (kept_open and "close" not in (self.header("connection") or "").lower()
                          and (chunked or lengths != []))

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (any case), several joined by ", " as httpx joins them; None if absent."""
        name = name.lower()
        values = [value for key, value in self.headers if key.lower() == name]
        return ", ".join(values) if values else None

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._chunks() if self._chunked else self._sized(self._length)
        except Exception as exc:
            self._finish(reusable=False)
            _raise_as_transport_error(exc)
        self._whole = True
        self._finish(reusable=self._reusable and not self._connection.buffer)

    def close(self) -> None:
        self._finish(reusable=self._whole and self._reusable and not self._connection.buffer)

    def _sized(self, length: int | None) -> Iterator[bytes]:
        """The body up to ``length`` bytes (None: until the server closes)."""
        connection, received = self._connection, 0
        while length is None or received < length:
            data = connection.buffer or connection.receive(self._limits)
            connection.buffer = b""
            if not data:
                if length is None:
                    return
                raise RemoteProtocolError(f"body ended after {received} of its {length} bytes")
            if length is not None and received + len(data) > length:
                data, connection.buffer = data[:length - received], data[length - received:]
            received += len(data)
            yield data

    def _line(self) -> tuple[bytes, bool]:
        """The next line of a chunked body without its line break, and whether the socket ended before one."""
        connection = self._connection
        while (end := connection.buffer.find(b"\r\n")) < 0:
            if len(connection.buffer) > MAX_HEAD_BYTES:
                raise RemoteProtocolError("a chunk's size line is too long")
            data = connection.receive(self._limits)
            if not data:
                line, connection.buffer = connection.buffer, b""
                return line, True
            connection.buffer += data
        line, connection.buffer = connection.buffer[:end], connection.buffer[end + 2:]
        return line, False

    def _chunks(self) -> Iterator[bytes]:
        """A chunked body, chunk by chunk. Once the last chunk's size (0) has come, the body is whole: the
        trailers are read and dropped, and an end of the socket among them only means it cannot be reused."""
        while True:
            line, ended = self._line()
            size = line.split(b";", 1)[0].strip()
            if not _CHUNK_SIZE.fullmatch(size):
                raise RemoteProtocolError(f"chunk size {size[:20]!r} is not hexadecimal")
            if int(size, 16) == 0:
                while line and not ended:
                    line, ended = self._line()
                self._reusable = self._reusable and not ended
                return
            if ended:
                raise RemoteProtocolError("the body ended inside a chunk's size line")
            yield from self._sized(int(size, 16))
            line, ended = self._line()
            if line or ended:
                raise RemoteProtocolError("a chunk is longer than its size")

    def _finish(self, reusable: bool) -> None:
        if self._done:
            return
        self._done = True
        if reusable:
            self._transport._release(self._origin, self._connection)
        else:
            self._connection.close()


def _raise_as_transport_error(exc: Exception) -> NoReturn:
    """Raise the ``TransportError`` for a failure of the standard library, so callers handle one family."""
    if isinstance(exc, TransportError):
        raise exc
    if isinstance(exc, TimeoutError):
        raise ReadTimeout(str(exc) or "timed out") from exc
    if isinstance(exc, OSError):
        raise ReadError(str(exc) or type(exc).__name__) from exc
    raise exc
