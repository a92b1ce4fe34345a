"""All settings in one frozen object, resolved flag -> environment -> default, validated once.

One table (``RUN_OPTIONS``, ``SIMULATE_OPTIONS``) declares every setting: the CLI builds its
flags from it, the resolver reads ``SE_EXPORTER_*`` variables from it, and the README's
configuration table is written from it. This is the only module that looks at the environment
(and it is handed the mapping; it never reads ``os.environ`` itself).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from se_exporter.errors import ConfigError
from se_exporter.platform_io import PLATFORM

ENV_PREFIX = "SE_EXPORTER_"
DEFAULT_PORT = 10169  # above the exhausted 9100-9999 exporter range; "169" as in 169.254.169.254
DEFAULT_IMDS_URL = "http://169.254.169.254"
DEFAULT_API_VERSION = "2020-07-01"
DEFAULT_STATE_DIR = PLATFORM.default_state_dir(os.environ)  # /var/lib/se-exporter; %ProgramData%\se-exporter
DEFAULT_HEARTBEAT = 300.0  # seconds; with Event Hubs: a quiet VM still reaches `se-exporter fleet` 3 times in 15 min
_API_VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class Settings:
    """Settings of ``se-exporter run``.

    Two bounds are derived rather than refused, so that ``--poll-interval 10`` alone just works:
    the backoff cap is never below the poll interval, the first-call timeout never below the
    ordinary timeout.
    """

    imds_url: str = DEFAULT_IMDS_URL
    api_version: str = DEFAULT_API_VERSION
    poll_interval: float = 1.0
    imds_timeout: float = 2.0
    first_call_timeout: float = 120.0
    max_backoff: float = 5.0
    max_document_bytes: int = 4 * 1024 * 1024
    listen: Listen = Listen("", DEFAULT_PORT)
    vm_name: str | None = None
    log_level: str = "info"
    log_format: str = "text"
    simulate: str | None = None
    speed: float = 1.0
    state_dir: str | None = None  # None: DEFAULT_STATE_DIR if writable (see state_path)
    forward_file: str | None = None
    spool_dir: str | None = None
    spool_max_bytes: int = 64 * 1024 * 1024
    eventhub_connection_string: str | None = field(default=None, repr=False)  # a secret: never in repr or logs
    eventhub_name: str | None = None
    eventhub_namespace: str | None = None
    eventhub_client_id: str | None = None
    eventhub_endpoint: str | None = None
    eventhub_ca_file: str | None = None
    eventhub_send_timeout: float = 10.0
    eventhub_retry_max: float = 30.0
    heartbeat_interval: float | None = None  # None: DEFAULT_HEARTBEAT with Event Hubs, else off; 0: off
    otel_traces_exporter: str = "none"
    otel_endpoint: str | None = None
    otel_traces_endpoint: str | None = None
    otel_protocol: str = "http/protobuf"
    otel_service_name: str = "se-exporter"

    @property
    def eventhubs_enabled(self) -> bool:
        return bool(self.eventhub_connection_string or self.eventhub_namespace)

    @property
    def heartbeat_seconds(self) -> float | None:
        """Seconds between heartbeats, or None for none (see ``--heartbeat-interval``)."""
        if self.heartbeat_interval is None:
            return DEFAULT_HEARTBEAT if self.eventhubs_enabled else None
        return self.heartbeat_interval or None

    @property
    def state_path(self) -> str:
        return self.state_dir or DEFAULT_STATE_DIR

    @property
    def spool_path(self) -> str:
        return self.spool_dir or os.path.join(self.state_path, "spool")

    @property
    def backoff_cap(self) -> float:
        return max(self.max_backoff, self.poll_interval)

    @property
    def first_timeout(self) -> float:
        return max(self.first_call_timeout, self.imds_timeout)


@dataclass(frozen=True)
class SimulatorSettings:
    """Settings of ``se-exporter simulate``."""

    listen: Listen = Listen("127.0.0.1", 8169)
    scenario: str = "demo"
    speed: float = 1.0
    faults: tuple[str, ...] = ()
    log_level: str = "info"
    log_format: str = "text"


def process_environment() -> Mapping[str, str]:
    """The process environment; the CLI hands it to the resolvers (tests hand them a dict)."""
    return os.environ


# ---------------------------------------------------------------- value parsers (str -> value)


def parse_url(text: str) -> str:
    # The standard library's urlsplit, not httpx.URL: a sidecar polling IMDS never loads httpx (~1.9 MB).
    if any(char.isspace() or not char.isprintable() for char in text):
        raise ValueError(f"{text!r} is not a URL (it holds a blank or a control character)")
    try:
        url = urlsplit(text)
        url.port  # noqa: B018 - read for its check: ValueError unless a number in 0-65535
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a URL ({exc})") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"{text!r} is not an http(s) URL with a host, e.g. http://169.254.169.254")
    if url.query or url.fragment:
        raise ValueError(f"{text!r} must be a base URL without query or fragment")
    return text.rstrip("/")


def parse_api_version(text: str) -> str:
    if not _API_VERSION.match(text):
        raise ValueError(f"{text!r} is not an api-version like 2020-07-01")
    return text


@dataclass(frozen=True)
class Bounded:
    """A number parser with the range that makes sense for its setting, stated in ``--help``.

    Without bounds, ``--poll-interval 1e-9`` polled IMDS thousands of times a second (it throttles above
    about 5 requests a second) and ``--first-call-timeout 1e308`` overflowed on every poll.
    """

    low: float
    high: float
    unit: str = "seconds"  # "seconds", "" (a plain number) or "bytes"
    integer: bool = False

    def __call__(self, text: str) -> float:
        if self.unit == "bytes":
            value: float = _size(text)
        else:
            try:
                value = float(text)
            except ValueError:
                what = "a number of seconds, e.g. 1 or 0.5" if self.unit == "seconds" else "a number"
                raise ValueError(f"{text!r} is not {what}") from None
        if not value > 0:  # NaN too
            raise ValueError(f"{text!r} must be a positive number ({self.describe()})")
        if not self.low <= value <= self.high:
            raise ValueError(f"{text!r} is out of range: {self.describe()}")
        if self.integer and value != int(value):
            raise ValueError(f"{text!r} is not a whole number")
        return int(value) if self.integer or self.unit == "bytes" else value

    def describe(self) -> str:
        if self.unit == "bytes":
            return f"{_show_size(self.low)} to {_show_size(self.high)}"
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.low:g} to {self.high:g}{unit}"


def _size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d{1,15})\s*([KMGT]i?B?|B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a size, e.g. 4194304 or 4MiB")
    units = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
    return int(match.group(1)) * units[(match.group(2) or "")[:1].lower()]


def _show_size(value: float) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{int(value)} bytes"


# The ranges of every numeric setting (help texts and the README show them).
POLL_INTERVAL = Bounded(0.05, 3600)  # below 0.2 s IMDS throttles; 0.05 is the benchmarks' and tests' 20 Hz
TIMEOUT = Bounded(0.05, 300)
FIRST_CALL_TIMEOUT = Bounded(0.05, 600)  # the first call may take two minutes: five times that is plenty
BACKOFF = Bounded(0.05, 3600)
DOCUMENT_BYTES = Bounded(1024, 64 * 1024**2, unit="bytes")
SPOOL_BYTES = Bounded(4096, 1024**4, unit="bytes")
SPEED = Bounded(0.001, 100_000, unit="")
SEND_TIMEOUT = Bounded(0.1, 600)
RETRY_MAX = Bounded(0.1, 3600)
MAX_EVENTS = Bounded(1, 10**12, unit="", integer=True)
IDLE_TIMEOUT = Bounded(0.1, 366 * 86400)
HEARTBEAT = Bounded(0.1, 86400)
THROTTLED_BELOW = 0.2  # seconds between polls: faster than IMDS serves without throttling


def parse_bytes(text: str) -> int:
    """A document size limit (kept for callers that parse sizes directly)."""
    return int(DOCUMENT_BYTES(text))


def parse_listen(text: str) -> Listen:
    match = re.fullmatch(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})", text.strip())
    if not match:
        raise ValueError(f"{text!r} is not HOST:PORT, e.g. :{DEFAULT_PORT} or 127.0.0.1:{DEFAULT_PORT}")
    port = int(match.group("port"))
    if port > 65535:
        raise ValueError(f"{text!r}: port {port} is above 65535")
    return Listen(match.group("v6") or match.group("host") or "", port)


def parse_heartbeat(text: str) -> float:
    """Seconds between heartbeats; 0 or 'off' turns them off."""
    if text.strip().lower() in ("0", "off"):
        return 0.0
    return HEARTBEAT(text)


def parse_name(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


def parse_path(text: str) -> str:
    if not text.strip():
        raise ValueError("must be a path, not empty")
    return text


def connection_string_parts(text: str) -> dict[str, str]:
    """Key/value pairs of an Event Hubs connection string (keys case-insensitive, as the SDK reads them)."""
    parts: dict[str, str] = {}
    for item in text.split(";"):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            parts[key.strip().lower()] = value.strip()
    return parts


def parse_connection_string(text: str) -> str:
    """Validated without ever repeating the string: it carries the SharedAccessKey."""
    parts = connection_string_parts(text)
    endpoint = parts.get("endpoint", "")
    if not endpoint.startswith("sb://"):
        raise ValueError("has no Endpoint=sb://<namespace>/ part; copy it from the portal's "
                         "'Shared access policies' page")
    if not (("sharedaccesskeyname" in parts and "sharedaccesskey" in parts) or "sharedaccesssignature" in parts):
        raise ValueError("needs SharedAccessKeyName and SharedAccessKey (or SharedAccessSignature)")
    return text.strip()


def parse_namespace(text: str) -> str:
    host = text.strip().removeprefix("sb://").rstrip("/")
    if not re.fullmatch(r"[A-Za-z0-9.-]+(:\d+)?", host) or "." not in host:
        raise ValueError(f"{text!r} is not a namespace host name like myns.servicebus.windows.net")
    return host


def parse_endpoint(text: str) -> str:
    """A custom AMQP endpoint, ``sb://HOST[:PORT]``: what azure-eventhub calls ``custom_endpoint_address``."""
    address = text.strip() if "://" in text else "sb://" + text.strip()
    try:
        url = urlsplit(address)
        port = url.port
    except ValueError:
        url, port = None, None
    if url is None or url.scheme not in ("sb", "amqps") or not url.hostname or url.path.strip("/") or url.query:
        raise ValueError(f"{text!r} is not an endpoint address like sb://10.1.2.3 or sb://eh-gateway.internal:5671")
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"sb://{host}" + (f":{port}" if port else "")


