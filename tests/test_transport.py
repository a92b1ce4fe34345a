"""The http.client transport against a scripted HTTP/1.1 server on loopback: reuse, stale connections, failures."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from se_exporter.transport import KeepAliveTransport

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n"
CLOSE = object()  # close the connection after this answer
HANG = object()  # never answer this request


@dataclass
class ScriptedServer:
    """Answers requests in order from ``script``: bytes to send, optionally followed by CLOSE; HANG never answers."""

    script: list[object]
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):  # the client closed or reset the connection, as several tests do
            self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                self.requests.append(head)
                if not self.script:
                    return
                step = self.script.pop(0)
                if step is HANG:
                    self._closed.wait()  # until the test is over
                    return
                assert isinstance(step, bytes)
                conn.sendall(step)
                if self.script and self.script[0] is CLOSE:
                    self.script.pop(0)
                    return

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for conn in self._open:
            conn.close()


ServerFactory = Callable[[list[object]], ScriptedServer]


@pytest.fixture
def server() -> Iterator[ServerFactory]:
    servers: list[ScriptedServer] = []

    def make(script: list[object]) -> ScriptedServer:
        servers.append(ScriptedServer(script))
        return servers[-1]

    yield make
    for made in servers:
        made.close()


@pytest.fixture
def transport() -> Iterator[KeepAliveTransport]:
    made = KeepAliveTransport()
    yield made
    made.close()


def get(transport: KeepAliveTransport, url: str, timeout: float = 2.0) -> httpx.Response:
    response = transport.handle_request(httpx.Request("GET", url, headers={"Metadata": "true"},
                                                      extensions={"timeout": httpx.Timeout(timeout).as_dict()}))
    response.read()
    return response


def test_a_kept_alive_connection_is_reused(server: ServerFactory, transport: KeepAliveTransport) -> None:
    """Two GETs, one TCP connection; the request carries Host and Metadata and asks for no compression."""
    peer = server([OK, CHUNKED])
    assert get(transport, peer.url + "/a?x=1").content == b"{}"
    assert get(transport, peer.url + "/b").content == b'{"a":1}'  # chunked, read to its end
    assert peer.connections == 1
    first = peer.requests[0].decode()
    assert first.startswith("GET /a?x=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{peer.port}" in first and "Metadata: true" in first
    assert "Accept-Encoding" not in first


def test_a_connection_the_server_closed_while_idle_is_retried_once(server: ServerFactory,
                                                                   transport: KeepAliveTransport) -> None:
    """The server drops the idle connection between polls; the next GET goes out on a new one and succeeds."""
    peer = server([OK, CLOSE, OK])
    get(transport, peer.url)
    assert get(transport, peer.url).status_code == 200
    assert peer.connections == 2


def test_a_new_connection_closed_without_an_answer_is_an_error(server: ServerFactory,
                                                               transport: KeepAliveTransport) -> None:
    """No retry on a fresh connection: a server that hangs up without answering is reported, not hidden."""
    peer = server([b"", CLOSE])
    with pytest.raises(httpx.RemoteProtocolError, match="RemoteDisconnected"):
        get(transport, peer.url)
    assert peer.connections == 1


def test_a_read_timeout_is_raised_and_the_connection_is_not_reused(server: ServerFactory,
                                                                   transport: KeepAliveTransport) -> None:
    peer = server([HANG, OK])
    with pytest.raises(httpx.ReadTimeout):
        get(transport, peer.url, timeout=0.2)
    assert get(transport, peer.url).status_code == 200
    assert peer.connections == 2


def test_a_refused_connection_is_a_connect_error(transport: KeepAliveTransport) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(httpx.ConnectError):
            get(transport, f"http://127.0.0.1:{port}/")


def test_a_body_not_read_to_its_end_closes_the_connection(server: ServerFactory, transport: KeepAliveTransport) -> None:
    """Bytes left unread would be taken for the next answer: such a connection is closed, not pooled."""
    long = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000
    peer = server([long, OK])
    response = transport.handle_request(httpx.Request("GET", peer.url, extensions={"timeout": {"read": 2.0}}))
    next(response.iter_raw())
    response.close()
    assert get(transport, peer.url).content == b"{}"
    assert peer.connections == 2


def test_connection_close_is_honoured(server: ServerFactory, transport: KeepAliveTransport) -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    peer = server([closing, CLOSE, OK])
    get(transport, peer.url)
    assert get(transport, peer.url).content == b"{}"
    assert peer.connections == 2


def test_a_redirect_is_returned_not_followed(server: ServerFactory, transport: KeepAliveTransport) -> None:
    peer = server([b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/x\r\nContent-Length: 0\r\n\r\n"])
    response = get(transport, peer.url)
    assert (response.status_code, response.headers["location"], response.reason_phrase) == (
        302, "http://127.0.0.1:9/x", "Found")
    assert len(peer.requests) == 1


def test_only_get_is_sent(server: ServerFactory, transport: KeepAliveTransport) -> None:
    """Read-only by construction: any other method is refused before a connection is even opened."""
    peer = server([OK])
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        with pytest.raises(httpx.UnsupportedProtocol, match="GET only"):
            transport.handle_request(httpx.Request(method, peer.url, content=b"{}"))
    assert peer.connections == 0


def test_proxy_variables_are_ignored(server: ServerFactory, monkeypatch: pytest.MonkeyPatch,
                                     transport: KeepAliveTransport) -> None:
    """With every proxy variable pointing at a trap, the request still goes straight to the server."""
    trap = server([])
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, trap.url)
    peer = server([OK])
    assert get(transport, peer.url).status_code == 200
    assert (peer.connections, trap.connections) == (1, 0)


def test_a_malformed_status_line_is_a_protocol_error(server: ServerFactory, transport: KeepAliveTransport) -> None:
    peer = server([b"NONSENSE\r\n\r\n"])
    with pytest.raises(httpx.RemoteProtocolError):
        get(transport, peer.url)
