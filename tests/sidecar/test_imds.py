"""The IMDS client through the real transport against byte-level doubles on loopback: request shape, error
classification, limits."""

from __future__ import annotations

import email.utils
import json
import re
import tracemalloc
from collections.abc import Iterator

import httpx
import pytest

from se_exporter.core.errors import (
    ImdsConnectionError,
    ImdsHttpError,
    ImdsThrottled,
    ImdsTimeout,
    InvalidDocument,
)
from se_exporter.core.model import VmIdentity
from se_exporter.sidecar.imds import ImdsClient, parse_retry_after
from se_exporter.sidecar.transport import KeepAliveTransport
from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.faults import Fault
from se_exporter.simulator.server import Simulator, start
from tests.support.fakes import imds_http
from tests.support.fakes.http_server import HANG, ScriptedServer
from tests.support.fakes.imds_http import scripted_imds


@pytest.fixture(autouse=True)
def _close_servers() -> Iterator[None]:
    yield
    imds_http.close_all()


def head(server: ScriptedServer, index: int = 0) -> tuple[str, dict[str, str]]:
    """The request line and the headers (names lower-cased) of the ``index``-th request the server read."""
    line, *fields = server.requests[index].decode("latin-1").split("\r\n")
    return line, {name.lower(): value.strip() for name, _, value in (f.partition(":") for f in fields)}


def test_request_shape() -> None:
    """GET /metadata/scheduledevents?api-version=... with Metadata: true, and the body returned as bytes."""
    imds, server, _ = scripted_imds([httpx.Response(200, content=b'{"DocumentIncarnation":1,"Events":[]}')])
    assert imds.scheduled_events() == b'{"DocumentIncarnation":1,"Events":[]}'
    line, headers = head(server)
    assert line == "GET /metadata/scheduledevents?api-version=2020-07-01 HTTP/1.1"
    assert headers["metadata"] == "true"
    assert headers["host"] == f"127.0.0.1:{server.port}"


def test_the_first_call_waits_longer_than_the_rest() -> None:
    """Until IMDS answers once, the read timeout is the first-call timeout (the service may be switching on)."""
    imds, _, spy = scripted_imds([httpx.Response(200, content=b"{}")] * 2)
    imds.scheduled_events()
    imds.scheduled_events()
    assert [timeout for _, timeout, _ in spy.calls] == [120.0, 2.0]


def test_the_timeout_bounds_the_whole_request() -> None:
    """Each request asks the transport for one deadline over connect, headers and body: the same timeout as its
    steps (the first-call timeout for the first call), so a drip-feeding server cannot hold a poll past it."""
    imds, _, spy = scripted_imds([httpx.Response(200, content=b"{}")] * 3)
    imds.scheduled_events()
    imds.scheduled_events()
    imds.compute()
    assert [total for _, _, total in spy.calls] == [120.0, 2.0, 2.0]


def test_identity_encoding_is_asked_for() -> None:
    """Without Accept-Encoding any coding is acceptable (RFC 9110), so the client asks for the bytes as they are."""
    imds, server, _ = scripted_imds([httpx.Response(200, content=b"{}")])
    imds.scheduled_events()
    assert head(server)[1]["accept-encoding"] == "identity"


def unread_body(headers: str) -> list[object]:
    """An answer with ``headers`` whose body never comes: reading it would end in a timeout, not in a refusal."""
    return [b"HTTP/1.1 200 OK\r\n" + headers.encode() + b"\r\n\r\n", HANG]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "GZIP ", "x-gzip, identity"])
def test_a_compressed_body_is_refused_unread(encoding: str) -> None:
    """An answer compressed anyway is an invalid document, refused before a byte of its body is read or inflated
    (the README promises the exact bytes IMDS returned; a gzip bomb must cost nothing)."""
    imds, _, _ = scripted_imds(unread_body(f"Content-Encoding: {encoding}\r\nContent-Length: 999"), timeout=60.0,
                               first_call_timeout=60.0)
    with pytest.raises(InvalidDocument, match="encoded although identity was asked for"):
        imds.scheduled_events()


def test_identity_content_encoding_is_accepted() -> None:
    """'identity' is no coding at all: such a body is the document."""
    imds, _, _ = scripted_imds([httpx.Response(200, headers={"Content-Encoding": "identity"}, content=b"{}")])
    assert imds.scheduled_events() == b"{}"


