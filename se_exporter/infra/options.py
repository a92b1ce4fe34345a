"""Settings machinery shared by every subcommand: the option table, flag -> environment -> default resolution,
the value parsers, and the options more than one command takes (logging, Event Hubs).

Each command declares its own options and frozen settings in its program's ``settings.py`` (``sidecar/``,
``consume/``, ``fleet/``, ``simulator/``); the CLI builds its flags from those tables, the resolver reads
``SE_EXPORTER_*`` variables from them, and docs/reference.md's flag tables are written from them. These modules
are handed the environment as a mapping (``process_environment`` is the one place that reads ``os.environ``).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from se_exporter.core.errors import ConfigError

ENV_PREFIX = "SE_EXPORTER_"
DEFAULT_PORT = 10169  # above the exhausted 9100-9999 exporter range; "169" as in 169.254.169.254


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def metrics_url(self, port: int) -> str:
        """Where a person on this host scrapes the listener bound to ``port``: a wildcard address as 127.0.0.1."""
        host = self.host if self.host not in ("", "0.0.0.0", "::") else "127.0.0.1"  # noqa: S104 - display only
        return f"http://{Listen(host, port)}/metrics"


def process_environment() -> Mapping[str, str]:
    """The process environment; the CLI hands it to the resolvers (tests hand them a dict)."""
    return os.environ


# ---------------------------------------------------------------- value parsers (str -> value)


# Why urlsplit refused a URL, said without its message: that quotes the port, which in ``http://user:pa/ss@host`` (an
# unencoded ``/`` in a password) is the start of the password.
UNPARSED_URL = "its port must be a number from 0 to 65535, and an IPv6 address is written in brackets ([::1])"


def parse_url(text: str, example: str = "http://169.254.169.254") -> str:
    """An http(s) base URL. What an error repeats of it passes ``logs.redact`` on its way out, which finds a password
    up to a blank: so a URL holding a blank is not repeated at all, nor is what urlsplit says (``UNPARSED_URL``)."""
    # The standard library's urlsplit, not httpx.URL: a sidecar polling IMDS never loads httpx (~1.9 MB).
    for position, char in enumerate(text, 1):
        if char.isspace() or not char.isprintable():
            raise ValueError(f"is not a URL: character {position} is a blank or a control character ({char!r})")
    try:
        url = urlsplit(text)
        url.port  # noqa: B018 - read for its check: ValueError unless a number in 0-65535
    except ValueError:
        raise ValueError(f"{text!r} is not a URL: {UNPARSED_URL}") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"{text!r} is not an http(s) URL with a host, e.g. {example}")
    if url.query or url.fragment:
        raise ValueError(f"{text!r} must be a base URL without query or fragment")
    return text.rstrip("/")


@dataclass(frozen=True)
class Bounded:
    """A number parser with the range that makes sense for its setting, stated in ``--help``: seconds read as a
    duration (``parse_duration``), a plain number, or bytes.

    Without bounds, ``--poll-interval 1e-9`` polled IMDS thousands of times a second (it throttles above
    about 5 requests a second) and ``--first-call-timeout 1e308`` overflowed on every poll.
    """

    low: float
    high: float
    unit: str = "seconds"  # "seconds" (a duration), "" (a plain number) or "bytes"
    integer: bool = False

    def __call__(self, text: str) -> float:
        value = self.read(text)
        if not value > 0:  # NaN too
            raise ValueError(f"{text!r} must be a positive number ({self.describe()})")
        if not self.low <= value <= self.high:
            raise ValueError(f"{text!r} is out of range: {self.describe()}")
        if self.integer and value != int(value):
            raise ValueError(f"{text!r} is not a whole number")
        return int(value) if self.integer or self.unit == "bytes" else value

    def read(self, text: str) -> float:
        """The value ``text`` gives, its range not checked yet (``__call__`` checks it)."""
        if self.unit == "bytes":
            return _size(text)
        if self.unit == "seconds":
            return parse_duration(text)
        # ASCII digits only: float() also takes Arabic-Indic or full-width digits and '1_0', meant by nobody.
        if not _NUMBER.fullmatch(text):
            raise ValueError(f"{text!r} is not a number (ASCII digits, an optional '.' and exponent)")
        return float(text)

    def describe(self) -> str:
        if self.unit == "bytes":
            return f"{_show_size(self.low)} to {_show_size(self.high)}"
        if self.unit == "seconds":
            return f"{show_duration(self.low)} to {show_duration(self.high)}"
        return f"{_show_number(self.low)} to {_show_number(self.high)}"


# What float() reads, in ASCII only (nan and inf are then refused by the range, with their own words).
_NUMBER = re.compile(r"\s*[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]+)?|nan|inf(?:inity)?)\s*",
                     flags=re.ASCII | re.IGNORECASE)

# Durations as Prometheus and Go write them (``--web.timeout=5m``, ``scrape_interval: 1m30s``): each unit once,
# largest first, a fraction allowed (Go's ``1.5h``); days as Prometheus counts them (24 h). Case matters, as there:
# ``5M`` could be months or minutes. Every duration setting reads them, and a plain number is seconds.
DURATION_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
DURATIONS = ("A DURATION is a number of seconds (`1.5`) or numbers with units, largest first, as Prometheus and Go "
             "write them: `500ms`, `30s`, `5m`, `1h30m`, `2d` (units ms, s, m, h, d).")
_DURATION = re.compile(r"([+-]?)((?:(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:ms|[dhms]))+)", flags=re.ASCII)
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?|\.[0-9]+)(ms|[dhms])", flags=re.ASCII)


def parse_duration(text: str) -> float:
    """Seconds from a duration (``DURATIONS``): ``90``, ``1.5``, ``500ms``, ``1m30s``; the caller checks the range."""
    if _NUMBER.fullmatch(text):
        return float(text)
    match = _DURATION.fullmatch(text.strip(" \t\n\r\f\v"))  # ASCII blanks, as _NUMBER's
    if not match:
        raise ValueError(f"{text!r} is not a duration (e.g. 30s, 5m, 1.5): a number of seconds, or numbers with "
                         "units ms, s, m, h, d")
    order = list(DURATION_UNITS)
    parts = _DURATION_PART.findall(match.group(2))
    places = [order.index(unit) for _, unit in parts]
    if places != sorted(set(places)):
        raise ValueError(f"{text!r} is not a duration: give each unit once, largest first (e.g. 1h30m, 2m30s)")
    seconds = sum(float(number) * DURATION_UNITS[unit] if unit != "ms" else float(number) / 1000
                  for number, unit in parts)
    return -seconds if match.group(1) == "-" else seconds


def show_duration(seconds: float) -> str:
    """A number of seconds as ``parse_duration`` reads it, in the largest units that say it exactly: ``50ms``,
    ``90s`` as ``1m30s``, ``3600`` as ``1h``, ``2592000`` as ``30d``; ``1.5s`` keeps its fraction."""
    if not 0 < seconds < float("inf"):  # 0, or a value no duration setting takes: shown as Python writes it
        return "0s" if seconds == 0 else str(seconds)
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    whole, text = int(seconds), ""
    for unit in ("d", "h", "m"):
        count, whole = divmod(whole, int(DURATION_UNITS[unit]))
        text += f"{count}{unit}" if count else ""
    rest = whole + (seconds - int(seconds))
    return text + (f"{rest:g}s" if rest else "")


def _show_number(value: float) -> str:
    """2592000, not ``:g``'s 2.592e+06; fractions as ``:g`` writes them (0.05)."""
    return str(int(value)) if value == int(value) else f"{value:g}"


