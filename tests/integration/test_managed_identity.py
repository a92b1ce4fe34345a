"""Managed identity for real: azure-identity, pointed at the simulator's IMDS token endpoint by its own documented
variable (AZURE_POD_IDENTITY_AUTHORITY_HOST), gets JWTs that the Event Hubs test server's CBS checks; the sidecar
reaches that server as a custom endpoint over TLS (--eventhub-endpoint, --eventhub-ca-file), with no key anywhere."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from azure.eventhub import EventData, TransportType
from azure.eventhub.aio import EventHubProducerClient
from azure.eventhub.exceptions import AuthenticationError
from azure.identity.aio import ManagedIdentityCredential

from se_exporter.simulator.identity import SYSTEM_ASSIGNED, TOKEN_PATH, USER_ASSIGNED
from se_exporter.simulator.server import Simulator, SimulatorServer
from tests.conftest import Reliability, SimulatorFactory
from tests.support.certs import self_signed_certificate
from tests.support.eventhubs_server import EventHubsTestServer
from tests.support.helpers import Sidecar, http_get, key_times, wait_until
from tests.support.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.integration
FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2")
NAMESPACE = "myns.servicebus.windows.net"
AUDIENCE = "https://eventhubs.azure.net/"  # the SDK asks for https://eventhubs.azure.net/.default
USER_CLIENT_ID = next(iter(USER_ASSIGNED))


@dataclass
class Azure:
    """An IMDS with a managed identity, and an Event Hubs namespace over TLS that takes only its tokens."""

    sim: Simulator
    imds: SimulatorServer
    hub: EventHubsTestServer
    ca_file: Path

    @property
    def env(self) -> dict[str, str]:
        """azure-identity's documented override of the IMDS address (its ImdsCredential reads it)."""
        return {"AZURE_POD_IDENTITY_AUTHORITY_HOST": self.imds.url}

    def args(self, *extra: str) -> list[str]:
        return ["--imds-url", self.imds.url, *FAST, "--eventhub-namespace", NAMESPACE,
                "--eventhub-name", self.hub.store.hub, "--eventhub-endpoint", f"sb://localhost:{self.hub.port}",
                "--eventhub-ca-file", str(self.ca_file), "--eventhub-send-timeout", "5",
                "--eventhub-retry-max", "0.3", *extra]

    def token_requests(self) -> list[dict[str, list[str]]]:
        return [parse_qs(r.query) for r in self.sim.requests if r.path == TOKEN_PATH]


@pytest.fixture
def cloud(simulator: SimulatorFactory, tmp_path: Path) -> Iterator[Callable[..., Azure]]:
    """``cloud(speed=1)``: the simulator's IMDS (the demo scenario at that speed) and a TLS hub trusting it;
    ``held=True``: the scenario moves only when the test advances it."""
    hubs: list[EventHubsTestServer] = []

    def make(speed: float = 1.0, held: bool = False) -> Azure:
        sim, imds = simulator("demo", speed=speed, held=held)
        cert, key = self_signed_certificate(tmp_path)
        hubs.append(EventHubsTestServer(token_key=sim.identity.key, tls=(cert, key)).start())
        return Azure(sim, imds, hubs[-1], cert)

    yield make
    for hub in hubs:
        hub.stop()


@pytest.fixture
def azure(cloud: Callable[..., Azure]) -> Azure:
    """Held: the demo changes by itself 3 s in, and a start slower than that on a busy machine changed what the
    tests below saw first (a second document delivered before the first was counted)."""
    return cloud(held=True)


def delivered(azure: Azure) -> list[bytes]:
    """Bodies the hub stored, first copies only (a resend carries the same message id)."""
    seen: set[str | None] = set()
    bodies = []
    for event in azure.hub.store.all():
        if event.message_id not in seen:
            seen.add(event.message_id)
            bodies.append(event.body)
    return bodies


def drive(azure: Azure, process: Sidecar, changes: int) -> None:
    """Make the simulator's document change ``changes`` times (one key moment of the scenario each), waiting
    for the sidecar to read each one."""
    times = [t for t in key_times(azure.sim.scenario) if t > azure.sim.scenario_time()][:changes]
    for key_time in times:
        azure.sim.advance(max(0.0, key_time + 0.01 - azure.sim.scenario_time()))
        incarnation = azure.sim.document()["DocumentIncarnation"]
        wait_until(lambda i=incarnation: process.value("azure_scheduled_events_document_incarnation") == i,
                   what=f"incarnation {incarnation}")


def forward_errors(process: Sidecar) -> dict[str, float]:
    return {dict(labels)["reason"]: value for (name, labels), value in process.samples().items()
            if name == "azure_scheduled_events_forward_errors_total" and dict(labels)["sink"] == "eventhubs"
            and value}


