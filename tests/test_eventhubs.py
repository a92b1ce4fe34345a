"""Building the Event Hubs producer (connection string, managed identity) and the reasons of its errors."""

from __future__ import annotations

from typing import Any

import pytest
from azure.core.exceptions import ClientAuthenticationError
from azure.eventhub.exceptions import AuthenticationError, ConnectError, EventHubError, OperationTimeoutError

from se_exporter.sinks.eventhubs import classify, producer_factory

CONN = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=TOPSECRETKEY="


class FakeCredential:
    def __init__(self, client_id: str | None) -> None:
        self.client_id = client_id

    async def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        raise AssertionError("no token is needed to build the client")

    async def close(self) -> None:
        return None


def test_managed_identity_builds_the_right_client() -> None:
    """Namespace + name + client id give a producer for that hub, authenticated by that identity."""
    made: list[FakeCredential] = []

    def credential(client_id: str | None) -> FakeCredential:
        made.append(FakeCredential(client_id))
        return made[-1]

    client = producer_factory(None, "maintenance", "ns.servicebus.windows.net", "c0ffee", credential)()
    assert client._address.hostname == "ns.servicebus.windows.net"
    assert client.eventhub_name == "maintenance"
    assert client._credential is made[0] and made[0].client_id == "c0ffee"


def test_the_real_credential_chain_builds_without_contacting_anyone() -> None:
    """Without an injected credential, the client gets azure-identity's chain (managed or workload identity), fully
    constructible here: its async transport is installed, and nothing is fetched until a token is needed."""
    client = producer_factory(None, "maintenance", "ns.servicebus.windows.net", "c0ffee")()
    chain = [type(credential).__name__ for credential in client._credential.credentials]
    assert "ManagedIdentityCredential" in chain
    assert not {"AzureCliCredential", "AzurePowerShellCredential", "VisualStudioCodeCredential"} & set(chain)


def test_connection_string_builds_the_right_client() -> None:
    """A connection string with EntityPath gives a producer for that namespace and hub."""
    client = producer_factory(CONN + ";EntityPath=maintenance", None, None, None)()
    assert (client._address.hostname, client.eventhub_name) == ("ns.servicebus.windows.net", "maintenance")


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
