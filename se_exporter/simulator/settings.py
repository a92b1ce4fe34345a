"""Settings of ``se-exporter simulate``: the IMDS double's address, scenario, speed and faults."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass

from se_exporter.infra.options import ENV_PREFIX, LOG_OPTIONS, SPEED, Listen, Option, parse_listen, parse_name, resolve
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


SIMULATE_OPTIONS: tuple[Option, ...] = (
    Option("listen", "--listen", parse_listen,
           "where the simulator serves IMDS (default 127.0.0.1:8169)", "HOST:PORT", "SIMULATOR_"),
    Option("scenario", "--scenario", parse_name,
           "built-in scenario name or path to a scenario JSON file (default demo)", "SCENARIO", "SIMULATOR_"),
    Option("speed", "--speed", SPEED,
           "how many times faster than real time the scenario runs (default 1)", "FACTOR", "SIMULATOR_"),
    *(Option(o.dest, o.flag, o.parse, o.help, o.metavar, "SIMULATOR_") for o in LOG_OPTIONS),
    Option("faults", "--fault", str, "inject a fault, e.g. throttle,retry_after=2,count=3 (repeatable; see README)",
           "SPEC", env_name=ENV_PREFIX + "SIMULATOR_FAULTS", separator=";", splitter=split_specs),
)


def simulator_settings(args: argparse.Namespace, env: Mapping[str, str]) -> SimulatorSettings:
    return SimulatorSettings(**resolve(SIMULATE_OPTIONS, args, env))
