"""What every Event Hubs and Blob Storage client of the project shares: how to reach the namespace
(``connection_options``) and how an SDK error is named in
metrics (``classify``) and in words (``causes``, ``describe``).

One place for each, so the sidecar's forwarder, ``consume`` and ``fleet`` cannot drift apart. The SDKs are
imported by this module: only a command that talks to Azure imports it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator
from typing import Any

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    ServiceRequestTimeoutError,
    ServiceResponseTimeoutError,
)
from azure.eventhub.exceptions import (
    AuthenticationError,
    ConnectError,
    ConnectionLostError,
    EventHubError,
    OperationTimeoutError,
)

from se_exporter.core.retry import spread
from se_exporter.infra.azure.credential import SharedCredential, service_credential
from se_exporter.infra.logs import redact, shorten
from se_exporter.infra.options import connection_string_address

_TIMEOUTS = (asyncio.TimeoutError, TimeoutError, OperationTimeoutError, ServiceRequestTimeoutError,
             ServiceResponseTimeoutError)
# Event Hubs' own, and azure-core's that every azure-identity credential raises (CredentialUnavailableError too).
_AUTH = (AuthenticationError, ClientAuthenticationError)
_CONNECTION = (ConnectError, ConnectionLostError, OSError)
MAX_CAUSES = 10  # a chain longer than this is cut: the reason is near the top


def classify(error: BaseException) -> str:
    """The ``reason`` label of ``forward_errors_total`` (and the fleet's error counters), from the SDKs' exception
    classes. A credential's failure reaches us wrapped (an ``EventHubError`` caused by azure-identity's
    ``ClientAuthenticationError``): the causes are looked at too."""
    if isinstance(error, _TIMEOUTS):
        return "timeout"
    if any(isinstance(cause, _AUTH) for cause in causes(error)):
        return "auth"
    if isinstance(error, _CONNECTION):
        return "connection"
    if isinstance(error, (EventHubError, AzureError)):
        return "service"
    return "other"


def causes(error: BaseException) -> Iterator[BaseException]:
    """``error`` and what it wraps, each once, at most ``MAX_CAUSES``: Python's chain, azure-core's
    ``inner_exception`` and aiohttp's ``os_error`` (where the operator's answer usually is)."""
    seen: set[int] = set()
    todo = [error]
    while todo and len(seen) < MAX_CAUSES:
        cause = todo.pop()
        if id(cause) in seen:
            continue
        seen.add(id(cause))
        yield cause
        todo.extend(c for c in (cause.__context__, cause.__cause__, getattr(cause, "inner_exception", None),
                                getattr(cause, "os_error", None)) if isinstance(c, BaseException))


def describe(error: BaseException) -> str:
    """An SDK error for a log line: its first line (they run to pages), secrets redacted, at most 300 characters."""
    return shorten(redact((str(error) or type(error).__name__).splitlines()[0]), 300)


def connection_options(endpoint: str | None, ca_file: str | None,
                       connection_string: str | None = None) -> dict[str, Any]:
    """The SDK's documented options for reaching the namespace elsewhere (``--eventhub-endpoint``: a private
    endpoint, an application gateway) and for trusting another CA (``--eventhub-ca-file``). A custom endpoint
    would default to AMQP over WebSockets on 443; we keep AMQP over TLS (5671 unless given).
    A port in the connection string's Endpoint is honoured the same way (the SDK itself would dial 5671)."""
    from azure.eventhub import TransportType  # noqa: PLC0415 - the SDK's package root, with the clients

    options: dict[str, Any] = {}
    endpoint = endpoint or (connection_string_address(connection_string) if connection_string else None)
    if endpoint:
        options.update(custom_endpoint_address=endpoint, transport_type=TransportType.Amqp)
    if ca_file:
        options["connection_verify"] = ca_file
    return options


ProducerFactory = Callable[[], Any]  # -> azure.eventhub.aio.EventHubProducerClient

# The caller's loop (the sidecar's forwarder, the simulator's platform copy) retries for ever with the project's
# jittered backoff (core/retry.py). The SDK's own retries wait a fixed schedule (its retry modes are exponential and
# fixed, neither jittered), so every sidecar of a fleet would wait the same: here it gets one immediate retry per call
# (a link the service closed while idle is opened again at once) and no wait of its own.
RETRY_TOTAL, RETRY_BACKOFF_FACTOR, RETRY_BACKOFF_MAX = 1, 0.0, 2.0
# A consumer's retries stay the SDK's (a partition given up on is opened again only at the next load-balancing
# round), but each client waits on a schedule of its own: the SDK's default factor, drawn anew per client.
CONSUMER_RETRY_BACKOFF_FACTOR = 0.8


def consumer_retry_options() -> dict[str, Any]:
    """The retry options of an Event Hubs consumer client: the SDK's retries, on a schedule no other process shares
    (``core.retry.spread``)."""
    return {"retry_backoff_factor": spread(CONSUMER_RETRY_BACKOFF_FACTOR)}


def producer_factory(connection_string: str | None, eventhub_name: str | None, namespace: str | None,
                     client_id: str | None, make_credential: Callable[[str | None], Any] | None = None,
                     endpoint: str | None = None, ca_file: str | None = None) -> ProducerFactory:
    """How to build the async producer: from a connection string, or a namespace and managed identity.

    azure-eventhub (and azure-identity) are imported here, only when Event Hubs is configured.
    """
    from azure.eventhub.aio import EventHubProducerClient  # noqa: PLC0415 - the async client, only to send

    connection = connection_options(endpoint, ca_file, connection_string)
    if connection_string:
        def from_string() -> Any:
            return EventHubProducerClient.from_connection_string(
                connection_string, eventhub_name=eventhub_name, retry_total=RETRY_TOTAL,
                retry_backoff_factor=RETRY_BACKOFF_FACTOR, retry_backoff_max=RETRY_BACKOFF_MAX, **connection)
        return from_string
    if make_credential is None:
        # One quick retry: the IMDS credential's own policy retries a 5xx for ~25 s, past the send's watchdog (the
        # failure would then read as a timeout rather than auth); the caller retries for ever itself.
        make_credential = functools.partial(service_credential, retry_total=1)
    credential = make_credential(client_id)

    def from_identity() -> Any:
        return EventHubProducerClient(
            fully_qualified_namespace=str(namespace), eventhub_name=str(eventhub_name), credential=credential,
            retry_total=RETRY_TOTAL, retry_backoff_factor=RETRY_BACKOFF_FACTOR, retry_backoff_max=RETRY_BACKOFF_MAX,
            **connection)
    return SharedCredential(from_identity, credential)
