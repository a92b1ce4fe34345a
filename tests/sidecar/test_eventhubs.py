"""Building the Event Hubs producer (connection string, managed identity) and the reasons of its errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError
from azure.eventhub import EventData
from azure.eventhub.exceptions import AuthenticationError, ConnectError, EventHubError, OperationTimeoutError

from se_exporter.infra.azure.clients import classify, producer_factory
from tests.support.certs import self_signed_certificate

if TYPE_CHECKING:
    from tests.support.eventhubs_server import EventHubsTestServer


class FakeCredential:
    """A credential that hands out a fixed token and notes the scopes it was asked for."""

    def __init__(self, client_id: str | None) -> None:
        self.client_id = client_id
        self.scopes: list[tuple[str, ...]] = []

    async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.scopes.append(scopes)
        return AccessToken("a-token", int(time.time()) + 3600)

    async def close(self) -> None:
        return None


def send_one(make_producer: Callable[[], Any]) -> None:
    """One event through a producer the factory builds, as the forwarder sends: a batch."""
    async def send() -> None:
        async with make_producer() as producer:
            batch = await producer.create_batch()
            batch.add(EventData(b"{}"))
            await producer.send_batch(batch)

    asyncio.run(send())


@pytest.mark.integration  # the AMQP test server (python-qpid-proton)
def test_managed_identity_builds_the_right_client(tmp_path: Path) -> None:
    """Namespace + name + client id give a producer that sends to that hub with a token from that identity's
    credential (asked for an Event Hubs token) put on the CBS for sb://<namespace>/<hub>, through a custom
    endpoint over TLS."""
    from tests.support.eventhubs_server import EventHubsTestServer, Store  # noqa: PLC0415 - an integration dependency

    made: list[FakeCredential] = []

    def credential(client_id: str | None) -> FakeCredential:
        made.append(FakeCredential(client_id))
        return made[-1]

    cert, key = self_signed_certificate(tmp_path)
    hub = EventHubsTestServer(Store(hub="maintenance"), tls=(cert, key)).start()
    try:
        send_one(producer_factory(None, "maintenance", "ns.servicebus.windows.net", "c0ffee", credential,
                                  endpoint=f"sb://localhost:{hub.port}", ca_file=str(cert)))
    finally:
        hub.stop()
    assert [event.body for events in hub.store.events.values() for event in events] == [b"{}"]
    assert [token.name for token in hub.cbs_tokens] == ["sb://ns.servicebus.windows.net/maintenance"]
    assert [c.client_id for c in made] == ["c0ffee"]
    assert made[0].scopes and all(len(scopes) == 1 and scopes[0].startswith("https://eventhubs.azure.net/")
                                  for scopes in made[0].scopes), made[0].scopes


def test_the_real_credential_chain_builds_without_contacting_anyone() -> None:
    """Without an injected credential, the client gets azure-identity's chain (managed or workload identity), fully
    constructible here: its async transport is installed, and nothing is fetched until a token is needed."""
    client = producer_factory(None, "maintenance", "ns.servicebus.windows.net", "c0ffee")()
    chain = [type(credential).__name__ for credential in client._credential.inner.credentials]
    assert "ManagedIdentityCredential" in chain
    assert not {"AzureCliCredential", "AzurePowerShellCredential", "VisualStudioCodeCredential"} & set(chain)


@pytest.mark.integration  # the AMQP test server (python-qpid-proton)
def test_connection_string_builds_the_right_client(hubs: Callable[..., EventHubsTestServer]) -> None:
    """A connection string with EntityPath gives a producer that sends to that namespace and hub."""
    from tests.support.eventhubs_server import Store  # noqa: PLC0415 - an integration dependency: unit runs go without it

    hub = hubs(Store(hub="maintenance"))
    send_one(producer_factory(hub.connection_string(), None, None, None))
    assert [event.body for events in hub.store.events.values() for event in events] == [b"{}"]
    assert [token.name for token in hub.cbs_tokens] == [f"sb://127.0.0.1:{hub.port}/maintenance"]


@pytest.mark.parametrize(("error", "reason"), [
    (TimeoutError(), "timeout"),
    (ConnectionRefusedError(), "connection"),
    (RuntimeError("?"), "other"),
])
def test_error_reasons(error: Exception, reason: str) -> None:
    """Forwarding errors are grouped into a few reasons for the metric label."""
    assert classify(error) == reason


def test_sdk_error_reasons() -> None:
    """The SDK's own exceptions map to timeout, auth, connection and service."""
    assert classify(OperationTimeoutError("send timed out")) == "timeout"
    assert classify(AuthenticationError("no")) == "auth"
    assert classify(ConnectError("no")) == "connection"
    assert classify(EventHubError("no")) == "service"


def test_a_credential_failure_wrapped_by_the_sdk_is_auth() -> None:
    """A token that could not be had reaches the forwarder as an EventHubError caused by azure-identity's
    ClientAuthenticationError (as the SDK raises it from create_batch): counted as auth, not service."""
    try:
        try:
            raise ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token")
        except ClientAuthenticationError as cause:
            raise EventHubError("DefaultAzureCredential failed to retrieve a token") from cause
    except EventHubError as wrapped:
        assert classify(wrapped) == "auth"