def _size(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9]{1,15})\s*([KMGT]i?B?|B)?\s*", text, flags=re.IGNORECASE | re.ASCII)
    if not match:
        raise ValueError(f"{text!r} is not a size, e.g. 4194304 or 4MiB")
    units = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
    return int(match.group(1)) * units[(match.group(2) or "")[:1].lower()]


def _show_size(value: float) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{int(value)} bytes"


SPEED = Bounded(0.001, 100_000, unit="")


def parse_listen(text: str) -> Listen:
    match = re.fullmatch(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]]*)):(?P<port>[0-9]{1,5})", text.strip())
    if not match:
        raise ValueError(f"{text!r} is not HOST:PORT, e.g. :{DEFAULT_PORT} or 127.0.0.1:{DEFAULT_PORT}")
    port = int(match.group("port"))
    if port > 65535:
        raise ValueError(f"{text!r}: port {port} is above 65535")
    return Listen(match.group("v6") or match.group("host") or "", port)


def parse_name(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


# Event Hubs' naming rules (Azure resource templates, Microsoft.EventHub namespaces/eventhubs and
# namespaces/eventhubs/consumergroups, "Character limit" and "Valid characters"): an event hub's name is 1-256, a
# consumer group's 1-50 alphanumerics, periods, hyphens and underscores, starting and ending with a letter or number;
# the built-in consumer group is ``$Default``. Checked at start-up: a name the service can never accept (``../../x``,
# ``a/b``, 5,000 characters) otherwise made the fleet retry for ever behind misleading authorization errors.
_ENTITY_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{{0,{}}}[A-Za-z0-9])?"
_EVENTHUB_NAME = re.compile(_ENTITY_NAME.format(254))
_CONSUMER_GROUP = re.compile(_ENTITY_NAME.format(48))


