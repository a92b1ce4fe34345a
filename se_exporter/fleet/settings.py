"""Settings of ``se-exporter fleet``, resolved by the same table and resolver as every other command."""

from __future__ import annotations

import argparse
import base64
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from se_exporter.core.errors import ConfigError
from se_exporter.infra.options import (
    CONSUMER_GROUP_OPTION,
    EVENTHUB_OPTIONS,
    LOG_OPTIONS,
    PLATFORM_EVENTHUB_OPTIONS,
    UNPARSED_URL,
    Bounded,
    HubReader,
    Listen,
    Option,
    check_eventhubs,
    check_hub,
    connection_string_parts,
    parse_ca_file,
    parse_consumer_group,
    parse_listen,
    parse_name,
    parse_url,
    resolve,
    show_duration,
    starting_position,
)

DEFAULT_FLEET_PORT = 10170  # the sidecar's 10169 plus one: both can run on one machine
DEFAULT_LISTEN = Listen("", DEFAULT_FLEET_PORT)
DEFAULT_CHECKPOINT_INTERVAL = 10.0
HEARTBEAT_WRITES_EVERY = 6  # checkpoint intervals between writes of a partition where only heartbeats arrived
HEARTBEAT_WRITES_AT_MOST = 120.0  # seconds: the default's cap, so the checkpoint age stays far below the 300 s at
# which SeExporterFleetCheckpointsStale fires, whatever --checkpoint-interval (up to 120 s) says
CHECKPOINT_INTERVAL = Bounded(0.1, 3600)

# What ``UseDevelopmentStorage=true`` stands for: Azurite's blob service on its default port, with the emulator's
# account and key that Microsoft publishes (no secret). Spelt out because the checkpoint store's copy of the storage
# SDK does not read the shorthand: it failed at start-up with a traceback (KeyError 'ACCOUNTNAME').
DEVELOPMENT_STORAGE = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
                       "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
                       "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1")


def parse_storage_connection_string(text: str) -> str:
    """Validated without ever repeating the string: it carries the AccountKey."""
    parts = connection_string_parts(text)
    if parts.get("usedevelopmentstorage", "").lower() == "true":
        return DEVELOPMENT_STORAGE
    if not ("accountname" in parts or "blobendpoint" in parts):
        raise ValueError("has no AccountName (or BlobEndpoint); copy it from the storage account's "
                         "'Access keys' page")
    if not ("accountkey" in parts or "sharedaccesssignature" in parts):
        raise ValueError("needs AccountKey (or SharedAccessSignature)")
    if "blobendpoint" in parts:
        _check_blob_endpoint(parts["blobendpoint"])
    if "accountkey" in parts:
        try:  # the SDK decodes it only to sign the first request: a typo would fail every request, forever
            base64.b64decode(parts["accountkey"], validate=True)
        except ValueError:
            raise ValueError("has an AccountKey that is not base64; copy it again from the storage account's "
                             "'Access keys' page") from None
    return text.strip()


def _check_blob_endpoint(text: str) -> None:
    """An http(s) URL with a host (and a port in range), else the storage SDK fails at the first request with a
    traceback, or every request (ftp://). Named as "BlobEndpoint", not repeated: it may carry a SAS token."""
    try:
        url = urllib.parse.urlsplit(text.strip())
        url.port  # noqa: B018 - read for its check: ValueError when out of range or not a number
    except ValueError:
        raise ValueError(f"has a BlobEndpoint that is not a URL ({UNPARSED_URL})") from None
    if url.scheme.lower() not in ("http", "https") or not url.hostname:
        raise ValueError("has a BlobEndpoint that is not an http(s) URL like "
                         "https://myaccount.blob.core.windows.net")


