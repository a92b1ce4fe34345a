"""An httpx transport on the standard library's ``http.client``: the IMDS hot path.

Why not httpx's own transport (httpcore + h11): a poll of an unchanged document is one small GET
on a kept-alive loopback-like connection, and at 20 Hz its cost is mostly the client's. Measured on
the benchmark machine (thread CPU per GET, warm): httpx's default transport 200 us, a bare httpcore
pool 138 us, ``http.client`` with keep-alive 73 us. So the client API stays httpx (``httpx.Client``,
``httpx.Request``/``Response``, httpx's exception types, ``MockTransport`` in tests), and only the
bytes on the wire go through ``http.client``, whose C-accelerated parsing is the cheapest robust
HTTP/1.1 client at hand.

What this transport does and does not do, on purpose:

* HTTP/1.1 with keep-alive; idle connections are kept per origin and reused (two threads may ask
  at once: the poll loop and the identity watcher);
* a reused connection the server closed meanwhile is retried once on a new one (a GET is
  idempotent; httpcore does the same by checking an idle socket before reuse);
* GET only: any other method is refused before a byte is sent;
* never a proxy (``http.client`` reads no environment) and never a redirect (it follows none);
* every failure is raised as the httpx exception httpcore would raise, so callers classify one way.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from typing import NoReturn

import httpx

# Errors meaning "the idle connection was closed by the server before our request reached it".
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class KeepAliveTransport(httpx.BaseTransport):
    def __init__(self, max_idle_per_origin: int = 2) -> None:
        self._idle: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = {}
        self._max_idle = max_idle_per_origin
        self._lock = threading.Lock()
        self._closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if request.method != "GET":  # read-only by construction: nothing here can approve an event
            raise httpx.UnsupportedProtocol(f"this transport sends GET only, not {request.method}", request=request)
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {url.scheme!r}", request=request)
        origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        timeout = request.extensions.get("timeout", {})
        target = url.raw_path.decode("ascii")
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in request.headers.raw]
        connection, reused = self._acquire(origin, timeout.get("connect"))
        try:
            try:
                response = _exchange(connection, request, target, headers, timeout.get("read"))
            except _STALE:
                if not reused:
                    raise
                connection.close()  # the server closed it while idle: one more try on a new connection
                connection, reused = self._acquire(origin, timeout.get("connect"), fresh=True)
                response = _exchange(connection, request, target, headers, timeout.get("read"))
        except Exception as exc:
            connection.close()
            _raise_as_httpx(exc, request)
        return httpx.Response(
            status_code=response.status,
            headers=[(name.encode("latin-1"), value.encode("latin-1")) for name, value in response.getheaders()],
            stream=_Body(self, origin, connection, response, request),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": response.reason.encode("latin-1")},
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [connection for pool in self._idle.values() for connection in pool]
            self._idle.clear()
        for connection in idle:
            connection.close()

    def _acquire(self, origin: tuple[str, str, int], connect_timeout: float | None,
                 fresh: bool = False) -> tuple[http.client.HTTPConnection, bool]:
        if not fresh:
            with self._lock:
                pool = self._idle.get(origin)
                if pool:
                    return pool.pop(), True
        scheme, host, port = origin
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        return cls(host, port, timeout=connect_timeout), False

    def _release(self, origin: tuple[str, str, int], connection: http.client.HTTPConnection) -> None:
        with self._lock:
            pool = self._idle.setdefault(origin, [])
            if not self._closed and len(pool) < self._max_idle:
                pool.append(connection)
                return
        connection.close()


def _exchange(connection: http.client.HTTPConnection, request: httpx.Request, target: str,
              headers: list[tuple[str, str]], read_timeout: float | None) -> http.client.HTTPResponse:
    if connection.sock is None:
        try:
            connection.connect()  # with the connect timeout the connection was made with
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
    connection.sock.settimeout(read_timeout)
    # skip_host: httpx.Request put Host in the headers. skip_accept_encoding: ask for no compression, so the
    # bytes read are the document (and the body cap counts what is on the wire).
    connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
    for name, value in headers:
        connection.putheader(name, value)
    connection.endheaders()
    return connection.getresponse()


class _Body(httpx.SyncByteStream):
    """The response body, read as the caller iterates; the connection goes back to the pool only when the
    body was read to its end (otherwise the bytes left on it would be read as the next response)."""

    def __init__(self, transport: KeepAliveTransport, origin: tuple[str, str, int],
                 connection: http.client.HTTPConnection, response: http.client.HTTPResponse,
                 request: httpx.Request) -> None:
        self._transport, self._origin = transport, origin
        self._connection, self._response, self._request = connection, response, request
        self._done = False

    def __iter__(self) -> Iterator[bytes]:
        try:
            while chunk := self._response.read(65536):  # read() closes at Content-Length; read1() does not
                yield chunk
        except Exception as exc:
            self._finish(reusable=False)
            _raise_as_httpx(exc, self._request)
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


def _raise_as_httpx(exc: Exception, request: httpx.Request) -> NoReturn:
    """Raise the httpx exception for a failure of the standard library, so callers handle one family."""
    if isinstance(exc, httpx.HTTPError):
        raise exc
    if isinstance(exc, TimeoutError):
        raise httpx.ReadTimeout(str(exc) or "timed out", request=request) from exc
    if isinstance(exc, http.client.HTTPException):
        raise httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}", request=request) from exc
    if isinstance(exc, OSError):
        raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc
    raise exc
