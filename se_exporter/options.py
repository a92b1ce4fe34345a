"""Settings machinery shared by every subcommand: the option table, flag -> environment -> default resolution,
the value parsers, and the options more than one command takes (logging, Event Hubs).

Each command declares its own options and frozen settings next to it (``config.py`` for ``run``, ``consume.py``,
``simulator/settings.py``, ``fleet/settings.py``); the CLI builds its flags from those tables, the resolver reads
``SE_EXPORTER_*`` variables from them, and the README's configuration tables are written from them. These modules
are handed the environment as a mapping (``process_environment`` is the one place that reads ``os.environ``).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from se_exporter.errors import ConfigError

ENV_PREFIX = "SE_EXPORTER_"
DEFAULT_PORT = 10169  # above the exhausted 9100-9999 exporter range; "169" as in 169.254.169.254


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


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


SPEED = Bounded(0.001, 100_000, unit="")


def parse_listen(text: str) -> Listen:
    match = re.fullmatch(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})", text.strip())
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
    const: str | None = None  # the value of the flag given without one (``--simulate`` alone: demo)
    separator: str | None = None  # a repeatable flag; its environment variable holds the values split by this

    @property
    def blank_is_unset(self) -> bool:
        """An empty environment value means "not set" for a flag whose value is optional or repeated."""
        return self.const is not None or self.separator is not None

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
)


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
    """Flag, then environment, then the dataclass default; every value through its parser."""
    values: dict[str, Any] = {}
    for option in options:
        raw = getattr(args, option.dest, None)
        source = option.flag
        if raw is None and option.env in env and (env[option.env] or not option.blank_is_unset):
            raw, source = env[option.env], option.env
            if option.separator is not None:
                raw = [part for part in raw.split(option.separator) if part.strip()]
        if raw is None:
            continue
        try:
            values[option.dest] = tuple(map(option.parse, raw)) if option.separator else option.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return values


class EventHubsSettings(Protocol):
    """The Event Hubs fields run, consume and fleet settings share."""

    @property
    def eventhub_connection_string(self) -> str | None: ...

    @property
    def eventhub_name(self) -> str | None: ...

    @property
    def eventhub_namespace(self) -> str | None: ...

    @property
    def eventhub_client_id(self) -> str | None: ...

    @property
    def eventhub_endpoint(self) -> str | None: ...

    @property
    def eventhub_ca_file(self) -> str | None: ...


def check_eventhubs(settings: EventHubsSettings) -> None:
    """The Event Hubs rules shared by run, consume and fleet: one way to authenticate, a hub name, and the
    options that only make sense with one of them."""
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
