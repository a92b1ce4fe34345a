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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from azure.identity.aio import DefaultAzureCredential


def service_credential(client_id: str | None, retry_total: int | None = None) -> DefaultAzureCredential:
    """``client_id`` selects a user-assigned managed identity; ``retry_total`` bounds the IMDS credential's own
    retries (by default it retries a 5xx for ~25 s). Imported here, only when a managed identity is configured.
    The caller closes it: it holds an HTTP session."""
    from azure.core.pipeline.transport import AioHttpTransport
    from azure.identity.aio import DefaultAzureCredential

    options: dict[str, Any] = {"transport": AioHttpTransport(use_env_settings=False)}
    if client_id:
        options["managed_identity_client_id"] = client_id
    if retry_total is not None:
        options["retry_total"] = retry_total
    return DefaultAzureCredential(
        exclude_cli_credential=True, exclude_developer_cli_credential=True, exclude_powershell_credential=True,
        exclude_visual_studio_code_credential=True, exclude_shared_token_cache_credential=True,
        exclude_interactive_browser_credential=True, **options)
