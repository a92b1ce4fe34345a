"""The OTLP/HTTP exporter's HTTP session, bounded: a deadline for the whole exchange and a cap on the answer read.

The exporter posts with requests, which reads the whole answer into memory and applies its timeout to each socket
read, not to the exchange: a collector answering with an endless body, or dripping a byte a second, held span
export for good. Its public seam is the ``session`` it is given; this one reads at most ``MAX_RESPONSE_BYTES`` of
an answer, ends the exchange at the exporter's timeout (a timer shuts the request's sockets down, which ends a read
under way) and fails a 1xx or 3xx answer, which the exporter would count as delivered (docs/http.md).

A failed request is an error the exporter does not retry (the export counts as failed once), saying why.
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection

from se_exporter.sidecar.sinks.tracing import MAX_RESPONSE_BYTES  # one bound for both exporters

DEFAULT_DEADLINE = 10.0  # the exporter's own default timeout, when it gives none
_current = threading.local()  # the watchdog of the request this thread is making, for its connections


class ExchangeFailed(requests.exceptions.RequestException):
    """The answer was too large, not 2xx-5xx, or did not end in time: not a connection error, so not retried."""


class _Watchdog:
    """Shuts down the sockets of the connections it watches when the time is up, unless cancelled first.

    The pool hands the same connection object to the next request (reconnected): a timer that woke as its request
    ended and fired late would shut the next request's socket, whose cut answer (a status line, half a header)
    then reads as delivered. Firing and cancelling take one lock, so nothing is shut once ``cancel`` returns."""

    def __init__(self, seconds: float) -> None:
        self.fired = threading.Event()
        self._connections: list[HTTPConnection] = []
        self._lock = threading.Lock()
        self._cancelled = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, connection: HTTPConnection) -> None:
        with self._lock:
            self._connections.append(connection)
            if self.fired.is_set():
                _shut(connection)

    def _fire(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self.fired.set()
            for connection in self._connections:
                _shut(connection)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            self._timer.cancel()


def _shut(connection: HTTPConnection) -> None:
    if connection.sock is not None:
        with contextlib.suppress(OSError):
            connection.sock.shutdown(socket.SHUT_RDWR)


class _WatchedHTTPConnection(HTTPConnection):
    """Watched from its connect (a new connection) and from the wait for the answer (a reused one too); sending is
    bounded by the socket timeout, which covers a whole ``sendall``."""

    def connect(self) -> None:
        _current.watchdog.watch(self)
        super().connect()

    def getresponse(self) -> Any:
        _current.watchdog.watch(self)
        return super().getresponse()


class _WatchedHTTPSConnection(_WatchedHTTPConnection, HTTPSConnection):
    """The same for https: next in line after the watching methods comes ``HTTPSConnection``'s TLS ``connect``."""


class _WatchedAdapter(HTTPAdapter):
    """requests' adapter whose connection pools (direct or through a proxy) make watched connections."""

    def get_connection_with_tls_context(self, *args: Any, **kwargs: Any) -> Any:
        pool = super().get_connection_with_tls_context(*args, **kwargs)
        pool.ConnectionCls = _WatchedHTTPSConnection if pool.scheme == "https" else _WatchedHTTPConnection
        return pool


class BoundedSession(requests.Session):
    """A ``requests.Session`` for the OTLP/HTTP exporter: see the module docstring."""

    def __init__(self, max_response_bytes: int = MAX_RESPONSE_BYTES) -> None:
        super().__init__()
        self.max_response_bytes = max_response_bytes
        adapter = _WatchedAdapter()
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any,
                                   cert: Any) -> dict[str, Any]:
        """requests lets ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` replace the CA file set on the session, which is
        where the exporter puts ``OTEL_EXPORTER_OTLP_CERTIFICATE``: a CA file (or ``False``) given to the session
        wins; the variables still apply where none was given."""
        settings: dict[str, Any] = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if verify is None and self.verify is not True:
            settings["verify"] = self.verify
        return settings

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        timeout = kwargs.get("timeout")
        seconds = timeout if isinstance(timeout, (int, float)) and timeout > 0 else DEFAULT_DEADLINE
        watchdog = _current.watchdog = _Watchdog(seconds)
        try:
            response = super().send(request, **{**kwargs, "stream": True, "allow_redirects": False})
            body = response.raw.read(self.max_response_bytes + 1, decode_content=True)
        except Exception as error:  # requests', urllib3's and the socket's errors alike
            if not watchdog.fired.is_set() and isinstance(error, requests.exceptions.RequestException):
                raise
            why = "" if watchdog.fired.is_set() else f"the answer could not be read ({error})"
            raise ExchangeFailed(why or f"no answer within the {seconds:.1f} s deadline") from None
        finally:
            watchdog.cancel()
            _current.watchdog = None
        # What ended after the watchdog fired was cut by it, even where it looks whole (headers, a body without
        # a length): not an answer.
        if watchdog.fired.is_set():
            why = f"no complete answer within the {seconds:.1f} s deadline"
        elif len(body) > self.max_response_bytes:
            why = f"the answer is longer than the {self.max_response_bytes} bytes read"
        elif response.status_code < 200 or 300 <= response.status_code < 400:  # 4xx and 5xx: the exporter's own
            # Not the Location: it may carry a token.
            why = f"the collector answered HTTP {response.status_code}, not 2xx" + (
                " (redirects are not followed)" if response.is_redirect else "")
        else:
            response.raw = io.BytesIO(body)  # read again by ``content``, as requests reads a body it was not given
            return response
        response.close()
        raise ExchangeFailed(why)
