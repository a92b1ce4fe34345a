"""The IMDS client against httpx.MockTransport: request shape, error classification, limits."""

from __future__ import annotations

import email.utils
import json
import re
import tracemalloc
from collections.abc import Callable, Iterator

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
from se_exporter.sidecar.imds import ImdsClient, make_transport, parse_retry_after
from se_exporter.sidecar.transport import TOTAL_TIMEOUT
from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.faults import Fault
from se_exporter.simulator.server import Simulator, start

Handler = Callable[[httpx.Request], httpx.Response]


def client(handler: Handler, max_body_bytes: int = 1024 * 1024) -> tuple[ImdsClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    return ImdsClient(httpx.MockTransport(record), "http://imds.test", "2020-07-01", timeout=2.0,
                      first_call_timeout=120.0, max_body_bytes=max_body_bytes), seen


def test_request_shape() -> None:
    """GET /metadata/scheduledevents?api-version=... with Metadata: true, and the body returned as bytes."""
    imds, seen = client(lambda r: httpx.Response(200, content=b'{"DocumentIncarnation":1,"Events":[]}'))
    assert imds.scheduled_events() == b'{"DocumentIncarnation":1,"Events":[]}'
    request = seen[0]
    assert request.method == "GET"
    assert request.url.path == "/metadata/scheduledevents"
    assert request.url.params["api-version"] == "2020-07-01"
    assert request.headers["Metadata"] == "true"


def test_the_first_call_waits_longer_than_the_rest() -> None:
    """Until IMDS answers once, the read timeout is the first-call timeout (the service may be switching on)."""
    imds, seen = client(lambda r: httpx.Response(200, content=b"{}"))
    imds.scheduled_events()
    imds.scheduled_events()
    assert [r.extensions["timeout"]["read"] for r in seen] == [120.0, 2.0]


def test_the_timeout_bounds_the_whole_request() -> None:
    """Each request asks the transport for one deadline over connect, headers and body: the same timeout as its
    steps (the first-call timeout for the first call), so a drip-feeding server cannot hold a poll past it."""
    imds, seen = client(lambda r: httpx.Response(200, content=b"{}"))
    imds.scheduled_events()
    imds.scheduled_events()
    imds.compute()
    assert [r.extensions[TOTAL_TIMEOUT] for r in seen] == [120.0, 2.0, 2.0]


def test_identity_encoding_is_asked_for() -> None:
    """Without Accept-Encoding any coding is acceptable (RFC 9110), so the client asks for the bytes as they are."""
    imds, seen = client(lambda r: httpx.Response(200, content=b"{}"))
    imds.scheduled_events()
    assert seen[0].headers["Accept-Encoding"] == "identity"


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "GZIP ", "x-gzip, identity"])
def test_a_compressed_body_is_refused_unread(encoding: str) -> None:
    """An answer compressed anyway is an invalid document, refused before a byte of its body is read or inflated
    (the README promises the exact bytes IMDS returned; a gzip bomb must cost nothing)."""
    def chunks() -> Iterator[bytes]:
        raise AssertionError("the body must not be read")
        yield b""  # pragma: no cover

    imds, _ = client(lambda r: httpx.Response(200, headers={"Content-Encoding": encoding}, content=chunks()))
    with pytest.raises(InvalidDocument, match="encoded although identity was asked for"):
        imds.scheduled_events()


def test_identity_content_encoding_is_accepted() -> None:
    """'identity' is no coding at all: such a body is the document."""
    imds, _ = client(lambda r: httpx.Response(200, headers={"Content-Encoding": "identity"}, content=b"{}"))
    assert imds.scheduled_events() == b"{}"


def test_a_gzip_bomb_costs_no_memory() -> None:
    """The simulator's gzip fault inflating to 64 MB, through the real transport: refused, and the poll's peak
    Python allocation stays under 1 MB (the compressed body is not even read: the connection is dropped). Decoding
    it, as before, held the 64 MB."""
    sim = Simulator(scenarios.load("live-migration"))
    server = start(sim, "127.0.0.1", 0)
    transport = make_transport()
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
    calls = iter([httpx.ConnectError("refused"), None])
    seen: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"]["read"])
        error = next(calls)
        if error is not None:
            raise error
        return httpx.Response(200, content=b"{}")

    imds, _ = client(handler)
    with pytest.raises(ImdsConnectionError):
        imds.scheduled_events()
    imds.scheduled_events()
    assert seen == [120.0, 120.0]