def parse_file(text: str) -> str:
    if not os.path.isfile(text):
        raise ValueError(f"{text!r} is not a readable file")
    return text


def choice(*values: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        lowered = text.lower()
        if lowered not in values:
            raise ValueError(f"{text!r} is not one of {', '.join(values)}")
        return lowered

    return parse


# ---------------------------------------------------------------- the option table


@dataclass(frozen=True)
class Option:
    dest: str
    flag: str
    parse: Callable[[str], Any]
    help: str
    metavar: str = "VALUE"
    env_infix: str = ""
    env_name: str = ""  # a standard variable (OTEL_*) instead of SE_EXPORTER_*

    @property
    def env(self) -> str:
        return self.env_name or ENV_PREFIX + self.env_infix + self.flag.lstrip("-").upper().replace("-", "_")


_LOG_OPTIONS = (
    Option("log_level", "--log-level", choice("debug", "info", "warning", "error"),
           "log threshold: debug, info, warning or error (default info)", "LEVEL"),
    Option("log_format", "--log-format", choice("text", "json"),
           "text for people, json (one object per line) for log shippers (default text)", "FORMAT"),
)

RUN_OPTIONS: tuple[Option, ...] = (
    Option("imds_url", "--imds-url", parse_url,
           f"IMDS base URL (default {DEFAULT_IMDS_URL}); never reached through a proxy", "URL"),
    Option("api_version", "--api-version", parse_api_version,
           f"Scheduled Events api-version to request (default {DEFAULT_API_VERSION})", "VERSION"),
    Option("poll_interval", "--poll-interval", POLL_INTERVAL,
           "seconds between polls; Azure recommends 1 (default 1)", "SECONDS"),
    Option("imds_timeout", "--imds-timeout", TIMEOUT,
           "timeout of each whole IMDS request (connect, headers and body) once IMDS has answered (default 2)",
           "SECONDS"),
    Option("first_call_timeout", "--first-call-timeout", FIRST_CALL_TIMEOUT,
           "timeout until IMDS first answers: the first call enables the service and may take "
           "up to two minutes (default 120; never shorter than --imds-timeout)", "SECONDS"),
    Option("max_backoff", "--max-backoff", BACKOFF,
           "longest wait between polls after failures or a 429 Retry-After; kept short because a "
           "missed notice is worse than a throttled poll (default 5; never shorter than --poll-interval)",
           "SECONDS"),
    Option("max_document_bytes", "--max-document-bytes", DOCUMENT_BYTES,
           "largest IMDS body read; larger ones are rejected unread (default 4MiB)", "BYTES"),
    Option("listen", "--listen", parse_listen,
           f"where /metrics, /healthz and /readyz are served (default :{DEFAULT_PORT}, all "
           "interfaces; use 127.0.0.1:PORT to keep it local)", "HOST:PORT"),
    Option("vm_name", "--vm-name", parse_name,
           "this VM's name as listed in event Resources (default: from IMDS compute metadata)", "NAME"),
    *_LOG_OPTIONS,
    Option("speed", "--speed", SPEED,
           "with --simulate: how many times faster than real time the scenario runs (default 1)", "FACTOR"),
    Option("state_dir", "--state-dir", parse_path,
           "where state that must survive restarts is kept: open lifecycles, the forwarding sequence "
           f"(default {DEFAULT_STATE_DIR})", "PATH"),
    Option("forward_file", "--forward-file", parse_path,
           "append every distinct document, with its properties, to this JSON-lines file", "PATH"),
    Option("spool_dir", "--spool-dir", parse_path,
           "durable queue of documents waiting for Event Hubs (default STATE_DIR/spool)", "PATH"),
    Option("spool_max_bytes", "--spool-max-bytes", SPOOL_BYTES,
           "spool size limit; past it the oldest documents are dropped and counted (default 64MiB)", "BYTES"),
    Option("eventhub_connection_string", "--eventhub-connection-string", parse_connection_string,
           "Event Hubs connection string (SharedAccessKey; prefer the environment variable)", "STRING"),
    Option("eventhub_name", "--eventhub-name", parse_name,
           "event hub name, when the connection string has no EntityPath or with --eventhub-namespace", "NAME"),
    Option("eventhub_namespace", "--eventhub-namespace", parse_namespace,
           "Event Hubs namespace host (myns.servicebus.windows.net), authenticated with the VM's managed "
           "identity", "HOST"),
    Option("eventhub_client_id", "--eventhub-client-id", parse_name,
           "client id of a user-assigned managed identity (with --eventhub-namespace)", "ID"),
    Option("eventhub_endpoint", "--eventhub-endpoint", parse_endpoint,
           "connect to this address instead of the namespace's own (AMQP over TLS; port 5671 unless given), "
           "e.g. a private endpoint's IP or an application gateway: sb://HOST[:PORT]", "ADDRESS"),
    Option("eventhub_ca_file", "--eventhub-ca-file", parse_file,
           "PEM file of the CAs that may sign the Event Hubs TLS certificate (default: the certifi bundle)", "PATH"),
    Option("eventhub_send_timeout", "--eventhub-send-timeout", SEND_TIMEOUT,
           "timeout of one send to Event Hubs; a timed-out batch is kept and resent (default 10)", "SECONDS"),
    Option("eventhub_retry_max", "--eventhub-retry-max", RETRY_MAX,
           "longest wait between attempts while Event Hubs is unreachable (default 30)", "SECONDS"),
    Option("heartbeat_interval", "--heartbeat-interval", parse_heartbeat,
           "forward the current document again after this long without a change, marked as a heartbeat, so "
           "consumers know the VM is alive (default 300 with Event Hubs, else off; 0 or off: never; "
           f"{HEARTBEAT.describe()})", "SECONDS"),
    Option("otel_traces_exporter", "--otel-traces-exporter", choice("otlp", "console", "none"),
           "where spans go: otlp, console or none (default otlp when an OTLP endpoint is set, else none)",
           "EXPORTER", env_name="OTEL_TRACES_EXPORTER"),
    Option("otel_endpoint", "--otel-endpoint", parse_url,
           "OTLP endpoint, e.g. http://tempo:4318 (http/protobuf; /v1/traces is added) or http://tempo:4317 (grpc)",
           "URL", env_name="OTEL_EXPORTER_OTLP_ENDPOINT"),
    Option("otel_protocol", "--otel-protocol", choice("http/protobuf", "grpc"),
           "OTLP protocol: http/protobuf or grpc (default http/protobuf)", "PROTOCOL",
           env_name="OTEL_EXPORTER_OTLP_PROTOCOL"),
    Option("otel_service_name", "--otel-service-name", parse_name,
           "service.name of the spans (default se-exporter)", "NAME", env_name="OTEL_SERVICE_NAME"),
)

_EVENTHUB_DESTS = ("eventhub_connection_string", "eventhub_name", "eventhub_namespace", "eventhub_client_id",
                   "eventhub_endpoint", "eventhub_ca_file")
CONSUME_OPTIONS: tuple[Option, ...] = (
    *(option for option in RUN_OPTIONS if option.dest in _EVENTHUB_DESTS),
    Option("consumer_group", "--consumer-group", parse_name, "consumer group to read with (default $Default)",
           "GROUP"),
    Option("starting_position", "--starting-position", parse_name,
           "earliest, latest, or an ISO 8601 time to read from (default earliest)", "POSITION"),
    Option("output_format", "--format", choice("timeline", "json"),
           "timeline (one line per document, per VM) or json (one object per line) (default timeline)", "FORMAT"),
    Option("max_events", "--max-events", MAX_EVENTS,
           "stop after this many documents (default: run until interrupted)", "N"),
    Option("idle_timeout", "--idle-timeout", IDLE_TIMEOUT,
           "stop when no document arrived for this long (default: never)", "SECONDS"),
)


@dataclass(frozen=True)
class ConsumeSettings:
    """Settings of ``se-exporter consume``."""

    eventhub_connection_string: str | None = field(default=None, repr=False)
    eventhub_name: str | None = None
    eventhub_namespace: str | None = None
    eventhub_client_id: str | None = None
    eventhub_endpoint: str | None = None
    eventhub_ca_file: str | None = None
    consumer_group: str = "$Default"
    starting_position: str = "earliest"
    output_format: str = "timeline"
    max_events: int | None = None
    idle_timeout: float | None = None


def consume_settings(args: argparse.Namespace, env: Mapping[str, str]) -> ConsumeSettings:
    settings = ConsumeSettings(**resolve(CONSUME_OPTIONS, args, env))
    if not (settings.eventhub_connection_string or settings.eventhub_namespace):
        raise ConfigError("--eventhub-connection-string or --eventhub-namespace is required to consume")
    _check_eventhubs(settings)
    return settings

SIMULATE_OPTIONS: tuple[Option, ...] = (
    Option("listen", "--listen", parse_listen,
           "where the simulator serves IMDS (default 127.0.0.1:8169)", "HOST:PORT", "SIMULATOR_"),
    Option("scenario", "--scenario", parse_name,
           "built-in scenario name or path to a scenario JSON file (default demo)", "SCENARIO", "SIMULATOR_"),
    Option("speed", "--speed", SPEED,
           "how many times faster than real time the scenario runs (default 1)", "FACTOR", "SIMULATOR_"),
    *(Option(o.dest, o.flag, o.parse, o.help, o.metavar, "SIMULATOR_") for o in _LOG_OPTIONS),
)


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """Flags default to None so the resolver can tell 'not given' from 'given'."""
    for option in options:
        bounds = f" [range {option.parse.describe()}]" if isinstance(option.parse, Bounded) else ""
        parser.add_argument(option.flag, dest=option.dest, default=None, metavar=option.metavar,
                            help=f"{option.help}{bounds} [env {option.env}]")


def resolve(options: Sequence[Option], args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """Flag, then environment, then the dataclass default; every value through its parser."""
    values: dict[str, Any] = {}
    for option in options:
        raw = getattr(args, option.dest, None)
        source = option.flag
        if raw is None and option.env in env:
            raw, source = env[option.env], option.env
        if raw is None:
            continue
        try:
            values[option.dest] = option.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return values


def run_settings(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    values = resolve(RUN_OPTIONS, args, env)
    simulate = getattr(args, "simulate", None)
    if simulate is None and env.get(ENV_PREFIX + "SIMULATE"):
        simulate = env[ENV_PREFIX + "SIMULATE"]
    if simulate is not None:
        values["simulate"] = simulate
    values.update(_otel_extras(args, env, values))
    settings = Settings(**values)
    _check_eventhubs(settings)
    return settings


def _otel_extras(args: argparse.Namespace, env: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, Any]:
    """The signal-specific OTEL variables win over the general ones, as the specification says."""
    extras: dict[str, Any] = {}
    traces_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces_endpoint and getattr(args, "otel_endpoint", None) is None:
        try:
            extras["otel_traces_endpoint"] = parse_url(traces_endpoint)
        except ValueError as exc:
            raise ConfigError(f"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: {exc}") from None
    traces_protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
    if traces_protocol and getattr(args, "otel_protocol", None) is None:
        try:
            extras["otel_protocol"] = choice("http/protobuf", "grpc")(traces_protocol)
        except ValueError as exc:
            raise ConfigError(f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: {exc}") from None
    if "otel_traces_exporter" not in values:
        endpoint_set = values.get("otel_endpoint") or extras.get("otel_traces_endpoint")
        extras["otel_traces_exporter"] = "otlp" if endpoint_set else "none"
    return extras


def _check_eventhubs(settings: Settings | ConsumeSettings) -> None:
    if settings.eventhub_connection_string and settings.eventhub_namespace:
        raise ConfigError("--eventhub-connection-string and --eventhub-namespace exclude each other: "
                          "use a connection string, or a namespace with managed identity")
    if settings.eventhub_connection_string:
        if "entitypath" not in connection_string_parts(settings.eventhub_connection_string) \
                and not settings.eventhub_name:
            raise ConfigError("--eventhub-name is required: the connection string has no EntityPath")
    elif settings.eventhub_namespace and not settings.eventhub_name:
        raise ConfigError("--eventhub-name is required with --eventhub-namespace")
    if settings.eventhub_client_id and not settings.eventhub_namespace:
        raise ConfigError("--eventhub-client-id needs --eventhub-namespace (it selects a managed identity)")
    for given, flag in ((settings.eventhub_endpoint, "--eventhub-endpoint"),
                        (settings.eventhub_ca_file, "--eventhub-ca-file")):
        if given and not (settings.eventhub_connection_string or settings.eventhub_namespace):
            raise ConfigError(f"{flag} needs --eventhub-namespace or --eventhub-connection-string")


def simulator_settings(args: argparse.Namespace, env: Mapping[str, str]) -> SimulatorSettings:
    values = resolve(SIMULATE_OPTIONS, args, env)
    faults = tuple(getattr(args, "faults", None) or ())
    if not faults and env.get(ENV_PREFIX + "SIMULATOR_FAULTS"):
        faults = tuple(part for part in env[ENV_PREFIX + "SIMULATOR_FAULTS"].split(";") if part.strip())
    return SimulatorSettings(**values, faults=faults)
