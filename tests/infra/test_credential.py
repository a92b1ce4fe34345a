"""The one credential builder of the sidecar's forwarder and of fleet, against the simulator's IMDS token endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import resource
import threading
import time
from urllib.parse import parse_qs

import pytest
from azure.core.exceptions import ClientAuthenticationError

from se_exporter.infra.azure.credential import service_credential
from se_exporter.simulator.identity import TOKEN_PATH, USER_ASSIGNED
from se_exporter.simulator.server import Simulator
from tests.conftest import SimulatorFactory
from tests.support.helpers import free_port

STORAGE = "https://storage.azure.com/.default"


@pytest.fixture
def imds(simulator: SimulatorFactory, monkeypatch: pytest.MonkeyPatch) -> Simulator:
    """The simulator as IMDS (azure-identity's documented override) and a proxy in the environment that nothing
    listens on: a request sent through it would fail."""
    sim, server = simulator("live-migration")
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", server.url)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{free_port()}")
    for name in ("NO_PROXY", "no_proxy", "AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET",
                 "AZURE_FEDERATED_TOKEN_FILE", "IDENTITY_ENDPOINT", "MSI_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    return sim


def token_queries(sim: Simulator) -> list[dict[str, list[str]]]:
    return [parse_qs(r.query) for r in sim.requests if r.path == TOKEN_PATH]


def test_the_managed_identity_token_comes_from_imds_directly_for_the_chosen_identity(imds: Simulator) -> None:
    """A token for the asked resource comes from IMDS itself, not through the proxy the environment names, for the
    user-assigned identity given by client id; the developer credentials are not in the chain."""
    client_id = next(iter(USER_ASSIGNED))

    async def run() -> tuple[str, list[str]]:
        credential = service_credential(client_id)
        try:
            token = await credential.get_token(STORAGE)
            return token.token, [type(member).__name__ for member in credential.inner.credentials]
        finally:
            await credential.close()

    token, chain = asyncio.run(run())
    assert token in imds.identity.issued
    assert [(q["resource"], q["client_id"]) for q in token_queries(imds)] == [(["https://storage.azure.com"],
                                                                                [client_id])]
    assert not {"AzureCliCredential", "AzureDeveloperCliCredential", "AzurePowerShellCredential",
                "VisualStudioCodeCredential", "SharedTokenCacheCredential"} & set(chain)


def test_retry_total_bounds_the_token_requests_on_a_failing_endpoint(imds: Simulator) -> None:
    """With retry_total=1 (the sidecar's forwarder) a token endpoint answering 500 costs two requests, then the
    failure reaches the caller as an authentication error, for the forwarder's own retry loop to count."""
    imds.configure_identity(fail=100, status=500)

    async def run() -> None:
        credential = service_credential(None, retry_total=1)
        try:
            await credential.get_token(STORAGE)
        finally:
            await credential.close()

    with pytest.raises(ClientAuthenticationError):
        asyncio.run(run())
    assert len(token_queries(imds)) == 2


def test_an_absurd_token_expiry_is_refused_as_authentication_and_the_token_is_asked_for_again(
        imds: Simulator) -> None:
    """A token answer with expires_in 10^12 raises ClientAuthenticationError (the forwarder counts it as auth) and
    is not kept: the next call asks the endpoint again and gets a sane token."""
    imds.configure_identity(lifetime=10**12)

    async def run() -> tuple[str, float]:
        credential = service_credential(None, retry_total=1)
        try:
            with pytest.raises(ClientAuthenticationError, match="refused"):
                await credential.get_token(STORAGE)
            imds.configure_identity(lifetime=3600)
            token = await credential.get_token(STORAGE)
            return token.token, token.expires_on - time.time()
        finally:
            await credential.close()

    token, lifetime = asyncio.run(run())
    assert token in imds.identity.issued and 3000 < lifetime <= 3600
    assert len(token_queries(imds)) == 2


class _Flood(http.server.BaseHTTPRequestHandler):
    """A token endpoint answering 200 with Content-Length 4000000000 (or none) and a body that never ends."""

    declared = True

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.declared:
            self.send_header("Content-Length", "4000000000")
        self.end_headers()
        block = b" " * 65536
        with contextlib.suppress(OSError):
            while True:
                self.wfile.write(block)

    def log_message(self, format: str, *args: object) -> None:
        return None


def _token_endpoint(monkeypatch: pytest.MonkeyPatch,
                    handler: type[http.server.BaseHTTPRequestHandler]) -> http.server.ThreadingHTTPServer:
    """``handler`` served on a loopback port as the only token endpoint azure-identity finds (its documented IMDS
    override); the caller shuts it down."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", f"http://127.0.0.1:{server.server_port}")
    for name in ("IDENTITY_ENDPOINT", "MSI_ENDPOINT", "AZURE_CLIENT_ID", "AZURE_FEDERATED_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    return server


@pytest.mark.parametrize("declared", [True, False])
def test_a_token_endpoint_that_floods_is_read_no_further_than_the_cap(monkeypatch: pytest.MonkeyPatch,
                                                                      declared: bool) -> None:
    """An endless token answer (a huge Content-Length, or none) fails the token request as an authentication
    error after at most MAX_TOKEN_RESPONSE_BYTES read; memory does not grow with it."""
    server = _token_endpoint(monkeypatch, type("Flood", (_Flood,), {"declared": declared}))

    async def run() -> None:
        credential = service_credential(None, retry_total=0)
        try:
            await asyncio.wait_for(credential.get_token(STORAGE), 30)
        finally:
            await credential.close()

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        with pytest.raises(ClientAuthenticationError):
            asyncio.run(run())
    finally:
        server.shutdown()
        server.server_close()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB: well under 64 MiB


class _Drip(http.server.BaseHTTPRequestHandler):
    """A token endpoint answering 200 and then a byte every 0.1 s: no read ever times out."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "60000")
        self.end_headers()
        with contextlib.suppress(OSError):
            for _ in range(60000):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.1)  # the endpoint's pace, a byte at a time: the behaviour under test

    def log_message(self, format: str, *args: object) -> None:
        return None


def test_a_dripping_token_endpoint_is_cut_at_the_whole_requests_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token answer dripped a byte at a time (each read well inside the read timeout) fails as an authentication
    error at the deadline of the whole token request."""
    server = _token_endpoint(monkeypatch, _Drip)

    async def run() -> None:
        credential = service_credential(None, retry_total=0, deadline=1.0)
        try:
            await credential.get_token(STORAGE)
        finally:
            await credential.close()

    started = time.monotonic()
    try:
        with pytest.raises(ClientAuthenticationError, match="did not answer within 1 s"):
            asyncio.run(run())
    finally:
        server.shutdown()
        server.server_close()
    assert time.monotonic() - started < 5