def parse_account_url(text: str) -> str:
    """An https URL: the storage SDK sends managed-identity tokens over https only. Read by ``parse_url``, whose
    errors never repeat what ``logs.redact`` could not hide (a SAS token in the query is redacted where shown)."""
    url = parse_url(text.strip(), example="https://myaccount.blob.core.windows.net")
    if urllib.parse.urlsplit(url).scheme != "https":
        raise ValueError(f"{text!r} is not an https URL like https://myaccount.blob.core.windows.net")
    return url


def parse_container(text: str) -> str:
    """Blob container naming rules: 3-63 lowercase letters, digits and single hyphens."""
    name = text.strip()
    if not (3 <= len(name) <= 63) or not all(c.islower() or c.isdigit() or c == "-" for c in name) \
            or name.startswith("-") or name.endswith("-") or "--" in name:
        raise ValueError(f"{text!r} is not a container name (3-63 lowercase letters, digits and single hyphens)")
    return name


@dataclass(frozen=True)
class FleetSettings(HubReader):
    """Settings of ``se-exporter fleet``."""

    listen: Listen = DEFAULT_LISTEN
    checkpoint_connection_string: str | None = field(default=None, repr=False)
    checkpoint_account_url: str | None = None
    checkpoint_container: str = "se-exporter-fleet"
    checkpoint_ca_file: str | None = None
    checkpoint_client_id: str | None = None
    checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL
    heartbeat_checkpoint_interval: float | None = None
    vm_expiry: float = 900.0  # three missed heartbeats at the Event Hubs default of 300 s
    starting_position: str = "earliest"
    load_balancing_interval: float = 30.0
    ownership_expiry: float | None = None
    max_message_bytes: int = 1024 * 1024
    platform_eventhub_connection_string: str | None = field(default=None, repr=False)
    platform_eventhub_name: str | None = None
    platform_eventhub_namespace: str | None = None
    platform_consumer_group: str = "$Default"
    platform_retention: float = 3600.0
    reconcile_grace: float = 60.0
    log_level: str = "info"
    log_format: str = "text"

    @property
    def ownership_timeout(self) -> float:
        return self.ownership_expiry or 6 * self.load_balancing_interval

    @property
    def heartbeat_write_interval(self) -> float:
        """How long heartbeats alone wait to be written: a heartbeat moves only when a VM was last seen (and its IMDS
        health), which a restart replays from the checkpoint anyway; never shorter than the checkpoint interval."""
        interval = self.heartbeat_checkpoint_interval or min(HEARTBEAT_WRITES_EVERY * self.checkpoint_interval,
                                                             HEARTBEAT_WRITES_AT_MOST)
        return max(interval, self.checkpoint_interval)

    @property
    def storage_client_id(self) -> str | None:
        return self.checkpoint_client_id or self.eventhub_client_id

    @property
    def hubs(self) -> tuple[Hub, ...]:
        """The hubs read, each when given: the sidecars' (--eventhub-*) and the platform's (--platform-eventhub-*)."""
        hubs = []
        if self.eventhubs_enabled:
            hubs.append(Hub("sidecar", self.eventhub_connection_string, self.eventhub_name, self.eventhub_namespace,
                            self.consumer_group, self.eventhub_endpoint))
        if self.platform_eventhub_connection_string or self.platform_eventhub_namespace:
            hubs.append(Hub("platform", self.platform_eventhub_connection_string, self.platform_eventhub_name,
                            self.platform_eventhub_namespace, self.platform_consumer_group, None))
        return tuple(hubs)


