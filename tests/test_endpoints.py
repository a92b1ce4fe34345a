"""The HTTP server's bounds: a client cannot hold a thread for ever, nor exhaust threads, and a burst of
scrapers is queued by the kernel rather than refused."""

from __future__ import annotations

import contextlib
import http.client
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge

from se_exporter.endpoints import make_http_app, serve
from se_exporter.options import Listen
from tests.conftest import Reliability
from tests.helpers import wait_until

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\n\r\n"


def hello(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"up 1\n"]


@pytest.fixture
def server() -> Iterator[Callable[..., int]]:
    """Start the sidecar's HTTP server with given bounds on a free loopback port; returns the port."""
    started: list[Any] = []

    def make(**bounds: Any) -> int:
        started.append(serve(Listen("127.0.0.1", 0), hello, **bounds))
        return int(started[-1].server_port)

    yield make
    for item in started:
        item.shutdown()
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


def refused_503(sock: socket.socket) -> bool:
    """The server answered this connection 503 (peeked: the answer stays to be read)."""
    return readable(sock, 0) and sock.recv(64, socket.MSG_PEEK).startswith(b"HTTP/1.0 503")


def closed_by_server(sock: socket.socket) -> bool:
    if not readable(sock, 0):
        return False
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_request_dripped_byte_by_byte_is_cut_off_at_the_deadline(server: Callable[..., int],
                                                                   reliability: Reliability) -> None:
    """A client that sends its headers one byte every 0.1 s (each read well inside any per-read timeout) is
    disconnected once the request deadline has passed, instead of holding its thread for ever."""
    port = server(request_deadline=0.5)
    sock = connect(port)
    headers = iter(b"GET /metrics HTTP/1.1\r\n" + b"X-Drip: " + b"a" * 10_000)
    deadline = time.monotonic() + 10
    closed = False
    while time.monotonic() < deadline and not closed:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.send(bytes([next(headers)]))
        closed = readable(sock, 0.1) and closed_by_server(sock)  # 0.1 s: the drip's pace
    sock.close()
    assert closed, "the server kept a dripping client connected"
    with connect(port) as fresh:
        fresh.sendall(REQUEST)
        assert answer(fresh).startswith(b"HTTP/1.0 200")
    reliability("HTTP server", "request headers dripped one byte every 0.1 s",
                "connection closed at the 10 s request deadline; other scrapes served meanwhile")


def test_connections_past_the_limit_are_answered_503_and_threads_stay_bounded(server: Callable[..., int],
                                                                              reliability: Reliability) -> None:
    """100 clients holding partial headers occupy at most the connection limit in threads; past it, only the first
    waits (1 s) for a thread and the rest are answered 503 at once (waiting 1 s each made a flood of them delay a
    /healthz probe by minutes); when the holders go, scrapes are served again."""
    before = threading.active_count()
    port = server(max_connections=4, request_deadline=30, slot_wait=1.0)
    holders = []
    for _ in range(100):
        sock = connect(port)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        holders.append(sock)
    wait_until(lambda: sum(refused_503(s) for s in holders) == 96, timeout=10,
               what="every holder past the limit refused")
    with connect(port, timeout=0.9) as late:  # less than one slot wait: refused at once, not after a queue of them
        late.sendall(REQUEST)
        refused = answer(late)
    assert refused.startswith(b"HTTP/1.0 503") and b"too many connections" in refused
    assert threading.active_count() <= before + 1 + 4  # the accept loop and at most four handlers
    for sock in holders:
        sock.close()

    def served() -> bool:
        with connect(port) as fresh:
            fresh.sendall(REQUEST)
            return answer(fresh).startswith(b"HTTP/1.0 200")

    wait_until(served, what="scrapes served after the holders left")
    reliability("HTTP server", "100 connections holding partial headers",
                "at most 32 handler threads; the rest answered 503 at once; served again when they go")


def test_a_burst_of_scrapers_is_queued_by_the_kernel_while_all_threads_are_busy(server: Callable[..., int]) -> None:
    """With every handler thread busy, 200 more connections complete their TCP handshake at once (a listen
    backlog of 5 made most of them wait for SYN retransmissions, seconds each) and are all answered."""
    port = server(max_connections=1, request_deadline=30, slot_wait=30)
    holder = connect(port)
    holder.sendall(b"GET /metrics HTTP/1.1\r\n")
    wait_until(lambda: threading.active_count() >= 2, what="the holder's thread")  # the slot is taken
    burst = [connect(port, timeout=0.5) for _ in range(200)]  # a dropped SYN is retried only after 1 s
    for sock in burst:
        sock.sendall(REQUEST)
    holder.close()
    for sock in burst:
        sock.settimeout(30)
        assert answer(sock).startswith(b"HTTP/1.0 200")
        sock.close()


def voluntary_switches(native_id: int) -> int:
    """How many times the thread has gone to sleep and been woken since it started (Linux)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def test_the_idle_server_thread_sleeps_until_a_connection_arrives(server: Callable[..., int]) -> None:
    """With nobody connecting, the accept loop's thread is not woken at all over a second (it used to wake 20
    times a second to look for shutdown()), and it still answers the next connection."""
    before = {thread.ident for thread in threading.enumerate()}
    port = server()
    [loop] = [t for t in threading.enumerate() if t.name == "http" and t.ident not in before]
    with connect(port) as first:  # served once: the loop is running and back in its wait
        first.sendall(REQUEST)
        assert answer(first).startswith(b"HTTP/1.0 200")
    assert loop.native_id is not None
    wait_until(lambda: threading.active_count() == len(before) + 1, what="the handler thread ended")
    switches = voluntary_switches(loop.native_id)
    threading.Event().wait(1.0)  # the observation window itself, not a wait for anything to settle
    assert voluntary_switches(loop.native_id) - switches <= 1
    with connect(port) as second:
        second.sendall(REQUEST)
        assert answer(second).startswith(b"HTTP/1.0 200")


def test_shutdown_of_an_idle_server_returns_and_ends_its_thread() -> None:
    """shutdown() wakes the accept loop, which waits without a timeout, and returns once it has stopped; the
    port is then closed."""
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
    running.shutdown()
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