def parse_eventhub_name(text: str) -> str:
    name = text.strip()
    if not _EVENTHUB_NAME.fullmatch(name):
        raise ValueError(f"{name[:60]!r}{'...' if len(name) > 60 else ''} is not an event hub name: 1 to 256 letters, "
                         "digits, periods, hyphens and underscores, starting and ending with a letter or digit")
    return name


def parse_consumer_group(text: str) -> str:
    name = text.strip()
    if name != "$Default" and not _CONSUMER_GROUP.fullmatch(name):
        raise ValueError(f"{name[:60]!r}{'...' if len(name) > 60 else ''} is not a consumer group name: $Default, or 1 "
                         "to 50 letters, digits, periods, hyphens and underscores, starting and ending with a letter "
                         "or digit")
    return name


def parse_path(text: str) -> Path:
    if not text.strip():
        raise ValueError("must be a path, not empty")
    return Path(text)


def connection_string_parts(text: str) -> dict[str, str]:
    """Key/value pairs of an Event Hubs connection string (keys case-insensitive, as the SDK reads them)."""
    parts: dict[str, str] = {}
    for item in text.split(";"):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            parts[key.strip().lower()] = value.strip()
    return parts


def repeated_keys(text: str) -> list[str]:
    """Keys given more than once in a connection string (case-insensitive): the SDK would silently keep one."""
    first: dict[str, str] = {}
    repeated: dict[str, str] = {}
    for item in text.split(";"):
        key = item.partition("=")[0].strip()
        if "=" in item and key:
            if key.lower() in first:
                repeated[key.lower()] = first[key.lower()]
            first.setdefault(key.lower(), key)
    return list(repeated.values())


def parse_connection_string(text: str) -> str:
    """Validated without ever repeating the string: it carries the SharedAccessKey. Only key names and the
    Endpoint (a host name, no secret) appear in an error."""
    parts = connection_string_parts(text)
    endpoint = parts.get("endpoint", "")
    if not endpoint.startswith("sb://"):
        raise ValueError("has no Endpoint=sb://<namespace>/ part; copy it from the portal's "
                         "'Shared access policies' page")
    if repeated := repeated_keys(text):
        raise ValueError(f"gives {', '.join(repeated)} more than once; keep one of each")
    try:
        url = urlsplit(endpoint)
        url.port  # noqa: B018 - read for its check: ValueError unless a number in 0-65535
    except ValueError:
        raise ValueError(f"has an Endpoint that is not a URL ({endpoint!r}: {UNPARSED_URL})") from None
    if not url.hostname:
        raise ValueError(f"has an Endpoint without a host ({endpoint!r}); expected sb://<namespace>/")
    if "entitypath" in parts and not parts["entitypath"]:
        raise ValueError("has an empty EntityPath=; name the event hub there or leave EntityPath out and use "
                         "--eventhub-name")
    if not (("sharedaccesskeyname" in parts and "sharedaccesskey" in parts) or "sharedaccesssignature" in parts):
        raise ValueError("needs SharedAccessKeyName and SharedAccessKey (or SharedAccessSignature)")
    return text.strip()


def connection_string_address(text: str) -> str | None:
    """``sb://HOST:PORT`` when the connection string's Endpoint names a port, else None. azure-eventhub reads only
    the host from Endpoint and always dials 5671, so a port there is honoured by handing it to the SDK as its
    ``custom_endpoint_address`` (what ``--eventhub-endpoint`` does), unless that flag is given. The SDK's
    development-emulator mode (``UseDevelopmentEmulator=true``: plain AMQP) dials the Endpoint's port itself."""
    parts = connection_string_parts(text)
    url = urlsplit(parts.get("endpoint", ""))
    if not url.port or not url.hostname or parts.get("usedevelopmentemulator", "").lower() == "true":
        return None
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"sb://{host}:{url.port}"


def parse_namespace(text: str) -> str:
    host = text.strip().removeprefix("sb://").rstrip("/")
    if not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?", host) or "." not in host:
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


