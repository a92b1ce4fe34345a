"""IMDS on loopback, byte for byte, for tests of ``ImdsClient`` and the poll loop: answers written as
``httpx.Response`` values (or httpx's exceptions, for the faults they name) become the bytes a
``ScriptedServer`` sends, and the client reaches it through the production transport. There is no other way
into ``ImdsClient``: what the tests drive is what the sidecar runs.

``SpyTransport`` is the real ``KeepAliveTransport`` noting the timeouts each GET was given (what no server can
see), and ``served`` keeps the servers a test made so a fixture can close them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import httpx

from se_exporter.sidecar.imds import ImdsClient
from se_exporter.sidecar.transport import Answer, KeepAliveTransport, Origin
from tests.support.fakes.http_server import HANG, ScriptedServer

NOT_HTTP = b"this is not HTTP\r\n\r\n"  # what a broken middlebox might say: a protocol error, never a document


def wire(item: httpx.Response | Exception) -> object:
    """The ``ScriptedServer`` step for one answer: the response's bytes (a Content-Length added when it has none);
    for httpx's timeouts, no answer at all (HANG); for any other transport failure, bytes that are not HTTP."""
    if isinstance(item, httpx.TimeoutException):
        return HANG
    if isinstance(item, Exception):
        return NOT_HTTP
    body = item.read()
    headers = list(item.headers.raw)
    if not any(name.lower() in (b"content-length", b"transfer-encoding") for name, _ in headers):
        headers.append((b"Content-Length", str(len(body)).encode()))
    head = b"HTTP/1.1 %d %s\r\n" % (item.status_code, item.reason_phrase.encode("latin-1"))
    return head + b"".join(b"%s: %s\r\n" % pair for pair in headers) + b"\r\n" + body


class SpyTransport(KeepAliveTransport):
    """The production transport, noting each GET's target and its timeouts (per step, and for the whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, float | None, float | None]] = []

    def get(self, origin: Origin, target: str, headers: Sequence[tuple[str, str]], timeout: float | None,
            total: float | None = None) -> Answer:
        self.calls.append((target, timeout, total))
        return super().get(origin, target, headers, timeout, total)


served: list[ScriptedServer] = []
transports: list[KeepAliveTransport] = []


def scripted_imds(script: Iterable[httpx.Response | Exception | object], *, timeout: float = 2.0,
                  first_call_timeout: float = 120.0, max_body_bytes: int = 1024 * 1024,
                  api_version: str = "2020-07-01") -> tuple[ImdsClient, ScriptedServer, SpyTransport]:
    """An ``ImdsClient`` on the real transport, reading a loopback server that answers from ``script`` in order
    (httpx values as ``wire`` renders them; other items are ``ScriptedServer`` steps as they are)."""
    steps = [wire(item) if isinstance(item, (httpx.Response, Exception)) else item for item in script]
    server = ScriptedServer(steps)
    served.append(server)
    transport = SpyTransport()
    transports.append(transport)
    client = ImdsClient(transport, server.url, api_version, timeout=timeout, first_call_timeout=first_call_timeout,
                        max_body_bytes=max_body_bytes)
    return client, server, transport


def close_all() -> None:
    """Close what ``scripted_imds`` made (the fixture of the tests that use it calls this after each test)."""
    while transports:
        transports.pop().close()
    while served:
        served.pop().close()
