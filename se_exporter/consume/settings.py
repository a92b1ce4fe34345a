"""Settings of ``se-exporter consume``, apart from the command itself: the CLI builds its flags from them without
importing the consumer (and the asyncio it brings, which the sidecar's ``run`` never needs)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass

from se_exporter.core.errors import ConfigError
from se_exporter.infra.options import (
    CONSUMER_GROUP_OPTION,
    EVENTHUB_OPTIONS,
    Bounded,
    HubReader,
    Option,
    check_eventhubs,
    choice,
    parse_name,
    resolve,
)

CONSUME_OPTIONS: tuple[Option, ...] = (
    *EVENTHUB_OPTIONS,
    CONSUMER_GROUP_OPTION,
    Option("starting_position", "--starting-position", parse_name,
           "earliest, latest, or an ISO 8601 time to read from (default earliest)", "POSITION"),
    Option("output_format", "--format", choice("timeline", "json"),
           "timeline (one line per document, per VM) or json (one object per line) (default timeline)", "FORMAT"),
    Option("max_events", "--max-events", Bounded(1, 10**12, unit="", integer=True),
           "stop after this many documents (default: run until interrupted)", "N"),
    Option("idle_timeout", "--idle-timeout", Bounded(0.1, 366 * 86400),
           "stop when no document arrived for this long (default: never)", "DURATION"),
)


@dataclass(frozen=True)
class ConsumeSettings(HubReader):
    """Settings of ``se-exporter consume``."""

    starting_position: str = "earliest"
    output_format: str = "timeline"
    max_events: int | None = None
    idle_timeout: float | None = None


def consume_settings(args: argparse.Namespace, env: Mapping[str, str]) -> ConsumeSettings:
    settings = ConsumeSettings(**resolve(CONSUME_OPTIONS, args, env))
    if not settings.eventhubs_enabled:
        raise ConfigError("--eventhub-connection-string or --eventhub-namespace is required to consume")
    check_eventhubs(settings)
    return settings