@dataclass(frozen=True)
class Hub:
    """One event hub the fleet reads. ``role`` is "sidecar" (``--eventhub-*``) or "platform"
    (``--platform-eventhub-*``); either may carry either kind of message (they are told apart by content)."""

    role: str
    connection_string: str | None = field(repr=False)
    name: str | None
    namespace: str | None
    consumer_group: str
    endpoint: str | None  # --eventhub-endpoint: the first hub's only (a private endpoint of its namespace)

    def identity(self) -> tuple[str, str]:
        """(namespace address, hub name) without case: two ``Hub`` of one identity are one hub."""
        parts = connection_string_parts(self.connection_string) if self.connection_string else {}
        where = self.namespace or urllib.parse.urlsplit(parts.get("endpoint", "")).netloc
        return where.rstrip("/").casefold(), (self.name or parts.get("entitypath") or "").casefold()

    def shown(self) -> str:
        """``namespace/hub`` as the SDK reads them (a name given wins over the connection string's EntityPath), for
        the start-up line: no secret in it (the Endpoint's host only)."""
        parts = connection_string_parts(self.connection_string) if self.connection_string else {}
        host = self.namespace or urllib.parse.urlsplit(parts.get("endpoint", "")).hostname or "?"
        return f"{host}/{self.name or parts.get('entitypath') or '?'}"


DEFAULTS = FleetSettings()  # what the help texts say
FLEET_OPTIONS: tuple[Option, ...] = (
    *LOG_OPTIONS,  # the options every command shares, from infra.options
    *EVENTHUB_OPTIONS,
    CONSUMER_GROUP_OPTION,
    Option("listen", "--listen", parse_listen,
           f"where /metrics, /healthz and /readyz are served (default :{DEFAULT_FLEET_PORT}, all interfaces)",
           "HOST:PORT", "FLEET_"),
    Option("checkpoint_connection_string", "--checkpoint-connection-string", parse_storage_connection_string,
           "storage account connection string for checkpoints and state (prefer the environment variable)", "STRING"),
    Option("checkpoint_account_url", "--checkpoint-account-url", parse_account_url,
           "storage account blob URL (https://myaccount.blob.core.windows.net), authenticated with the managed "
           "identity", "URL"),
    Option("checkpoint_container", "--checkpoint-container", parse_container,
           "blob container for checkpoints, ownership and state; created if missing (default "
           f"{DEFAULTS.checkpoint_container})", "NAME"),
    Option("checkpoint_ca_file", "--checkpoint-ca-file", parse_ca_file,
           "PEM file of the CAs that may sign the storage account's TLS certificate (default: the system's)", "PATH"),
    Option("checkpoint_client_id", "--checkpoint-client-id", parse_name,
           "client id of a user-assigned managed identity for storage (default: --eventhub-client-id)", "ID"),
    Option("checkpoint_interval", "--checkpoint-interval", CHECKPOINT_INTERVAL,
           f"how often each owned partition's state and checkpoint are written (default "
           f"{show_duration(DEFAULTS.checkpoint_interval)}); a partition where only heartbeats arrived waits for "
           "--heartbeat-checkpoint-interval", "DURATION"),
    Option("heartbeat_checkpoint_interval", "--heartbeat-checkpoint-interval", CHECKPOINT_INTERVAL,
           f"how often a partition where only heartbeats arrived is written (default {HEARTBEAT_WRITES_EVERY} x "
           f"--checkpoint-interval, at most {show_duration(HEARTBEAT_WRITES_AT_MOST)}, never less than "
           "--checkpoint-interval): a restart replays at most this much", "DURATION"),
    Option("vm_expiry", "--vm-expiry", Bounded(1, 30 * 86400),
           f"forget a VM not heard from for this long (default {show_duration(DEFAULTS.vm_expiry)}: three missed "
           "heartbeats)", "DURATION"),
    Option("starting_position", "--starting-position", parse_name,
           "where a partition without a checkpoint is read from: earliest, latest or an ISO 8601 time "
           "(default earliest)", "POSITION", "FLEET_"),
    Option("load_balancing_interval", "--load-balancing-interval", Bounded(0.1, 3600),
           "time between the SDK's partition load-balancing rounds (default 30s)", "DURATION"),
    Option("ownership_expiry", "--ownership-expiry", Bounded(0.5, 6 * 3600),
           "time after which a silent replica's partitions are taken over (default 6 x "
           "--load-balancing-interval)", "DURATION"),
    Option("max_message_bytes", "--max-message-bytes", Bounded(1024, 64 * 1024**2, unit="bytes"),
           "larger message bodies are counted as invalid and skipped (default 1MiB, the Event Hubs limit)", "BYTES"),
    *PLATFORM_EVENTHUB_OPTIONS,
    Option("platform_consumer_group", "--platform-consumer-group", parse_consumer_group,
           "consumer group to read the platform's event hub with (default $Default)", "GROUP"),
    Option("platform_retention", "--platform-retention", Bounded(0, 30 * 86400),
           f"how long a platform event stays listed after its end (Completed or Canceled) was read (default "
           f"{show_duration(DEFAULTS.platform_retention)})", "DURATION"),
    Option("reconcile_grace", "--reconcile-grace", Bounded(0, 86400),
           f"how long after the platform announced an event a live sidecar may take to list it before it counts as "
           f"missed (default {show_duration(DEFAULTS.reconcile_grace)})", "DURATION"),
)


