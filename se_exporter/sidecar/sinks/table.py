"""Every output of the sidecar in one table: what turns it on, how it is built, and the families it can expose.

The assembly builds the rows that are on, in order; the docs generator and the docs test register every row's
families. A new output is one row here and its module. Each row imports its module only when it is on (or when its
families are asked for), so a sidecar without tracing never loads the OpenTelemetry SDK.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from se_exporter.sidecar.sinks import ImdsHealth, Sink
from se_exporter.sidecar.sinks.eventlog import LogSink
from se_exporter.sidecar.sinks.transition_metrics import MetricsSink

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from se_exporter.sidecar.forwarding.forward import ForwardSink
    from se_exporter.sidecar.metrics import Metrics
    from se_exporter.sidecar.settings import Settings
    from se_exporter.sidecar.statedir import StateDir

log = logging.getLogger("se_exporter")


@dataclass(frozen=True)
class Wiring:
    """What a sink is built from."""

    settings: Settings
    state_dir: StateDir
    registry: CollectorRegistry
    metrics: Metrics
    imds_health: Callable[[], ImdsHealth]


@dataclass(frozen=True)
class SinkRow:
    name: str
    enabled: Callable[[Settings], bool]
    build: Callable[[Wiring], Sink]
    # Registers every family the sink can expose, each labelled family with one sample (what the docs show);
    # starts nothing that outlives the call.
    families: Callable[[CollectorRegistry], None]


def _none(registry: CollectorRegistry) -> None:
    """Its families are the sidecar's own (``metrics.Metrics``)."""


def _forwarding_on(settings: Settings) -> bool:
    from se_exporter.sidecar.forwarding.targets import enabled_targets  # noqa: PLC0415 - only the table's rows

    return bool(enabled_targets(settings))


def make_forwarding(settings: Settings, state_dir: StateDir, registry: CollectorRegistry,
                    imds_health: Callable[[], ImdsHealth] | None = None) -> ForwardSink | None:
    """The forwarding sink with the targets of ``forwarding/targets.py`` that are on, or None when none is;
    heartbeats carry ``imds_health()``. Imported only when forwarding is on."""
    from se_exporter.sidecar.forwarding.envelope import Sequencer  # noqa: PLC0415
    from se_exporter.sidecar.forwarding.forward import ForwardMetrics, ForwardSink  # noqa: PLC0415
    from se_exporter.sidecar.forwarding.targets import enabled_targets  # noqa: PLC0415

    rows = enabled_targets(settings)
    if not rows:
        return None
    metrics = ForwardMetrics(registry)
    sequencer = Sequencer(state_dir.path)
    targets = [row.build(settings, state_dir, metrics, sequencer) for row in rows]
    if settings.heartbeat_seconds:
        log.info("forwarding the current document again after %gs without a change (heartbeat)",
                 settings.heartbeat_seconds)
    return ForwardSink(sequencer, targets, metrics, heartbeat_interval=settings.heartbeat_seconds,
                       imds_health=imds_health)


def _forwarding(wiring: Wiring) -> Sink:
    sink = make_forwarding(wiring.settings, wiring.state_dir, wiring.registry, imds_health=wiring.imds_health)
    assert sink is not None  # enabled() said a target is on
    return sink


def _forwarding_families(registry: CollectorRegistry) -> None:
    from se_exporter.sidecar.forwarding.forward import ForwardMetrics  # noqa: PLC0415

    ForwardMetrics(registry).errors.labels("eventhubs", "timeout").inc()


def _tracing(wiring: Wiring) -> Sink:
    from se_exporter.sidecar.sinks.tracing import make_tracing  # noqa: PLC0415 - loads the OpenTelemetry SDK

    return make_tracing(wiring.settings, wiring.state_dir.kept, wiring.registry)


def _tracing_families(registry: CollectorRegistry) -> None:
    from se_exporter.infra import processwide  # noqa: PLC0415
    from se_exporter.sidecar.settings import Settings  # noqa: PLC0415
    from se_exporter.sidecar.sinks.tracing import TracingSink  # noqa: PLC0415

    with processwide.restored():  # the sink turns the exporters' loggers down; leave them as they were
        TracingSink(Settings(otel_traces_exporter="console"), None, registry).shutdown()


def _event_logs(wiring: Wiring) -> Sink:
    from se_exporter.sidecar.sinks.otel_events import make_event_logs  # noqa: PLC0415 - loads the logs SDK

    return make_event_logs(wiring.settings, wiring.registry)


def _event_log_families(registry: CollectorRegistry) -> None:
    from se_exporter.infra import processwide  # noqa: PLC0415
    from se_exporter.sidecar.settings import Settings  # noqa: PLC0415
    from se_exporter.sidecar.sinks.otel_events import EventLogSink  # noqa: PLC0415

    with processwide.restored():  # the sink turns the exporters' loggers down; leave them as they were
        EventLogSink(Settings(otel_logs_exporter="console"), registry).shutdown()


SINKS: tuple[SinkRow, ...] = (
    SinkRow("transition_metrics", lambda settings: True, lambda wiring: MetricsSink(wiring.metrics), _none),
    SinkRow("log", lambda settings: True, lambda wiring: LogSink(), _none),
    SinkRow("forwarding", _forwarding_on, _forwarding, _forwarding_families),
    SinkRow("traces", lambda settings: settings.otel_traces_exporter != "none", _tracing, _tracing_families),
    SinkRow("otel_logs", lambda settings: settings.otel_logs_exporter != "none", _event_logs, _event_log_families),
)


def build_sinks(wiring: Wiring) -> list[Sink]:
    """The sinks that are on, built in the table's order."""
    return [row.build(wiring) for row in SINKS if row.enabled(wiring.settings)]


def register_families(registry: CollectorRegistry) -> None:
    """Every sink's families on ``registry``, for the docs and their test."""
    for row in SINKS:
        row.families(registry)