def test_a_gzip_bomb_costs_no_memory() -> None:
    """The simulator's gzip fault inflating to 64 MB, through the real transport: refused, and the poll's peak
    Python allocation stays under 1 MB (the compressed body is not even read: the connection is dropped). Decoding
    it, as before, held the 64 MB."""
    sim = Simulator(scenarios.load("live-migration"))
    server = start(sim, "127.0.0.1", 0)
    transport = KeepAliveTransport()
    try:
        imds = ImdsClient(transport, server.url, "2020-07-01", timeout=10.0, first_call_timeout=10.0,
                          max_body_bytes=4 * 1024 * 1024)
        imds.scheduled_events()  # warm: the connection and the first-call allowance
        sim.inject(Fault("gzip", size=64 * 1024 * 1024, count=2))
        with pytest.raises(InvalidDocument):
            imds.scheduled_events()  # the simulator (in this process) compresses its 64 MB of blanks once, here
        tracemalloc.start()
        try:
            with pytest.raises(InvalidDocument, match="gzip-encoded"):
                imds.scheduled_events()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1024 * 1024, peak
        assert json.loads(imds.scheduled_events())["Events"] is not None  # and the next poll is a document again
    finally:
        transport.close()
        server.shutdown()
        server.server_close()


def test_a_failed_connection_keeps_the_first_call_timeout() -> None:
    """A connection error is not an answer: the next try still allows for the slow first call."""
    imds, _, spy = scripted_imds([httpx.RemoteProtocolError("not HTTP"), httpx.Response(200, content=b"{}")])
    with pytest.raises(ImdsConnectionError):
        imds.scheduled_events()
    imds.scheduled_events()
    assert [timeout for _, timeout, _ in spy.calls] == [120.0, 120.0]


@pytest.mark.parametrize(("response", "error", "outcome"), [
    (httpx.Response(429), ImdsThrottled, "throttled"),
    (httpx.Response(500), ImdsHttpError, "http_error"),
    (httpx.Response(503), ImdsHttpError, "http_error"),
    (httpx.Response(400, json={"error": "Bad request"}), ImdsHttpError, "http_error"),
    (httpx.Response(302, headers={"Location": "http://elsewhere/"}), ImdsHttpError, "http_error"),
])
def test_status_classification(response: httpx.Response, error: type[Exception], outcome: str) -> None:
    """Every non-200 status maps to one error class and one outcome label."""
    imds, _, _ = scripted_imds([response])
    with pytest.raises(error) as caught:
        imds.scheduled_events()
    assert caught.value.outcome == outcome  # type: ignore[attr-defined]


def test_no_answer_in_time_is_a_timeout() -> None:
    """A server that takes the request and never answers ends in ImdsTimeout at the timeout (the only wait here)."""
    imds, _, _ = scripted_imds([HANG], timeout=0.3, first_call_timeout=0.3)
    with pytest.raises(ImdsTimeout, match=re.escape("no complete answer within 0.3 s")):
        imds.scheduled_events()


def test_bytes_that_are_not_http_are_a_connection_error() -> None:
    """An answer that is not HTTP at all is told apart from a timeout: a connection error."""
    imds, _, _ = scripted_imds([httpx.RemoteProtocolError("not HTTP")])
    with pytest.raises(ImdsConnectionError, match="RemoteProtocolError"):
        imds.scheduled_events()


def test_a_refused_connection_is_a_connection_error() -> None:
    """Nothing listening on the port: a connection error, not a timeout."""
    imds, server, _ = scripted_imds([])
    server.close()
    with pytest.raises(ImdsConnectionError, match="ConnectError"):
        imds.scheduled_events()


def test_redirects_are_not_followed() -> None:
    """A 302 is reported, and the Location is never requested."""
    imds, server, _ = scripted_imds([httpx.Response(302, headers={"Location": "http://127.0.0.1:9/elsewhere"}),
                                     httpx.Response(200, content=b"{}")])
    with pytest.raises(ImdsHttpError, match=re.escape("redirect to http://127.0.0.1:9/elsewhere not followed")):
        imds.scheduled_events()
    assert [head(server, index)[0].split()[1] for index in range(len(server.requests))] == [
        "/metadata/scheduledevents?api-version=2020-07-01"]


