"""The HTTP server's bounds (se_exporter/infra/http_server.py): a client cannot hold a connection for ever, nor crowd
out a scrape, nor make the process buffer a huge head; and the sidecar's endpoints answer what they serve."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gzip
import http.client
import json
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import h11
import pytest
from prometheus_client import CollectorRegistry, Gauge

from se_exporter.infra import http_connection, http_pages, http_server
from se_exporter.infra.http_server import Bounds, HttpRequest, Response, serve
from se_exporter.infra.options import Listen
from se_exporter.sidecar.endpoints import make_http_app
from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.server import Simulator
from se_exporter.simulator.server import start as start_simulator
from tests.conftest import Reliability
from tests.support.helpers import wait_until
from tests.support.slow_clients import Drippers, scrape

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n\r\n"


async def hello(request: HttpRequest) -> Response:
    return Response(200, b"up 1\n")


@pytest.fixture
def server() -> Iterator[Callable[..., tuple[int, list[str]]]]:
    """Start the HTTP server with given bounds on a free loopback port; returns the port and the reasons of the
    refusals it counted."""
    started: list[Any] = []

    def make(**bounds: Any) -> tuple[int, list[str]]:
        rejected: list[str] = []
        started.append(serve(Listen("127.0.0.1", 0), hello, Bounds(**bounds), rejected.append))
        return int(started[-1].server_port), rejected

    yield make
    for item in started:
        item.server_close()


_opened: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_client_sockets() -> Iterator[None]:
    """Every client socket a test opens is closed after it, passed or failed (a leaked one would be reported by
    the garbage collector in some later test)."""
    yield
    while _opened:
        _opened.pop().close()


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    _opened.append(sock)
    return sock


def readable(sock: socket.socket, timeout: float) -> bool:
    """select() without its 1024-descriptor limit (the suite's process may hold more)."""
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        return bool(selector.select(timeout))


def answer(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def closed_by_server(sock: socket.socket) -> bool:
    if not readable(sock, 0):
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_request_dripped_byte_by_byte_is_cut_off_at_the_deadline(server: Callable[..., tuple[int, list[str]]],
                                                                   reliability: Reliability) -> None:
    """A client that sends its headers one byte every 0.1 s (each read well inside any per-read timeout) is
    answered 408 and disconnected once the head deadline has passed, and the refusal is counted."""
    port, rejected = server(head_timeout=0.5)
    sock = connect(port)
    headers = iter(b"GET /metrics HTTP/1.1\r\n" + b"X-Drip: " + b"a" * 10_000)
    deadline = time.monotonic() + 10
    answered = b""
    while time.monotonic() < deadline and not answered:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.send(bytes([next(headers)]))
        if readable(sock, 0.1):  # 0.1 s: the drip's pace
            answered = answer(sock) or b"closed"
    sock.close()
    assert answered.startswith(b"HTTP/1.1 408"), answered
    assert rejected == ["deadline"]
    with connect(port) as fresh:
        fresh.sendall(REQUEST)
        assert answer(fresh).startswith(b"HTTP/1.1 200")
    reliability("HTTP server", "request headers dripped one byte every 0.1 s",
                "answered 408 and closed at the 5 s head deadline; other scrapes served meanwhile")


def test_a_head_over_the_cap_is_answered_431_before_it_is_complete(
        server: Callable[..., tuple[int, list[str]]], reliability: Reliability) -> None:
    """Headers passing 16 KiB in all (each of them short, and few) get 431 while the client is still sending
    them: the server never waits for, nor buffers, the rest of the head."""
    port, rejected = server()
    sock = connect(port)
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\n" + b"X-Part: " + b"a" * 4000 + b"\r\n")
    for _ in range(4):  # 16 KiB and a bit, in five lines: and no blank line, the head is not over
        sock.sendall(b"X-Part: " + b"a" * 4000 + b"\r\n")
    assert readable(sock, 5), "no answer to a head past 16 KiB while it was still coming"
    assert sock.recv(65536).startswith(b"HTTP/1.1 431")
    assert rejected == ["header_bytes"]
    reliability("HTTP server", "a request head over 16 KiB in all (98 headers of 65,000 bytes)",
                "431 once 16 KiB are buffered, the rest never read; RSS flat")


def test_a_complete_head_over_the_cap_in_one_read_is_refused_too(server: Callable[..., tuple[int, list[str]]]) -> None:
    """The cap is on the head's bytes, not on what happens to be buffered: a 20 KiB head sent at once is 431."""
    port, _ = server()
    with connect(port) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n")
        assert answer(sock).startswith(b"HTTP/1.1 431")


def test_slow_clients_never_take_a_scrapes_place(server: Callable[..., tuple[int, list[str]]],
                                                 reliability: Reliability) -> None:
    """With 40 connections dripping a request head (a byte every 0.2 s, reconnecting whenever closed) against a
    limit of 8 connections, 10 of 10 scrapes still get 200 within 2 s: the connection that has waited longest
    for its head makes room, and a scrape's head arrives at once."""
    port, rejected = server(connections=8)
    with Drippers(port, 40, every=0.2) as drippers:
        wait_until(lambda: drippers.opened > 48, what="the drippers to fill the server and be evicted")
        statuses = [scrape(port, "/metrics", timeout=2) for _ in range(10)]
    assert statuses == [200] * 10
    assert "connections" in rejected
    reliability("HTTP server", "40 connections dripping a request head, reconnecting, against a limit of 8",
                "10 of 10 scrapes answered 200 within 2 s; the longest-waiting connection closed for each new one "
                "past the limit, counted")


def test_connections_busy_answering_are_not_evicted_and_the_newcomer_gets_503(
        server: Callable[..., tuple[int, list[str]]]) -> None:
    """When every connection is mid-answer (none waits for a head), a new one is answered 503 at once."""
    gate = asyncio.Event()  # bound to the server's loop when a handler first waits on it; set from there only

    async def slow(request: HttpRequest) -> Response:
        await gate.wait()
        return Response(200, b"late\n")

    rejected: list[str] = []
    running = serve(Listen("127.0.0.1", 0), slow, Bounds(connections=2), rejected.append)

    def open_gate() -> None:
        with contextlib.suppress(RuntimeError):  # the loop already closed
            running._loop.call_soon_threadsafe(gate.set)

    try:
        busy = [connect(running.server_port) for _ in range(2)]
        for sock in busy:
            sock.sendall(REQUEST)
        wait_until(lambda: len(running._limits.connections) == 2 and all(
            c.waiting_since is None for c in running._limits.connections), what="both connections answering")
        with connect(running.server_port) as late:
            late.sendall(REQUEST)
            assert answer(late).startswith(b"HTTP/1.1 503")
        open_gate()
        for sock in busy:
            assert answer(sock).startswith(b"HTTP/1.1 200")
        assert rejected == ["connections"]
    finally:
        open_gate()
        running.server_close()


def test_a_burst_of_scrapers_is_queued_by_the_kernel_and_all_answered(
        server: Callable[..., tuple[int, list[str]]]) -> None:
    """200 connections made at once (more than the connection limit) complete their TCP handshake at once (a
    listen backlog of 5 made most of them wait for SYN retransmissions, seconds each) and are all answered."""
    port, _ = server()
    burst = [connect(port, timeout=0.5) for _ in range(200)]  # a dropped SYN is retried only after 1 s
    for sock in burst:
        sock.sendall(REQUEST)
    for sock in burst:
        sock.settimeout(30)
        assert answer(sock).startswith(b"HTTP/1.1 200")
        sock.close()


def test_a_body_over_the_cap_is_refused_413_unread(server: Callable[..., tuple[int, list[str]]]) -> None:
    """A declared body over 64 KiB is answered 413 without waiting for it; one within is read and answered."""
    port, rejected = server()
    with connect(port) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: s\r\nContent-Length: 1048576\r\n\r\n")
        assert answer(sock).startswith(b"HTTP/1.1 413")
    with connect(port) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: s\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc")
        assert answer(sock).startswith(b"HTTP/1.1 200")
    assert rejected == ["body_bytes"]


def test_a_chunked_body_over_the_cap_is_refused_413_at_once(server: Callable[..., tuple[int, list[str]]]) -> None:
    """A chunked body that passes 64 KiB is answered 413 as soon as that much is read, not 408 when the body
    deadline (here a minute) ends, though its last chunk never comes."""
    port, rejected = server(body_timeout=60.0)
    with connect(port, timeout=20.0) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: s\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"8000\r\n" + b"a" * 0x8000 + b"\r\n8001\r\n" + b"b" * 0x8001)
        assert answer(sock).startswith(b"HTTP/1.1 413")
    assert rejected == ["body_bytes"]


def test_a_body_not_complete_by_its_deadline_is_answered_408_and_counted(
        server: Callable[..., tuple[int, list[str]]]) -> None:
    """A body that stops short of its declared length, the client still connected, is answered 408 once the body
    deadline passes, and counted as a deadline."""
    port, rejected = server(body_timeout=0.3)
    with connect(port) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: s\r\nContent-Length: 10\r\n\r\nabc")
        assert answer(sock).startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert rejected == ["deadline"]


def test_a_malformed_chunked_body_is_answered_400_and_counted(server: Callable[..., tuple[int, list[str]]],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A chunked body whose size line is not hexadecimal is answered 400 and counted as malformed, like a malformed
    head, not logged as a failure of the server."""
    port, rejected = server()
    with connect(port) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: s\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n")
        assert answer(sock).startswith(b"HTTP/1.1 400")
    assert rejected == ["malformed"]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("head", [b"Content-Length: 10", b"Transfer-Encoding: chunked"])
def test_a_body_cut_short_by_the_client_is_closed_quietly(server: Callable[..., tuple[int, list[str]]],
                                                          caplog: pytest.LogCaptureFixture, head: bytes) -> None:
    """A client that hangs up in the middle of its body (fewer bytes than declared, or no last chunk) is closed
    without an answer, a refusal or an error in the log: nobody is left to answer."""
    port, rejected = server()
    with connect(port) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: s\r\n" + head + b"\r\n\r\n5\r\nab")
        sock.shutdown(socket.SHUT_WR)
        assert answer(sock) == b""  # the server has closed it: whatever it logs about it, it has logged
    assert rejected == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("line", [b"CONNECT 127.0.0.1:80 HTTP/1.1", b"OPTIONS * HTTP/1.1"])
def test_connect_and_the_server_wide_target_are_answered_405(server: Callable[..., tuple[int, list[str]]],
                                                            line: bytes) -> None:
    """No resource answers CONNECT host:port or OPTIONS *: 405 (with an empty Allow), not 404, and never a tunnel."""
    port, _ = server()
    with connect(port) as sock:
        sock.sendall(line + b"\r\nHost: s\r\nConnection: close\r\n\r\n")
        head = answer(sock).split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 405") and b"\r\nallow: \r\n" in head + b"\r\n", head


def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout(
        server: Callable[..., tuple[int, list[str]]]) -> None:
    """After an answer, a kept-alive connection with nothing more to say is closed once the idle timeout passes,
    without counting it as a refusal."""
    port, rejected = server(idle_timeout=0.3)
    sock = connect(port)
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\n\r\n")
    assert readable(sock, 5) and sock.recv(65536).startswith(b"HTTP/1.1 200")
    wait_until(lambda: closed_by_server(sock), timeout=5, what="the idle connection closed")
    assert rejected == []


def test_a_client_that_does_not_read_its_answer_is_cut_off(reliability: Reliability) -> None:
    """A client that asks for a large answer and never reads it is disconnected at the write deadline, counted."""

    async def large(request: HttpRequest) -> Response:
        return Response(200, b"x" * 64 * 1024 * 1024)

    rejected: list[str] = []
    running = serve(Listen("127.0.0.1", 0), large, Bounds(write_timeout=0.5), rejected.append)
    try:
        sock = connect(running.server_port)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(REQUEST)
        wait_until(lambda: rejected == ["write_deadline"], timeout=10, what="the write deadline")
    finally:
        running.server_close()
    reliability("HTTP server", "a client that asks for an answer and never reads it",
                "disconnected at the 10 s write deadline, counted")


class _OutOfDescriptors(socket.socket):
    """A listener whose accept() fails as it does when the process has no descriptor left."""

    attempts = 0

    def accept(self) -> tuple[socket.socket, Any]:
        type(self).attempts += 1
        raise OSError(errno.EMFILE, "Too many open files")


def test_a_failing_accept_is_retried_and_logged_once_not_at_every_retry(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """While accept() keeps failing (out of descriptors), the server goes on trying and says so in one warning,
    not in one line per retry."""

    def listener(listen: Listen) -> socket.socket:
        sock = _OutOfDescriptors(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((listen.host, listen.port))
        sock.listen()
        sock.setblocking(False)
        return sock

    monkeypatch.setattr(http_server, "_listener", listener)
    monkeypatch.setattr(_OutOfDescriptors, "attempts", 0)
    running = serve(Listen("127.0.0.1", 0), hello)
    try:
        wait_until(lambda: _OutOfDescriptors.attempts >= 5, timeout=10, what="five attempts to accept")
    finally:
        running.server_close()
    warned = [r for r in caplog.records if r.getMessage().startswith("HTTP accept failed")]
    assert len(warned) == 1, [r.getMessage() for r in warned]


def voluntary_switches(native_id: int) -> int:
    """How many times the thread has gone to sleep and been woken since it started (Linux)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def test_the_idle_server_thread_sleeps_until_a_connection_arrives(
        server: Callable[..., tuple[int, list[str]]]) -> None:
    """With nobody connected, the server's thread (an asyncio loop) is not woken at all over a second, and it
    still answers the next connection."""
    before = {thread.ident for thread in threading.enumerate()}
    port, _ = server()
    [loop] = [t for t in threading.enumerate() if t.name == "http" and t.ident not in before]
    with connect(port) as first:  # served once: the loop is running and back in its wait
        first.sendall(REQUEST)
        assert answer(first).startswith(b"HTTP/1.1 200")
    assert loop.native_id is not None
    switches = voluntary_switches(loop.native_id)
    threading.Event().wait(1.0)  # the observation window itself, not a wait for anything to settle
    assert voluntary_switches(loop.native_id) - switches <= 1
    with connect(port) as second:
        second.sendall(REQUEST)
        assert answer(second).startswith(b"HTTP/1.1 200")


def test_shutdown_of_an_idle_server_returns_and_ends_its_thread() -> None:
    """shutdown() stops the loop, which waits without a timeout, and returns once it has stopped; the port is
    then closed."""
    before = {thread.ident for thread in threading.enumerate()}
    served = serve(Listen("127.0.0.1", 0), hello)
    port = int(served.server_port)
    [loop] = [t for t in threading.enumerate() if t.name == "http" and t.ident not in before]
    stopper = threading.Thread(target=served.shutdown)
    stopper.start()
    stopper.join(5)
    assert not stopper.is_alive(), "shutdown() did not return"
    loop.join(5)
    assert not loop.is_alive()
    served.server_close()
    with pytest.raises(ConnectionRefusedError):
        connect(port)


entered = threading.Event()  # set by _swallows_one_cancel once it is called


async def _swallows_one_cancel(request: HttpRequest) -> Response:
    """A handler that loses the first cancellation, as ``asyncio.wait_for`` can before Python 3.12."""
    entered.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await asyncio.sleep(3600)
    return Response(200, b"late")



def test_shutdown_returns_when_a_conversation_lost_its_cancellation() -> None:
    """A task that did not honour the stop's cancellation is cancelled again: shutdown() still returns, the thread
    ends, and the client's connection is closed rather than served on."""
    entered.clear()
    served = serve(Listen("127.0.0.1", 0), _swallows_one_cancel)
    with connect(int(served.server_port)) as client:
        client.sendall(REQUEST)
        assert entered.wait(10), "the handler was never called"
        stopper = threading.Thread(target=served.shutdown)
        stopper.start()
        stopper.join(10)
        assert not stopper.is_alive(), "shutdown() did not return"
        client.settimeout(10)
        assert client.recv(1024) == b""
    served.server_close()


class _Up:
    healthy = True
    ready = False


@pytest.fixture
def sidecar_app() -> Iterator[int]:
    """The sidecar's own endpoints (make_http_app) in its own server, with one gauge; returns the port."""
    registry = CollectorRegistry()
    Gauge("hostile_probe", "a gauge", registry=registry).set(1)
    running = serve(Listen("127.0.0.1", 0), make_http_app(registry, _Up()))
    yield int(running.server_port)
    running.server_close()


def fetch(port: int, method: str, path: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request(method, path, headers=headers or {})
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz", "/", "/nowhere"])
def test_head_answers_like_get_without_a_body(sidecar_app: int, path: str) -> None:
    """HEAD gets GET's status and headers, the body's Content-Length included, and no body (prometheus-client's
    own app answers HEAD /metrics with 405)."""
    get, head = fetch(sidecar_app, "GET", path), fetch(sidecar_app, "HEAD", path)
    assert head.status == get.status
    assert head.getheader("Content-Type") == get.getheader("Content-Type")
    assert head.getheader("Content-Length") == get.getheader("Content-Length") is not None
    with socket.create_connection(("127.0.0.1", sidecar_app), timeout=5) as sock:  # http.client skips a HEAD body
        sock.sendall(f"HEAD {path} HTTP/1.0\r\nHost: sidecar\r\n\r\n".encode())
        raw = answer(sock)
    assert raw.endswith(b"\r\n\r\n"), raw


@pytest.mark.parametrize(("accept_encoding", "gzipped"), [
    ("gzip", True), ("gzip;q=0.5", True), ("identity, GZIP ; q=1", True), ("gzip;q=0", False),
    ("gzip; q=0.000", False), ("gzip;q=nonsense", False), ("deflate", False), ("", False)])
def test_gzip_only_when_asked_for_with_a_quality_above_zero(sidecar_app: int, accept_encoding: str,
                                                            gzipped: bool) -> None:
    """Accept-Encoding: gzip;q=0 means "not gzip" (RFC 9110 12.5.3); a positive quality means gzip."""
    response = fetch(sidecar_app, "GET", "/metrics", {"Accept-Encoding": accept_encoding})
    assert response.status == 200
    assert (response.getheader("Content-Encoding") == "gzip") is gzipped


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz", "/"])
@pytest.mark.parametrize("method", ["POST", "DELETE", "PUT", "TRACE", "OPTIONS", "FROB"])
def test_pages_answer_get_and_head_only(sidecar_app: int, path: str, method: str) -> None:
    """Every page answers 405 with ``Allow: GET, HEAD`` to any other method, /metrics and the rest alike."""
    response = fetch(sidecar_app, method, path)
    assert response.status == 405
    assert response.getheader("Allow") == "GET, HEAD"


def test_metrics_name_selects_families(sidecar_app: int) -> None:
    """``/metrics?name[]=N`` serves only the family N, as prometheus-client's own app does."""
    connection = http.client.HTTPConnection("127.0.0.1", sidecar_app, timeout=5)
    connection.request("GET", "/metrics?name[]=hostile_probe")
    body = connection.getresponse().read()
    assert body == b"# HELP hostile_probe a gauge\n# TYPE hostile_probe gauge\nhostile_probe 1.0\n"
    connection.close()


def test_refusals_are_counted_by_reason_on_the_registry() -> None:
    """``<namespace>_http_rejected_total{reason}`` shows every reason from the start and counts each refusal."""
    registry = CollectorRegistry()
    count = http_server.rejection_counter(registry, "azure_scheduled_events")
    assert registry.get_sample_value("azure_scheduled_events_http_rejected_total", {"reason": "header_bytes"}) == 0
    count("header_bytes")
    assert registry.get_sample_value("azure_scheduled_events_http_rejected_total", {"reason": "header_bytes"}) == 1
    assert {s.labels["reason"] for m in registry.collect() for s in m.samples} == set(http_server.REASONS)


@pytest.fixture
def fleet_app() -> Iterator[int]:
    """The fleet's own endpoints (fleet.main.make_http_app) with an empty fleet, healthy, not ready."""
    from se_exporter.fleet.main import make_http_app as fleet_http_app  # noqa: PLC0415 - brings the Azure SDKs
    from se_exporter.fleet.vms import Fleet  # noqa: PLC0415

    registry = CollectorRegistry()
    Gauge("fleet_probe", "a gauge", registry=registry).set(1)
    service = SimpleNamespace(healthy=True, ready=False, storage_problem=None)
    running = serve(Listen("127.0.0.1", 0), fleet_http_app(registry, [Fleet()], [service]))  # type: ignore[list-item]
    yield int(running.server_port)
    running.server_close()


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz", "/"])
def test_the_fleet_pages_answer_get_and_head_only(fleet_app: int, path: str) -> None:
    """The fleet serves its pages as the sidecar does: 405 with Allow to any method but GET and HEAD."""
    assert fetch(fleet_app, "GET", path).status in (200, 503)
    response = fetch(fleet_app, "DELETE", path)
    assert (response.status, response.getheader("Allow")) == (405, "GET, HEAD")


@pytest.mark.parametrize(("accept_encoding", "gzipped"), [("gzip", True), ("gzip;q=0", False), ("", False)])
def test_the_fleet_gzips_by_the_same_rule(fleet_app: int, accept_encoding: str, gzipped: bool) -> None:
    """The fleet's /metrics follows the sidecar's gzip rule: ``gzip;q=0`` means not gzip."""
    response = fetch(fleet_app, "GET", "/metrics", {"Accept-Encoding": accept_encoding})
    assert (response.getheader("Content-Encoding") == "gzip") is gzipped
    assert fetch(fleet_app, "GET", "/readyz").status == 503


def test_metrics_chunks_are_sent_whole_gzipped_or_not() -> None:
    """A body given as chunks (the fleet's) is sent as their concatenation, and gzipped as one stream that a
    gzip reader turns back into exactly that."""
    chunks = [b"# HELP a x\n", b"", b"a 1.0\n" * 10_000, b"b 2.0\n"]
    plain = http_server.metrics(HttpRequest("GET", "/metrics", ""), chunks)
    zipped = http_server.metrics(HttpRequest("GET", "/metrics", "", (("accept-encoding", "gzip"),)), chunks)
    assert b"".join(plain.stream) == b"".join(chunks) and plain.size == len(b"".join(chunks))
    assert all(any(piece is chunk for chunk in chunks) for piece in plain.stream)  # sent as they are, not copied
    assert dict(zipped.headers)["Content-Encoding"] == "gzip"
    assert gzip.decompress(zipped.body) == b"".join(chunks)
    assert len(zipped.body) < plain.size // 10


class _Written:
    """A stream writer that records each write (what ``_answer`` hands the transport)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    async def drain(self) -> None:
        return None


@pytest.mark.parametrize(("size", "writes"), [(5, 1), (http_connection.JOIN_BELOW, 1),
                                              (http_connection.JOIN_BELOW + 1, 2)])
def test_a_small_answer_leaves_in_one_write_and_a_large_body_is_not_copied_to_join_it(size: int,
                                                                                        writes: int) -> None:
    """Head and body written apart make a keep-alive client (Prometheus, http.client) wait for a delayed ACK,
    about 40 ms per request; a large body is sent after its head as it is rather than copied into one buffer."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\n\r\n")
    conn.next_event()
    written = _Written()
    body = b"x" * size
    limits = http_connection.Limits(Bounds(), lambda reason: None)
    asyncio.run(http_connection._answer(conn, written, Response(200, body), False, 5.0, limits))  # type: ignore[arg-type]
    assert len(written.writes) == writes
    assert b"".join(written.writes).endswith(b"\r\n\r\n" + body)


def test_a_streamed_body_goes_out_piece_by_piece_as_the_client_reads_and_arrives_whole(
        reliability: Reliability) -> None:
    """A body given as pieces (the fleet's /metrics: tens of MB) is written one piece at a time, each once the last
    has left the transport's buffer, so the server never holds a second whole copy of it; the client gets it
    whole, framed by its Content-Length, and the connection serves the next request."""
    pieces = tuple(bytes([65 + n % 26]) * 300_000 for n in range(40))  # 12 MB

    async def streamed(request: HttpRequest) -> Response:
        return Response(200, stream=pieces)

    rejected: list[str] = []
    running = serve(Listen("127.0.0.1", 0), streamed, Bounds(write_timeout=30), rejected.append)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", running.server_port, timeout=30)
        for _ in range(2):
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            assert int(response.getheader("Content-Length")) == 12_000_000
            assert response.read() == b"".join(pieces)
        connection.close()
    finally:
        running.server_close()
    assert rejected == []
    reliability("HTTP server", "a large /metrics body (the fleet's, tens of MB)",
                "sent piece by piece as the client reads, never copied whole; arrives whole")


def test_the_write_deadline_covers_a_streamed_answer_whole_not_each_piece() -> None:
    """A client reading a streamed answer slowly, each piece within the write timeout but the whole past it, is
    cut off at the deadline of the whole answer (one per piece would let it hold the connection for minutes)."""
    pieces = tuple(b"x" * 65_536 for _ in range(200))
    rejected: list[str] = []

    async def streamed(request: HttpRequest) -> Response:
        return Response(200, stream=pieces)

    running = serve(Listen("127.0.0.1", 0), streamed, Bounds(write_timeout=1.0), rejected.append)
    try:
        sock = connect(running.server_port)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(REQUEST)
        deadline = time.monotonic() + 20
        while not rejected and time.monotonic() < deadline:  # a drip: 16 KB every 0.2 s, each piece within 1 s
            if readable(sock, 0) and not sock.recv(16_384):
                break
            time.sleep(0.2)  # the client's pace: what is tested, not a wait for a condition
        wait_until(lambda: rejected == ["write_deadline"], timeout=10, what="the write deadline")
    finally:
        running.server_close()


def test_a_joined_part_is_made_a_slice_at_a_time_and_sent_whole() -> None:
    """A Joined part says its size at once and makes its bytes a slice of items at a time as they go out: what a
    scrape holds while its client reads is the list of items, not a copy of the text."""
    items = [f"line {n}".encode() for n in range(10)]
    joined = http_pages.Joined(b"\n", items, 4)
    assert len(joined) == len(b"\n".join(items))
    assert list(joined) == [b"\n".join(items[:4]), b"\n", b"\n".join(items[4:8]), b"\n", b"\n".join(items[8:])]
    assert len(http_pages.Joined(b"\n", [], 4)) == 0 and list(http_pages.Joined(b"\n", [], 4)) == []
    answer = http_server.metrics(HttpRequest("GET", "/metrics", ""), [b"# head\n", joined, b"\n# tail\n"])
    assert answer.size == len(b"# head\n" + b"\n".join(items) + b"\n# tail\n")
    assert b"".join(http_pages.pieces(answer.stream)) == b"# head\n" + b"\n".join(items) + b"\n# tail\n"
    zipped = http_server.metrics(HttpRequest("GET", "/metrics", "", (("accept-encoding", "gzip"),)),
                                 [b"# head\n", joined, b"\n# tail\n"])
    assert gzip.decompress(zipped.body) == b"# head\n" + b"\n".join(items) + b"\n# tail\n"


@pytest.fixture
def simulator_app() -> Iterator[int]:
    """The IMDS simulator's server (the demo scenario); returns the port."""
    running = start_simulator(Simulator(scenarios.load("demo")))
    yield int(running.server_port)
    running.server_close()


def until_closed(sock: socket.socket, timeout: float = 5.0) -> tuple[bytes, bool]:
    """What the server sends, and whether it closed the connection within ``timeout``."""
    chunks, deadline = [], time.monotonic() + timeout
    while readable(sock, max(0.0, deadline - time.monotonic())):
        chunk = sock.recv(65536)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
    return b"".join(chunks), False


@pytest.mark.parametrize("app", ["sidecar_app", "simulator_app"])
@pytest.mark.parametrize(("length", "answers"), [(b"Content-Length: 4\r\n", 1), (b"", 2)])
def test_a_request_framed_both_ways_is_answered_and_its_connection_closed(
        app: str, length: bytes, answers: int, request: pytest.FixtureRequest) -> None:
    """A request carrying both Content-Length and Transfer-Encoding: chunked is answered (its body read as chunked)
    with Connection: close, and the connection closed: what follows it is never served as a second request (RFC
    9112 section 6.1), on the sidecar's server and the simulator's. Chunked alone keeps the connection."""
    port = request.getfixturevalue(app)
    with connect(port) as sock:
        sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: s\r\n" + length + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                     b"GET /healthz HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n")
        received, closed = until_closed(sock)
    assert closed and received.count(b"HTTP/1.1 ") == answers, received[:400]
    assert (b"\r\nconnection: close\r\n" in received.lower().split(b"\r\n\r\n")[0] + b"\r\n") == (answers == 1)


def raw_get(port: int, target: bytes, headers: bytes = b"") -> tuple[bytes, bytes]:
    """The status line and body of one GET of ``target`` as sent, over a raw socket."""
    with connect(port) as sock:
        sock.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: s\r\n" + headers + b"Connection: close\r\n\r\n")
        head, _, body = answer(sock).partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], body


@pytest.mark.parametrize("path", [b"/metrics", b"/healthz", b"/", b"/nowhere", b"/metrics?name[]=hostile_probe"])
def test_an_absolute_form_target_is_routed_by_its_path(sidecar_app: int, path: bytes) -> None:
    """GET http://host/metrics (what a client sends to a proxy; RFC 9112 section 3.2.2: a server must accept it) is
    answered as GET /metrics, whatever the scheme's case, the host and the port."""
    for prefix in (b"http://sidecar", b"HTTP://Sidecar:10169", b"https://[::1]:443"):
        absolute = prefix + (path if path != b"/" else b"")  # "http://host" alone names "/"
        assert raw_get(sidecar_app, absolute) == raw_get(sidecar_app, path), absolute


def test_the_simulator_routes_an_absolute_form_target_by_its_path(simulator_app: int) -> None:
    """The simulator's Scheduled Events document answers GET http://<imds>/metadata/scheduledevents as it answers
    the origin form."""
    query = b"/metadata/scheduledevents?api-version=2020-07-01"
    status, body = raw_get(simulator_app, b"http://127.0.0.1" + query, b"Metadata: true\r\n")
    assert status == raw_get(simulator_app, query, b"Metadata: true\r\n")[0] == b"HTTP/1.1 200 OK"
    assert "Events" in json.loads(body)