def fleet_settings(args: argparse.Namespace, env: Mapping[str, str]) -> FleetSettings:
    settings = FleetSettings(**resolve(FLEET_OPTIONS, args, env))
    _check_hubs(settings)
    hubs = settings.hubs
    if len(hubs) == 2 and hubs[0].identity() == hubs[1].identity():
        raise ConfigError(f"--platform-eventhub-* names the sidecars' hub {hubs[0].shown()}: leave the platform flags "
                          "out, the fleet tells Azure's messages there by their content (read twice, each partition's "
                          "two receivers would take it from each other)")
    _check_checkpoints(settings)
    if settings.ownership_timeout <= settings.load_balancing_interval:
        raise ConfigError(f"--ownership-expiry {settings.ownership_timeout:g} must be longer than "
                          f"--load-balancing-interval {settings.load_balancing_interval:g}")
    starting_position(settings.starting_position)  # raises ConfigError naming the flag
    return settings


def _check_hubs(settings: FleetSettings) -> None:
    """The hubs read: at least one, each by one rule, the platform's another than the sidecars'."""
    hubs = settings.hubs
    if not hubs:
        raise ConfigError("--eventhub-connection-string or --eventhub-namespace (the sidecars' hub) is required, "
                          "or --platform-eventhub-connection-string or --platform-eventhub-namespace (the platform's)")
    if settings.eventhub_client_id and not (settings.eventhub_namespace or settings.platform_eventhub_namespace):
        raise ConfigError("--eventhub-client-id needs --eventhub-namespace or --platform-eventhub-namespace (it "
                          "selects a managed identity)")
    # --eventhub-client-id and --eventhub-ca-file serve the platform's hub too: checked above, not by the rules of one
    check_eventhubs(replace(settings, eventhub_client_id=None,
                            eventhub_ca_file=settings.eventhub_ca_file if settings.eventhubs_enabled else None))
    check_hub("--platform-eventhub", settings.platform_eventhub_connection_string,
              settings.platform_eventhub_namespace, settings.platform_eventhub_name, "the platform's")
    if settings.platform_consumer_group != "$Default" and not any(hub.role == "platform" for hub in hubs):
        raise ConfigError("--platform-consumer-group needs --platform-eventhub-connection-string or "
                          "--platform-eventhub-namespace")


def _check_checkpoints(settings: FleetSettings) -> None:
    """The checkpoint store: given one way exactly, its managed identity only with its account URL."""
    if bool(settings.checkpoint_connection_string) == bool(settings.checkpoint_account_url):
        raise ConfigError("give the checkpoint store as --checkpoint-connection-string or --checkpoint-account-url "
                          "(exactly one)")
    if settings.checkpoint_client_id and not settings.checkpoint_account_url:
        raise ConfigError("--checkpoint-client-id needs --checkpoint-account-url (it selects a managed identity)")