@pytest.mark.parametrize(("response", "error", "outcome"), [
    (httpx.Response(429), ImdsThrottled, "throttled"),
    (httpx.Response(500), ImdsHttpError, "http_error"),
    (httpx.Response(503), ImdsHttpError, "http_error"),
    (httpx.Response(400, json={"error": "Bad request"}), ImdsHttpError, "http_error"),
    (httpx.Response(302, headers={"Location": "http://elsewhere/"}), ImdsHttpError, "http_error"),
])
def test_status_classification(response: httpx.Response, error: type[Exception], outcome: str) -> None:
    """Every non-200 status maps to one error class and one outcome label."""
    imds, _ = client(lambda r: response)
    with pytest.raises(error) as caught:
        imds.scheduled_events()
    assert caught.value.outcome == outcome  # type: ignore[attr-defined]


@pytest.mark.parametrize(("raised", "error"), [
    (httpx.ReadTimeout("slow"), ImdsTimeout),
    (httpx.ConnectTimeout("slow"), ImdsTimeout),
    (httpx.ConnectError("refused"), ImdsConnectionError),
    (httpx.RemoteProtocolError("reset"), ImdsConnectionError),
])
def test_transport_failures(raised: Exception, error: type[Exception]) -> None:
    """Timeouts and connection failures are told apart."""
    def handler(request: httpx.Request) -> httpx.Response:
        raise raised

    imds, _ = client(handler)
    with pytest.raises(error):
        imds.scheduled_events()


def test_redirects_are_not_followed() -> None:
    """A 302 is reported, and the Location is never requested."""
    imds, seen = client(lambda r: httpx.Response(302, headers={"Location": "http://imds.test/elsewhere"}))
    with pytest.raises(ImdsHttpError, match=re.escape("redirect to http://imds.test/elsewhere not followed")):
        imds.scheduled_events()
    assert [r.url.path for r in seen] == ["/metadata/scheduledevents"]


def test_retry_after_is_carried_by_the_throttle_error() -> None:
    """429's Retry-After (seconds) reaches the poll loop."""
    imds, _ = client(lambda r: httpx.Response(429, headers={"Retry-After": "7"}))
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
    def chunks() -> Iterator[bytes]:
        raise AssertionError("the body must not be read")
        yield b""  # pragma: no cover

    imds, _ = client(lambda r: httpx.Response(200, headers={"Content-Length": "999999"}, content=chunks()),
                     max_body_bytes=4096)
    with pytest.raises(InvalidDocument, match="exceeds the 4096-byte cap"):
        imds.scheduled_events()


def test_streamed_oversized_body_is_cut_off() -> None:
    """Without Content-Length, reading stops as soon as the cap is passed."""
    produced: list[int] = []

    def chunks() -> Iterator[bytes]:
        for index in range(1000):
            produced.append(index)
            yield b" " * 1024

    imds, _ = client(lambda r: httpx.Response(200, content=chunks()), max_body_bytes=4096)
    with pytest.raises(InvalidDocument, match="cap"):
        imds.scheduled_events()
    assert len(produced) < 10


def test_compute_identity() -> None:
    """Compute metadata comes from /metadata/instance/compute?api-version=2021-02-01."""
    body = {"name": "WestNO_0", "vmId": "id", "vmScaleSetName": "", "location": "norwayeast",
            "resourceGroupName": "rg", "subscriptionId": "sub", "vmSize": "Standard_D2s_v5", "zone": "1"}
    imds, seen = client(lambda r: httpx.Response(200, json=body))
    assert imds.compute() == VmIdentity(name="WestNO_0", vm_id="id", location="norwayeast", resource_group="rg",
                                        subscription_id="sub", vm_size="Standard_D2s_v5", zone="1")
    assert seen[0].url.path == "/metadata/instance/compute"
    assert seen[0].url.params["api-version"] == "2021-02-01"


def test_compute_answering_does_not_end_the_first_call_allowance() -> None:
    """Only Scheduled Events answering ends the long first-call timeout; compute metadata says nothing about it."""
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"name": "vm"} if "compute" in request.url.path else {"Events": []})

    imds, seen = client(handler)
    imds.compute()
    imds.scheduled_events()
    imds.scheduled_events()
    assert [(r.url.path, r.extensions["timeout"]["read"]) for r in seen] == [
        ("/metadata/instance/compute", 2.0), ("/metadata/scheduledevents", 120.0), ("/metadata/scheduledevents", 2.0)]