def test_forwards_with_the_managed_identity_and_no_key_refreshing_its_token_before_expiry(
        cloud: Callable[..., Azure], sidecar: Callable[..., Sidecar], reliability: Reliability) -> None:
    """`run --eventhub-namespace --eventhub-name` forwards every distinct document, in order, authenticated only
    by the VM's managed identity: the token came from IMDS' token endpoint (Metadata header, the Event Hubs
    resource), the CBS took it as a JWT for the hub's audience, no SAS token or key was ever sent; with 36-second
    tokens the SDK fetched a new one and put it on the connection while the old one was still valid, and no send
    failed; no token appears in the logs (debug, JSON), /metrics or the spans."""
    # The SDK refreshes a token while it sends, from 90% of its life, and azure-identity asks IMDS again only
    # 30 s after its last request: 36 s tokens, and the demo scenario at 60x (a new document every ~2 s at most).
    azure = cloud(speed=60)
    azure.sim.configure_identity(lifetime=36)
    receiver = OtlpReceiver()
    try:
        process = sidecar(*azure.args("--log-level", "debug", "--log-format", "json"),
                          env={**azure.env, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint})
        wait_until(lambda: len(azure.hub.cbs_tokens) >= 2, timeout=90, what="a second token put on the connection")
        served = azure.sim.distinct_served()
        wait_until(lambda: delivered(azure)[:len(served)] == served, timeout=30, what="every document")
        spans = receiver.spans
    finally:
        receiver.close()

    tokens = azure.hub.cbs_tokens
    assert all(t.accepted and t.token_type == "jwt" and  # noqa: S105 - the type's name
                t.name == f"sb://{NAMESPACE}/{azure.hub.store.hub}"
               for t in tokens), tokens
    assert {t.claims["aud"] for t in tokens if t.claims} == {AUDIENCE}
    assert {t.claims["appid"] for t in tokens if t.claims} == {SYSTEM_ASSIGNED[0]}
    first, second = tokens[0], tokens[1]
    assert first.claims is not None and second.claims is not None
    assert second.claims["uti"] != first.claims["uti"], "the same token was put again"
    assert second.received_at < first.claims["exp"], "refreshed only after the first token expired"
    assert azure.hub.rejected_transfers == 0
    assert forward_errors(process) == {}

    requests = azure.token_requests()
    assert len(requests) >= 2
    assert all(q["resource"] == [AUDIENCE] and q["api-version"] == ["2018-02-01"] and "client_id" not in q
               for q in requests), requests
    assert all(r.metadata_header == "true" for r in azure.sim.requests if r.path == TOKEN_PATH)

    issued = list(azure.sim.identity.issued)
    assert len(issued) >= 2
    status, metrics = http_get(process.metrics_url)
    assert status == 200
    process.stop()
    log = process.log()
    assert '"stopping"' in log
    assert "Unclosed" not in log  # the credential's HTTP session was closed with the forwarder
    seen = [log, metrics, repr([(s.attributes, s.events, s.resource) for s in spans])]
    for token in issued:
        signature = token.rsplit(".", 1)[1]
        assert not any(signature in text for text in seen), "a token leaked"
    assert spans, "no spans to search"
    assert "SharedAccess" not in " ".join(process.process.args)  # type: ignore[arg-type]
    assert not any(key.startswith("SE_EXPORTER_EVENTHUB_CONNECTION") for key in os.environ)
    reliability("Security", "managed identity tokens (36 s, refreshed) with debug JSON logs, /metrics and OTLP spans",
                "no token appears; no key exists; the new token was put before the old one expired")


def test_a_user_assigned_identity_is_asked_for_by_client_id(azure: Azure, sidecar: Callable[..., Sidecar]) -> None:
    """--eventhub-client-id reaches IMDS' token request as client_id, and the hub is sent that identity's token."""
    process = sidecar(*azure.args("--eventhub-client-id", USER_CLIENT_ID), env=azure.env)
    wait_until(lambda: delivered(azure) == azure.sim.distinct_served(), timeout=30, what="the first document")
    # The hub stores a message before the SDK's send returns and the sidecar counts it: wait for the count.
    wait_until(lambda: process.value("azure_scheduled_events_forwarded_documents_total", sink="eventhubs") == 1,
               what="the delivery counted")
    assert azure.token_requests() and all(q["client_id"] == [USER_CLIENT_ID] for q in azure.token_requests())
    assert [t.claims["appid"] for t in azure.hub.cbs_tokens if t.claims] == [USER_CLIENT_ID]