def parse_ca_file(text: str) -> str:
    """A readable file of PEM certificates: checked at start-up, not at the first connection (where every send
    would fail with NO_CERTIFICATE_OR_CRL_FOUND). One check for --eventhub-ca-file and --checkpoint-ca-file."""
    import ssl  # noqa: PLC0415 - only with a CA file: a sidecar polling IMDS over http never loads ssl here

    if os.path.exists(text) and not os.path.isfile(text):
        raise ValueError(f"{text!r} is not a regular file (a directory, device or pipe)")
    if not os.path.isfile(text):
        raise ValueError(f"{text!r} is not a readable file")
    try:
        ssl.create_default_context(cafile=text)
    except ssl.SSLError as error:
        raise ValueError(f"{text!r} holds no PEM certificate ({error.reason or error})") from None
    except OSError as error:
        raise ValueError(f"{text!r} is not a readable file ({error.strerror or error})") from None
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
    const: str | None = None  # the value of the flag given without one (``--simulate`` alone: demo)
    separator: str | None = None  # a repeatable flag; its environment variable holds the values split by this
    splitter: Callable[[str], list[str]] | None = None  # splits that variable instead, when a value may hold one

    @property
    def blank_is_unset(self) -> bool:
        """An empty environment value means "not set" for a flag whose value is optional or repeated, and for
        every standard OTEL_* variable: the OpenTelemetry specification says an empty value is treated as unset
        (Kubernetes and Helm often write ``value: ""``)."""
        return self.const is not None or self.separator is not None or self.env_name.startswith("OTEL_")

    @property
    def env(self) -> str:
        return self.env_name or ENV_PREFIX + self.env_infix + self.flag.lstrip("-").upper().replace("-", "_")


LOG_OPTIONS = (
    Option("log_level", "--log-level", choice("debug", "info", "warning", "error"),
           "log threshold: debug, info, warning or error (default info)", "LEVEL"),
    Option("log_format", "--log-format", choice("text", "json"),
           "text for people, json (one object per line) for log shippers (default text)", "FORMAT"),
)

EVENTHUB_OPTIONS: tuple[Option, ...] = (
    Option("eventhub_connection_string", "--eventhub-connection-string", parse_connection_string,
           "Event Hubs connection string (SharedAccessKey; prefer the environment variable)", "STRING"),
    Option("eventhub_name", "--eventhub-name", parse_eventhub_name,
           "event hub name, when the connection string has no EntityPath or with --eventhub-namespace", "NAME"),
    Option("eventhub_namespace", "--eventhub-namespace", parse_namespace,
           "Event Hubs namespace host (myns.servicebus.windows.net), authenticated with the VM's managed "
           "identity", "HOST"),
    Option("eventhub_client_id", "--eventhub-client-id", parse_name,
           "client id of a user-assigned managed identity (with --eventhub-namespace)", "ID"),
    Option("eventhub_endpoint", "--eventhub-endpoint", parse_endpoint,
           "connect to this address instead of the namespace's own (AMQP over TLS; port 5671 unless given), "
           "e.g. a private endpoint's IP or an application gateway: sb://HOST[:PORT]", "ADDRESS"),
    Option("eventhub_ca_file", "--eventhub-ca-file", parse_ca_file,
           "PEM file of the CAs that may sign the Event Hubs TLS certificate (default: the certifi bundle)", "PATH"),
)

# The hub Event Grid delivers Azure's own copy of the scheduled events to: read by ``fleet``, written by
# ``simulate``. Authenticated as the first hub is: a connection string, or a namespace with the managed identity of
# ``--eventhub-client-id``; ``--eventhub-ca-file`` is trusted for both.
PLATFORM_EVENTHUB_OPTIONS: tuple[Option, ...] = (
    Option("platform_eventhub_connection_string", "--platform-eventhub-connection-string", parse_connection_string,
           "connection string of the event hub Event Grid delivers the platform's scheduled events to "
           "(SharedAccessKey; prefer the environment variable)", "STRING"),
    Option("platform_eventhub_name", "--platform-eventhub-name", parse_eventhub_name,
           "that event hub's name, when its connection string has no EntityPath or with "
           "--platform-eventhub-namespace", "NAME"),
    Option("platform_eventhub_namespace", "--platform-eventhub-namespace", parse_namespace,
           "its Event Hubs namespace host, authenticated with the managed identity (as --eventhub-namespace)",
           "HOST"),
)


def check_hub(flags: str, text: str | None, namespace: str | None, name: str | None, whose: str = "the") -> None:
    """The rules of one hub, naming its flags (``--eventhub`` or ``--platform-eventhub``, then ``-name`` ...): one
    way to authenticate, and a hub name."""
    if text and namespace:
        raise ConfigError(f"{flags}-connection-string and {flags}-namespace exclude each other: use a connection "
                          "string, or a namespace with managed identity")
    if not name:
        _check_unnamed(flags, text, namespace, whose)
    elif not (text or namespace):
        raise ConfigError(f"{flags}-name needs {flags}-connection-string or {flags}-namespace (it names the event "
                          f"hub in that namespace); give one of them, or leave {flags}-name out")