def test_retry_after_is_carried_by_the_throttle_error() -> None:
    """429's Retry-After (seconds) reaches the poll loop."""
    imds, _, _ = scripted_imds([httpx.Response(429, headers={"Retry-After": "7"})])
    with pytest.raises(ImdsThrottled) as caught:
        imds.scheduled_events()
    assert caught.value.retry_after == 7.0


def test_parse_retry_after() -> None:
    """Delta-seconds and HTTP dates are both understood; garbage is None."""
    now = 1_700_000_000.0
    assert parse_retry_after("3", now) == 3.0
    assert parse_retry_after(email.utils.formatdate(now + 12, usegmt=True), now) == 12.0
    assert parse_retry_after(email.utils.formatdate(now - 12, usegmt=True), now) == 0.0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after(None, now) is None


def test_declared_oversized_body_is_rejected_unread() -> None:
    """A Content-Length beyond the cap is refused before any of the body is read."""
    imds, _, _ = scripted_imds(unread_body("Content-Length: 999999"), max_body_bytes=4096, timeout=60.0,
                               first_call_timeout=60.0)
    with pytest.raises(InvalidDocument, match="exceeds the 4096-byte cap"):
        imds.scheduled_events()


def test_streamed_oversized_body_is_cut_off() -> None:
    """Without Content-Length, reading stops once the cap is passed: 80 KB sent of an endless chunked body is
    refused at the 4 KB cap after the transport's first 64 KB read (reading on would wait until the timeout)."""
    chunks = b"".join(b"400\r\n" + b" " * 1024 + b"\r\n" for _ in range(80))
    imds, _, _ = scripted_imds([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks, HANG],
                               max_body_bytes=4096, timeout=60.0, first_call_timeout=60.0)
    with pytest.raises(InvalidDocument, match="cap"):
        imds.scheduled_events()


def test_compute_identity() -> None:
    """Compute metadata comes from /metadata/instance/compute?api-version=2021-02-01."""
    body = {"name": "WestNO_0", "vmId": "id", "vmScaleSetName": "", "location": "norwayeast",
            "resourceGroupName": "rg", "subscriptionId": "sub", "vmSize": "Standard_D2s_v5", "zone": "1"}
    imds, server, _ = scripted_imds([httpx.Response(200, json=body)])
    assert imds.compute() == VmIdentity(name="WestNO_0", vm_id="id", location="norwayeast", resource_group="rg",
                                        subscription_id="sub", vm_size="Standard_D2s_v5", zone="1")
    assert head(server)[0] == "GET /metadata/instance/compute?api-version=2021-02-01 HTTP/1.1"


@pytest.mark.parametrize("body", [{"name": 5, "vmId": ["x"], "location": None}, {"name": "vm", "vmId": {"a": 1}},
                                  {"name": "vm", "zone": 1}])
def test_compute_identity_of_the_wrong_types_is_an_invalid_answer(body: dict[str, object]) -> None:
    """Fields of the wrong type were taken silently as an empty identity, never read again: the answer is invalid
    (the identity watcher warns once and retries, as for any bad answer), naming the fields."""
    imds, _, _ = scripted_imds([httpx.Response(200, json=body)])
    with pytest.raises(InvalidDocument, match="fields that are not strings: ") as raised:
        imds.compute()
    assert set(str(raised.value).rsplit(": ", 1)[1].split(", ")) == {k for k, v in body.items() if type(v) is not str}


def test_compute_answering_does_not_end_the_first_call_allowance() -> None:
    """Only Scheduled Events answering ends the long first-call timeout; compute metadata says nothing about it."""
    imds, _, spy = scripted_imds([httpx.Response(200, json={"name": "vm"}),
                                  httpx.Response(200, json={"Events": []}), httpx.Response(200, json={"Events": []})])
    imds.compute()
    imds.scheduled_events()
    imds.scheduled_events()
    assert [(target.partition("?")[0], timeout) for target, timeout, _ in spy.calls] == [
        ("/metadata/instance/compute", 2.0), ("/metadata/scheduledevents", 120.0), ("/metadata/scheduledevents", 2.0)]
