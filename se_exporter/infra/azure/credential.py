"""The one credential a service of this project authenticates to Azure with, when it is given no key.

Both the sidecar's Event Hubs forwarder and ``se-exporter fleet`` (Event Hubs and Blob Storage) run as
services on a VM or in a pod, so both take the same one: azure-identity's async ``DefaultAzureCredential``
(their clients are async: a call can be cancelled with ``asyncio.wait_for``), narrowed to what a service has:

* the VM's managed identity, or on AKS the pod's workload identity (a managed identity credential alone
  would miss it and reach the node's identity instead); a service principal in the environment elsewhere;
* never a developer's tools (Azure CLI, azd, PowerShell, VS Code, the shared token cache, a browser): a
  service that silently runs as whoever last logged in on the machine is a worse failure than one that stops;
* token requests go to IMDS (169.254.169.254) directly, never through a proxy from the environment.

``se-exporter consume`` is a command a person runs, so it keeps the developer credentials and builds its own.

A token's expiry comes from the token endpoint's answer and is believed by azure-identity's cache and the SDKs: an
``expires_in`` of 10^12 once kept a token cached for ever and failed every Event Hubs send ("year 33715 is out of
range"). ``CheckedCredential`` refuses such a token (``ClientAuthenticationError``, counted as ``auth``) and builds
the credential anew, dropping its cache. Refused rather than clamped: such an answer says nothing true about the
token, and using it until a clamped expiry would hide a broken endpoint. The bounds on each token request (time,
bytes, lifetime): docs/http.md, "Bounds on every outbound call".
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from azure.core.exceptions import ClientAuthenticationError

from se_exporter.infra.outbound import get_only, refuse_unless_get

if TYPE_CHECKING:
    from azure.core.credentials import AccessToken
    from azure.identity.aio import DefaultAzureCredential

log = logging.getLogger("se_exporter.credential")
# Microsoft Entra access tokens last at most a day (28 h for continuous access evaluation's long-lived ones).
MAX_TOKEN_LIFETIME = 48 * 3600.0
TOKEN_CONNECT_TIMEOUT, TOKEN_READ_TIMEOUT = 5.0, 10.0
MAX_TOKEN_RESPONSE_BYTES = 64 * 1024  # azure-identity reads an answer whole; a token answer is a few kilobytes
# Seconds for one get_token, its retries included (the IMDS credential's own last ~25 s): an answer dripped a byte
# at a time never trips the per-read timeout.
TOKEN_DEADLINE = 60.0


class CheckedCredential:
    """An async token credential that refuses a token with an absurd expiry and then forgets it (module docstring).

    Wraps whatever ``make()`` builds (azure-identity's ``DefaultAzureCredential`` here); shaped like azure-core's
    ``AsyncTokenCredential``, which is all the Event Hubs and Blob Storage SDKs ask of a credential.
    """

    def __init__(self, make: Callable[[], Any], clock: Callable[[], float] = time.time,
                 deadline: float = TOKEN_DEADLINE) -> None:
        self._make, self._clock, self._deadline = make, clock, deadline
        self._inner = make()

    @property
    def inner(self) -> Any:
        return self._inner

    async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        try:
            token: AccessToken = await asyncio.wait_for(self._inner.get_token(*scopes, **kwargs), self._deadline)
        except asyncio.TimeoutError:
            raise ClientAuthenticationError(
                f"the token endpoint did not answer within {self._deadline:g} s") from None
        expires_on = token.expires_on
        lifetime = expires_on - self._clock() if isinstance(expires_on, (int, float)) else math.nan
        if math.isfinite(lifetime) and abs(lifetime) <= MAX_TOKEN_LIFETIME:
            return token
        stale, self._inner = self._inner, self._make()  # the new one has an empty cache: the next call asks again
        try:
            await stale.close()
        except Exception:  # its session is of no further use either way
            log.debug("closing the replaced credential failed", exc_info=True)
        shown = f"{lifetime:.0f} s from now" if math.isfinite(lifetime) else repr(expires_on)[:40]
        raise ClientAuthenticationError(
            f"the token endpoint answered a token expiring {shown}, more than {MAX_TOKEN_LIFETIME / 3600:g} h away: "
            "refused; a new token is asked for at the next attempt")

    async def close(self) -> None:
        await self._inner.close()

    async def __aenter__(self) -> CheckedCredential:
        return self

    async def __aexit__(self, kind: type[BaseException] | None = None, error: BaseException | None = None,
                        trace: TracebackType | None = None) -> None:
        await self.close()


def service_credential(client_id: str | None, retry_total: int | None = None,
                       deadline: float = TOKEN_DEADLINE) -> CheckedCredential:
    """``client_id`` selects a user-assigned managed identity; ``retry_total`` bounds the IMDS credential's own
    retries (by default it retries a 5xx for ~25 s); ``deadline`` each whole token request. Imported here, only
    when a managed identity is configured. The caller closes it: it holds an HTTP session."""
    return CheckedCredential(lambda: _default_credential(client_id, retry_total), deadline=deadline)


def _default_credential(client_id: str | None, retry_total: int | None) -> DefaultAzureCredential:
    from azure.identity.aio import DefaultAzureCredential

    options: dict[str, Any] = {"transport": _token_transport()}
    if client_id:
        options["managed_identity_client_id"] = client_id
    if retry_total is not None:
        options["retry_total"] = retry_total
    return DefaultAzureCredential(
        exclude_cli_credential=True, exclude_developer_cli_credential=True, exclude_powershell_credential=True,
        exclude_visual_studio_code_credential=True, exclude_shared_token_cache_credential=True,
        exclude_interactive_browser_credential=True, **options)


def _token_transport() -> Any:
    """azure-core's aiohttp transport, never through a proxy from the environment, with short timeouts, whose
    session reads at most ``MAX_TOKEN_RESPONSE_BYTES`` of an answer (aiohttp's documented ``response_class``)."""
    import aiohttp
    from azure.core.pipeline.transport import AioHttpTransport

    class CappedResponse(aiohttp.ClientResponse):
        async def read(self) -> bytes:
            if self._body is None:
                declared = self.content_length
                body = bytearray()
                while declared is None or declared <= MAX_TOKEN_RESPONSE_BYTES:
                    chunk = await self.content.read(MAX_TOKEN_RESPONSE_BYTES + 1 - len(body))
                    if not chunk:
                        self._body = bytes(body)
                        break
                    body += chunk
                    if len(body) > MAX_TOKEN_RESPONSE_BYTES:
                        break
                if self._body is None:
                    self.close()
                    raise aiohttp.ClientPayloadError(
                        f"the token endpoint's answer is larger than {MAX_TOKEN_RESPONSE_BYTES} bytes")
            return await super().read()

    class CappedTransport(AioHttpTransport):  # type: ignore[misc]  # azure-core's transport is untyped here
        async def open(self) -> None:
            if getattr(self, "session", None) is None:  # none given: this transport makes and owns it
                self.session = aiohttp.ClientSession(trust_env=False, cookie_jar=aiohttp.DummyCookieJar(),
                                                     auto_decompress=False, response_class=CappedResponse)
            await super().open()

        async def send(self, request: Any, **config: Any) -> Any:
            """Only a GET may reach IMDS (infra/outbound.py); the workload identity's POSTs go elsewhere."""
            refuse_unless_get(request.method, urlsplit(request.url).hostname or "")
            if request.method.upper() != "GET":
                return await super().send(request, **config)
            with get_only():
                return await super().send(request, **config)

    return CappedTransport(use_env_settings=False, connection_timeout=TOKEN_CONNECT_TIMEOUT,
                           read_timeout=TOKEN_READ_TIMEOUT)


class SharedCredential:
    """A client factory whose clients share one credential (and so its token cache: a new producer after a
    failure needs no new token), which is closed when its user stops: it holds an HTTP session."""

    def __init__(self, make: Callable[[], Any], credential: Any) -> None:
        self._make, self._credential = make, credential

    def __call__(self) -> Any:
        return self._make()

    async def aclose(self) -> None:
        await self._credential.close()