def test_a_failing_token_endpoint_counts_as_auth_and_loses_nothing(azure: Azure, sidecar: Callable[..., Sidecar],
                                                                    reliability: Reliability) -> None:
    """While IMDS' token endpoint answers 500, sends fail as reason="auth" and are retried; polling goes on; once
    it answers, every document is delivered in order."""
    azure.sim.configure_identity(fail=1000, status=500)
    process = sidecar(*azure.args(), env=azure.env)
    wait_until(lambda: forward_errors(process).get("auth", 0) >= 2, timeout=30, what="auth errors")
    drive(azure, process, 3)
    wait_until(lambda: process.value("azure_scheduled_events_spool_documents") == len(azure.sim.distinct_served()),
               what="every document spooled")
    assert delivered(azure) == []
    assert set(forward_errors(process)) == {"auth"}
    azure.sim.configure_identity(fail=0)
    wait_until(lambda: delivered(azure) == azure.sim.distinct_served(), timeout=30, what="every document")
    assert len(delivered(azure)) >= 4
    # The hub stores a batch before the SDK's send returns and the spool shrinks: wait for the spool, too.
    wait_until(lambda: process.value("azure_scheduled_events_spool_documents") == 0, what="the spool drained")
    assert process.log().count("Event Hubs send failed") == 1
    reliability("Event Hubs", "managed identity token endpoint answering 500",
                'sends counted as `reason="auth"` and retried; one log line; every document delivered in order')


def test_the_hub_takes_the_identity_token_for_its_audience_and_refuses_another(azure: Azure) -> None:
    """Through the official SDK: a token from the simulator's IMDS for the Event Hubs resource is accepted by the
    test server's CBS and the event stored; a token for another resource is refused (401) and nothing stored."""
    class ForResource:
        """Hands the SDK a managed-identity token for ``resource``, whatever scope the SDK asks for."""

        def __init__(self, resource: str) -> None:
            self.resource = resource
            self.inner = ManagedIdentityCredential()

        async def get_token(self, *scopes: str, **kwargs: Any) -> Any:
            return await self.inner.get_token(self.resource + "/.default")  # as the SDK asks: resource/.default

        async def close(self) -> None:
            await self.inner.close()

    async def send(resource: str) -> None:
        credential = ForResource(resource)
        producer = EventHubProducerClient(
            fully_qualified_namespace=NAMESPACE, eventhub_name=azure.hub.store.hub, credential=credential,
            custom_endpoint_address=f"sb://localhost:{azure.hub.port}", transport_type=TransportType.Amqp,
            connection_verify=str(azure.ca_file), retry_total=0)
        try:
            batch = await producer.create_batch()
            batch.add(EventData(resource.encode()))
            await producer.send_batch(batch)
        finally:
            await producer.close()
            await credential.close()

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", azure.imds.url)
        asyncio.run(send(AUDIENCE))
        with pytest.raises(AuthenticationError):
            asyncio.run(send("https://storage.azure.com"))
    [accepted, refused] = azure.hub.cbs_tokens
    assert accepted.accepted and accepted.claims is not None and accepted.claims["aud"] == AUDIENCE
    assert not refused.accepted and "InvalidAudience" in refused.description
    assert refused.claims is not None and refused.claims["aud"] == "https://storage.azure.com"
    assert [event.body for event in azure.hub.store.all()] == [AUDIENCE.encode()]


@pytest.mark.parametrize("lifetime", [10**12, -(10**12)])
def test_an_absurd_token_lifetime_is_refused_as_auth_and_forwarding_resumes(
        azure: Azure, sidecar: Callable[..., Sidecar], lifetime: int, reliability: Reliability) -> None:
    """A token answer whose expires_in is 10^12 seconds (or as far in the past) is refused, counted as
    reason="auth" (not "service"), and forgotten: once the endpoint answers sanely a token is fetched again and
    every document is delivered, without a restart."""
    azure.sim.configure_identity(lifetime=lifetime)
    process = sidecar(*azure.args(), env=azure.env)
    wait_until(lambda: forward_errors(process).get("auth", 0) >= 2, timeout=30, what="auth errors")
    asked = len(azure.token_requests())
    assert asked >= 2  # asked again after the refusal: the absurd token was not kept
    assert delivered(azure) == []
    assert set(forward_errors(process)) == {"auth"}
    azure.sim.configure_identity(lifetime=3600)
    wait_until(lambda: delivered(azure) and delivered(azure) == azure.sim.distinct_served(), timeout=30,
               what="every document")
    assert "refused" in process.log() and process.log().count("Event Hubs send failed") == 1
    reliability("Event Hubs", "managed identity token answers with expires_in 10^12 s, or as far in the past",
                'refused and forgotten, counted as `reason="auth"`, asked for again; every document delivered once '
                "the endpoint answered sanely, without a restart; one log line")