def _check_unnamed(flags: str, text: str | None, namespace: str | None, whose: str) -> None:
    """A hub given without ``-name``: its connection string must name it (EntityPath); a namespace cannot."""
    if text and "entitypath" not in connection_string_parts(text):
        raise ConfigError(f"{flags}-name is required: {whose} connection string has no EntityPath")
    if namespace:
        raise ConfigError(f"{flags}-name is required with {flags}-namespace")


# The consumer group every reader of the hub (``consume``, ``fleet``) takes.
CONSUMER_GROUP_OPTION = Option("consumer_group", "--consumer-group", parse_consumer_group,
                               "consumer group to read with (default $Default)", "GROUP")


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """Flags default to None so the resolver can tell 'not given' from 'given'."""
    for option in options:
        bounds = f" [range {option.parse.describe()}]" if isinstance(option.parse, Bounded) else ""
        split = f", '{option.separator}'-separated" if option.separator else ""
        shape: dict[str, Any] = {}
        if option.const is not None:
            shape.update(nargs="?", const=option.const)
        if option.separator is not None:
            shape["action"] = "append"
        parser.add_argument(option.flag, dest=option.dest, default=None, metavar=option.metavar,
                            help=f"{option.help}{bounds} [env {option.env}{split}]", **shape)


def resolve(options: Sequence[Option], args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """Flag, then environment (where ``given`` finds them), then the dataclass default; each through its parser."""
    values: dict[str, Any] = {}
    sources = given(options, args, env)
    for option in options:
        source = sources.get(option.dest)
        if source is None:
            continue
        raw = getattr(args, option.dest) if source == option.flag else _from_env(option, env[source])
        try:
            values[option.dest] = tuple(map(option.parse, raw)) if option.separator else option.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return values


def _from_env(option: Option, raw: str) -> Any:
    """An environment variable's value as its flag would have given it: a list setting split (blanks dropped)."""
    if option.separator is None:
        return raw
    split = option.splitter(raw) if option.splitter else raw.split(option.separator)
    return [part for part in split if part.strip()]


def given(options: Sequence[Option], args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, str]:
    """Where each given setting came from, its flag or its environment variable: ``resolve`` reads it from there,
    and rules between settings name what the user wrote (``--speed`` or ``SE_EXPORTER_SPEED``)."""
    sources: dict[str, str] = {}
    for option in options:
        if getattr(args, option.dest, None) is not None:
            sources[option.dest] = option.flag
        elif option.env in env and (env[option.env] or not option.blank_is_unset):
            sources[option.dest] = option.env
    return sources


@dataclass(frozen=True)
class EventHubs:
    """The Event Hubs settings run, consume and fleet share (``EVENTHUB_OPTIONS``): their settings extend it."""

    eventhub_connection_string: str | None = field(default=None, repr=False)  # a secret: never in repr or logs
    eventhub_name: str | None = None
    eventhub_namespace: str | None = None
    eventhub_client_id: str | None = None
    eventhub_endpoint: str | None = None
    eventhub_ca_file: str | None = None

    @property
    def eventhubs_enabled(self) -> bool:
        return bool(self.eventhub_connection_string or self.eventhub_namespace)


@dataclass(frozen=True)
class HubReader(EventHubs):
    """The settings every reader of the hub has (``consume``, ``fleet``): the hub and the consumer group."""

    consumer_group: str = "$Default"


def check_eventhubs(settings: EventHubs) -> None:
    """The Event Hubs rules shared by run, consume and fleet: one way to authenticate, a hub name, and the
    options that only make sense with one of them."""
    check_hub("--eventhub", settings.eventhub_connection_string, settings.eventhub_namespace, settings.eventhub_name)
    if settings.eventhub_client_id and not settings.eventhub_namespace:
        raise ConfigError("--eventhub-client-id needs --eventhub-namespace (it selects a managed identity)")
    for given, flag in ((settings.eventhub_endpoint, "--eventhub-endpoint"),
                        (settings.eventhub_ca_file, "--eventhub-ca-file")):
        if given and not settings.eventhubs_enabled:
            raise ConfigError(f"{flag} needs --eventhub-namespace or --eventhub-connection-string")


def starting_position(text: str) -> Any:
    """``--starting-position`` (``consume``, ``fleet``) as the Event Hubs SDK takes it: earliest, latest, or an
    ISO 8601 time."""
    if text == "earliest":
        return "-1"
    if text == "latest":
        return "@latest"
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--starting-position: {text!r} is not earliest, latest or an ISO 8601 time") from None
