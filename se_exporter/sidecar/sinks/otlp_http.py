"""The OTLP/HTTP exporter's HTTP session, bounded: a deadline for the whole exchange and a cap on the answer read.

The exporter (opentelemetry-exporter-otlp-proto-http) posts with requests, which reads the whole answer into memory
and applies its timeout to each socket read, not to the exchange: a collector answering 200 with
``Content-Length: 4000000000`` and an endless body took the sidecar's RSS past a gigabyte, and one dripping a byte
a second held span export for good. Its public seam is the ``session`` it is given; this one

* reads at most ``MAX_RESPONSE_BYTES`` of an answer (an OTLP answer is a few bytes; an error body a few hundred):
  past it, or when ``Content-Length`` says more, the request fails unread;
* ends the exchange at its deadline (the exporter's timeout, counted from the request): a watchdog timer shuts the
  connection's socket down, which ends a read under way, whether of the status line, the headers or the body;
* never follows a redirect, and fails an answer that is neither 2xx nor an error the exporter handles (1xx, 3xx):
  the exporter counts everything below 400 as delivered (requests' ``ok``), so a collector answering 307 had every
  span counted as exported while none reached any collector.

A failed request is reported to the exporter as an error it does not retry (the export counts as failed once),
whose message says why (too large, or past the deadline). Everything else (TLS and client certificates from
``OTEL_EXPORTER_OTLP_*``, headers, compression, proxies from the environment) is requests' and the exporter's own,
except that the exporter's CA file is not replaced by ``REQUESTS_CA_BUNDLE`` (``merge_environment_settings``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from se_exporter.sidecar.sinks.tracing import MAX_RESPONSE_BYTES  # one bound for both exporters

DEFAULT_DEADLINE = 10.0  # the exporter's own default timeout, when it gives none
_CHUNK = 16 * 1024
_current = threading.local()  # the deadline of the request this thread is making, for the connection to arm


class ExchangeFailed(requests.exceptions.RequestException):
    """The answer was too large or did not end in time: not a connection error, so the exporter does not retry."""


class _Deadline:
    """Shuts down the sockets of the connections it watches when the time is up."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.expired = False
        self._connections: list[HTTPConnection] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, connection: HTTPConnection) -> None:
        with self._lock:
            self._connections.append(connection)
            expired = self.expired
        if expired:
            _shut(connection)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            connections = list(self._connections)
        for connection in connections:
            _shut(connection)

    def cancel(self) -> None:
        self._timer.cancel()


def _shut(connection: HTTPConnection) -> None:
    sock = getattr(connection, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _watch(connection: HTTPConnection) -> None:
    deadline: _Deadline | None = getattr(_current, "deadline", None)
    if deadline is not None:
        deadline.watch(connection)


class _WatchedHTTPConnection(HTTPConnection):
    """Watched from its connect (a new connection) and from the wait for the answer (every exchange, a reused
    connection too): sending is bounded by the socket timeout, which covers a whole ``sendall``."""

    def connect(self) -> None:
        _watch(self)
        super().connect()

    def getresponse(self) -> Any:
        _watch(self)
        return super().getresponse()


class _WatchedHTTPSConnection(_WatchedHTTPConnection, HTTPSConnection):
    """The same for https: next in line after the watching methods comes ``HTTPSConnection``'s TLS ``connect``."""


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_POOLS = {"http": _WatchedPool, "https": _WatchedHTTPSPool}


class _WatchedAdapter(HTTPAdapter):
    """requests' adapter whose connection pools (direct or through a proxy) arm the thread's deadline."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        manager.pool_classes_by_scheme = _POOLS
        return manager


class BoundedSession(requests.Session):
    """A ``requests.Session`` for the OTLP/HTTP exporter: see the module docstring."""

    def __init__(self, max_response_bytes: int = MAX_RESPONSE_BYTES) -> None:
        super().__init__()
        self._max = max_response_bytes
        adapter = _WatchedAdapter()
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any,
                                   cert: Any) -> dict[str, Any]:
        """requests lets ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` replace a CA file set on the session, which is
        where the exporter puts ``OTEL_EXPORTER_OTLP_CERTIFICATE``: with either variable set (many images set it),
        the collector's CA was ignored and every export failed verification. A CA file (or ``False``) given to the
        session wins; the variables still apply where none was given."""
        settings: dict[str, Any] = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if verify is None and self.verify is not True:
            settings["verify"] = self.verify
        return settings

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        timeout = kwargs.get("timeout")
        seconds = timeout if isinstance(timeout, (int, float)) and timeout > 0 else DEFAULT_DEADLINE
        deadline = _current.deadline = _Deadline(seconds)
        try:
            try:
                response = super().send(request, **{**kwargs, "stream": True, "allow_redirects": False})
            except requests.exceptions.RequestException:
                if deadline.expired:
                    raise self._fail(f"no answer within the {seconds:.1f} s deadline") from None
                raise
            self._read(response, seconds, deadline)
            # Whatever ended after the watchdog fired was cut by it (headers ended by the shut socket look complete
            # to http.client, and a body without a length ends there too): not an answer.
            if deadline.expired:
                response.close()
                raise self._fail(f"no complete answer within the {seconds:.1f} s deadline")
            if response.status_code < 200 or 300 <= response.status_code < 400:  # 4xx and 5xx: the exporter's own
                response.close()  # the Location is not logged: it may carry a token
                raise self._fail(f"the collector answered HTTP {response.status_code}, not 2xx"
                                 + (" (redirects are not followed)" if response.is_redirect else ""))
            return response
        finally:
            deadline.cancel()
            _current.deadline = None

    def _read(self, response: requests.Response, seconds: float, deadline: _Deadline) -> None:
        """Read the answer into ``response`` (as requests does without ``stream``), at most ``self._max`` bytes."""
        declared = response.headers.get("Content-Length", "")
        if declared.strip().isascii() and declared.strip().isdigit() and int(declared) > self._max:
            response.close()
            raise self._fail(f"the answer declares {declared.strip()} bytes, more than the {self._max} read")
        body = bytearray()
        try:
            while chunk := response.raw.read(_CHUNK, decode_content=True):
                body += chunk
                if len(body) > self._max:
                    response.close()
                    raise self._fail(f"the answer is longer than the {self._max} bytes read")
        except ExchangeFailed:
            raise
        except Exception as error:  # urllib3's and the socket's errors alike: the exchange failed
            response.close()
            if deadline.expired:
                raise self._fail(f"the answer did not end within the {seconds:.1f} s deadline") from None
            raise self._fail(f"the answer could not be read ({error})") from None
        response._content = bytes(body)  # what requests itself does when it reads a body
        response._content_consumed = True

    @staticmethod
    def _fail(why: str) -> ExchangeFailed:
        return ExchangeFailed(why)
