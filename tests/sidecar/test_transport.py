"""The IMDS transport against a scripted HTTP/1.1 server on loopback: reuse, stale connections, failures,
and byte-level faults (truncation at every offset, drip feeds, chunk errors)."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from se_exporter.sidecar import transport as errors
from se_exporter.sidecar.transport import Answer, KeepAliveTransport
from tests.support.fakes.http_server import CLOSE, HANG, Drip, ScriptedServer

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n"
DOCUMENT = b'{"DocumentIncarnation":50,"Events":[{"EventId":"E1","EventStatus":"Scheduled"}]}'
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(DOCUMENT), DOCUMENT)
CHUNKED_DOCUMENT = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (DOCUMENT[:30], DOCUMENT[30:]))
                    + b"0\r\n\r\n")


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


@dataclass(frozen=True)
class Got:
    """A whole answer, read to its end."""

    status_code: int
    reason_phrase: str
    headers: dict[str, str]
    content: bytes


def opened(transport: KeepAliveTransport, url: str, timeout: float = 2.0, total: float | None = None) -> Answer:
    """The GET as ImdsClient sends it (``KeepAliveTransport.get``: origin, target, headers), its body still unread."""
    parts = urlsplit(url)
    origin = (parts.scheme, parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return transport.get(origin, target, [("Host", parts.netloc), ("Metadata", "true")], timeout, total)


def get(transport: KeepAliveTransport, url: str, timeout: float = 2.0, total: float | None = None) -> Got:
    answer = opened(transport, url, timeout, total)
    try:
        content = b"".join(answer)
    finally:
        answer.close()
    return Got(answer.status, answer.reason, {name.lower(): value for name, value in answer.headers}, content)


def test_a_kept_alive_connection_is_reused(server: ServerFactory, transport: KeepAliveTransport) -> None:
    """Two GETs, one TCP connection; the request carries Host and Metadata and nothing the caller did not set (no
    Accept-Encoding of http.client's own: ImdsClient asks for identity itself)."""
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
    with pytest.raises(errors.RemoteProtocolError, match="closed the connection without answering"):
        get(transport, peer.url)
    assert peer.connections == 1


def test_a_read_timeout_is_raised_and_the_connection_is_not_reused(server: ServerFactory,
                                                                   transport: KeepAliveTransport) -> None:
    peer = server([HANG, OK])
    with pytest.raises(errors.ReadTimeout):
        get(transport, peer.url, timeout=0.2)
    assert get(transport, peer.url).status_code == 200
    assert peer.connections == 2


def test_a_refused_connection_is_a_connect_error(transport: KeepAliveTransport) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(errors.ConnectError):
            get(transport, f"http://127.0.0.1:{port}/")


def test_a_body_not_read_to_its_end_closes_the_connection(server: ServerFactory, transport: KeepAliveTransport) -> None:
    """Bytes left unread would be taken for the next answer: such a connection is closed, not pooled."""
    long = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000
    peer = server([long, OK])
    answer = opened(transport, peer.url)
    next(iter(answer))
    answer.close()
    assert get(transport, peer.url).content == b"{}"
    assert peer.connections == 2


def test_connection_close_is_honoured(server: ServerFactory, transport: KeepAliveTransport) -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    peer = server([closing, CLOSE, OK])
    get(transport, peer.url)
    assert get(transport, peer.url).content == b"{}"
    assert peer.connections == 2


def test_an_http_1_0_answer_closes_its_connection(server: ServerFactory, transport: KeepAliveTransport) -> None:
    """HTTP/1.0 ends the connection after each answer: the next GET goes out on a new connection."""
    peer = server([b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", OK])
    get(transport, peer.url)
    assert get(transport, peer.url).content == b"{}"
    assert peer.connections == 2


def test_an_informational_answer_is_skipped_and_trailers_are_read(server: ServerFactory,
                                                                  transport: KeepAliveTransport) -> None:
    """A 100 Continue before the answer is passed over; a chunked body's trailers are read to their end, so the
    connection is reused."""
    answer = b"HTTP/1.1 100 Continue\r\n\r\n" + CHUNKED.replace(b"0\r\n\r\n", b"0\r\nExpires: 0\r\n\r\n")
    peer = server([answer, OK])
    got = get(transport, peer.url)
    assert (got.status_code, got.content) == (200, b'{"a":1}')
    assert get(transport, peer.url).content == b"{}"
    assert peer.connections == 1


def test_a_redirect_is_returned_not_followed(server: ServerFactory, transport: KeepAliveTransport) -> None:
    peer = server([b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/x\r\nContent-Length: 0\r\n\r\n"])
    response = get(transport, peer.url)
    assert (response.status_code, response.headers["location"], response.reason_phrase) == (
        302, "http://127.0.0.1:9/x", "Found")
    assert len(peer.requests) == 1


def test_only_get_can_be_sent() -> None:
    """Read-only by construction: the transport's one way to send a request is ``get``; there is no method to
    choose and no other entry point."""
    assert [name for name in dir(KeepAliveTransport) if not name.startswith("_")] == ["close", "get"]


def test_a_scheme_other_than_http_is_refused(transport: KeepAliveTransport) -> None:
    with pytest.raises(errors.UnsupportedProtocol, match="unsupported URL scheme 'ftp'"):
        transport.get(("ftp", "127.0.0.1", 21), "/", [], 1.0)


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
    with pytest.raises(errors.RemoteProtocolError):
        get(transport, peer.url)


def test_a_body_shorter_than_its_content_length_is_an_error() -> None:
    """The issue's example: Content-Length 100, 38 bytes of a valid document, then close: an error, not a document."""
    body = b'{"DocumentIncarnation":50,"Events":[]}'
    peer = ScriptedServer([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + body, CLOSE])
    transport = KeepAliveTransport()
    try:
        with pytest.raises(errors.RemoteProtocolError, match="body ended after 38 of its 100 bytes"):
            get(transport, peer.url)
    finally:
        transport.close()
        peer.close()


@pytest.mark.parametrize("answer", [ANSWER, CHUNKED_DOCUMENT], ids=["content-length", "chunked"])
def test_an_answer_cut_at_any_offset_is_never_a_whole_body(server: ServerFactory, transport: KeepAliveTransport,
                                                           answer: bytes) -> None:
    """Cut after every byte of the status line, headers and body, then closed: always a transport error, except
    a chunked answer cut after its last chunk's size (every byte of the body has arrived): then the whole body."""
    last_chunk = answer.rfind(b"0\r\n\r\n") + 1 if b"chunked" in answer else len(answer)
    script: list[object] = []
    for offset in range(len(answer)):
        script += [answer[:offset], CLOSE]
    peer = server(script)
    for offset in range(len(answer)):
        if offset < last_chunk:
            with pytest.raises(errors.TransportError):
                get(transport, peer.url)
        else:
            assert get(transport, peer.url).content == DOCUMENT, offset
    assert peer.connections == len(answer)


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{}\r\n0\r\n\r\n",
], ids=["bad first size", "bad later size", "size larger than the data"])
def test_chunk_errors_are_transport_errors(server: ServerFactory, transport: KeepAliveTransport,
                                           answer: bytes) -> None:
    """A chunk size that is not hexadecimal, or larger than what follows, ends the exchange with an error."""
    peer = server([answer, CLOSE])
    with pytest.raises(errors.TransportError):
        get(transport, peer.url, timeout=0.5)


@pytest.mark.parametrize("length", ["abc", "-1", "38, 100", "0x26"])
def test_a_content_length_that_is_not_one_number_is_an_error(server: ServerFactory, transport: KeepAliveTransport,
                                                             length: str) -> None:
    """Without a length we can trust, a cut body could not be told from a whole one: such an answer is refused."""
    peer = server([b"HTTP/1.1 200 OK\r\nContent-Length: %s\r\n\r\n%s" % (length.encode(), DOCUMENT), CLOSE])
    with pytest.raises(errors.RemoteProtocolError, match="is not one length"):
        get(transport, peer.url)


def test_two_different_content_lengths_are_an_error(server: ServerFactory, transport: KeepAliveTransport) -> None:
    """Two Content-Length headers that disagree (a smuggling classic) are refused, whichever comes first."""
    peer = server([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nContent-Length: 38\r\n\r\n" + DOCUMENT, CLOSE])
    with pytest.raises(errors.RemoteProtocolError, match="is not one length"):
        get(transport, peer.url)


@pytest.mark.parametrize("script", [
    [Drip(ANSWER, 0.05)],
    [Drip(DOCUMENT, 0.05, head=ANSWER[:ANSWER.index(b"\r\n\r\n") + 4])],
], ids=["whole answer dripped", "body dripped"])
def test_a_drip_feed_ends_at_the_total_timeout(server: ServerFactory, transport: KeepAliveTransport,
                                               script: list[object]) -> None:
    """One byte every 50 ms (each read well inside the 2 s read timeout) for seconds on end: the request still ends,
    as a timeout, once the 0.3 s total has passed, and the connection is not reused."""
    peer = server([*script, OK])
    started = time.monotonic()
    with pytest.raises(errors.ReadTimeout):
        get(transport, peer.url, timeout=2.0, total=0.3)
    assert time.monotonic() - started < 2.0  # not the 4+ s the drip would take, nor a 2 s read timeout
    assert get(transport, peer.url).content == b"{}"
    assert peer.connections == 2


def test_the_total_timeout_spans_the_retry_on_a_stale_connection(server: ServerFactory,
                                                                 transport: KeepAliveTransport) -> None:
    """The retry after a stale kept-alive connection gets what is left of the deadline, not a new one."""
    peer = server([OK, CLOSE, Drip(ANSWER, 0.05)])
    get(transport, peer.url)
    with pytest.raises(errors.ReadTimeout):
        get(transport, peer.url, total=0.3)
    assert peer.connections == 2


def test_without_a_total_timeout_a_slow_complete_answer_is_read(server: ServerFactory,
                                                                transport: KeepAliveTransport) -> None:
    """The deadline is opt-in per request: without it, only each read is bounded (httpx's meaning)."""
    peer = server([Drip(OK, 0.01)])
    assert get(transport, peer.url, timeout=1.0).content == b"{}"


def test_the_total_timeout_holds_over_tls(tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """https too: the deadline survives the TLS wrapping of the socket, and a dripped answer ends at it."""
    server_side, client_side = tls_contexts
    peer = ScriptedServer([OK, Drip(ANSWER, 0.05)], tls=server_side)
    transport = KeepAliveTransport(tls=client_side)
    try:
        url = peer.url.replace("http://", "https://")
        assert get(transport, url).content == b"{}"
        with pytest.raises(errors.ReadTimeout):
            get(transport, url, total=0.3)
    finally:
        transport.close()
        peer.close()
