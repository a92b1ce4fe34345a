"""Settings of ``se-exporter simulate``: the IMDS double's address, scenario, speed and faults."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field

from se_exporter.core.errors import ConfigError
from se_exporter.infra.options import (
    ENV_PREFIX,
    LOG_OPTIONS,
    PLATFORM_EVENTHUB_OPTIONS,
    SPEED,
    Listen,
    Option,
    check_hub,
    choice,
    parse_listen,
    parse_name,
    resolve,
)
from se_exporter.simulator.faults import split_specs


@dataclass(frozen=True)
class SimulatorSettings:
    """Settings of ``se-exporter simulate``."""

    listen: Listen = Listen("127.0.0.1", 8169)  # noqa: RUF009 - Listen is frozen: one shared default is safe
    scenario: str = "demo"
    speed: float = 1.0
    faults: tuple[str, ...] = ()
    log_level: str = "info"
    log_format: str = "text"
    platform_eventhub_name: str | None = None
    platform_eventhub_connection_string: str | None = field(default=None, repr=False)  # a secret: never in logs
    platform_eventhub_namespace: str | None = None
    platform_file: str | None = None
    platform_schema: str = "eventgrid"

    @property
    def platform_eventhub(self) -> bool:
        return bool(self.platform_eventhub_connection_string or self.platform_eventhub_namespace)

    @property
    def platform(self) -> bool:
        """Whether the platform's copy of the scenario is published at all."""
        return self.platform_eventhub or self.platform_file is not None


SIMULATE_OPTIONS: tuple[Option, ...] = (
    Option("listen", "--listen", parse_listen,
           "where the simulator serves IMDS (default 127.0.0.1:8169)", "HOST:PORT", "SIMULATOR_"),
    Option("scenario", "--scenario", parse_name,
           "built-in scenario name or path to a scenario JSON file (default demo)", "SCENARIO", "SIMULATOR_"),
    Option("speed", "--speed", SPEED,
           "how many times faster than real time the scenario runs (default 1)", "FACTOR", "SIMULATOR_"),
    *(Option(o.dest, o.flag, o.parse, o.help, o.metavar, "SIMULATOR_") for o in LOG_OPTIONS),
    Option("faults", "--fault", str,
           "inject a fault, e.g. throttle,retry_after=2,count=3 (repeatable; see docs/simulator.md)", "SPEC",
           env_name=ENV_PREFIX + "SIMULATOR_FAULTS", separator=";", splitter=split_specs),
    *(Option(o.dest, o.flag, o.parse, o.help, o.metavar, "SIMULATOR_") for o in PLATFORM_EVENTHUB_OPTIONS),
    Option("platform_file", "--platform-file", parse_name,
           "append the platform's copy of the scenario's events to this JSON-lines file (one message a line)",
           "PATH", "SIMULATOR_"),
    Option("platform_schema", "--platform-schema", choice("eventgrid", "cloudevents"),
           "the platform copy's schema: eventgrid (an array of one event, as Event Grid delivers) or cloudevents "
           "(CloudEvents 1.0) (default eventgrid)", "SCHEMA", "SIMULATOR_"),
)


def simulator_settings(args: argparse.Namespace, env: Mapping[str, str]) -> SimulatorSettings:
    """The settings, checked; the platform hub's rules are the sidecars' hub's: one way to authenticate, a hub name."""
    settings = SimulatorSettings(**resolve(SIMULATE_OPTIONS, args, env))
    check_hub("--platform-eventhub", settings.platform_eventhub_connection_string,
              settings.platform_eventhub_namespace, settings.platform_eventhub_name, "the platform's")
    if settings.platform_schema != "eventgrid" and not settings.platform:
        raise ConfigError("--platform-schema needs --platform-file or --platform-eventhub-*: it shapes the "
                          "platform copy, which is only published to one of them")
    return settings
