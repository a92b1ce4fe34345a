"""The README documents every setting and every metric the code has (so the tables cannot drift)."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry

from se_exporter.consume.settings import CONSUME_OPTIONS
from se_exporter.core.lifecycle import diff
from se_exporter.core.model import VmIdentity, parse_document
from se_exporter.infra import http_server, processwide
from se_exporter.sidecar.metrics import NAMESPACE, Metrics
from se_exporter.sidecar.settings import RUN_OPTIONS, Settings
from se_exporter.sidecar.sinks.forward import ForwardMetrics
from se_exporter.sidecar.sinks.otel_events import EventLogSink
from se_exporter.sidecar.sinks.tracing import TracingSink
from se_exporter.sidecar.snapshot import Snapshot
from se_exporter.simulator.settings import SIMULATE_OPTIONS

README = (Path(__file__).parent.parent.parent / "README.md").read_text()


def test_every_setting_is_in_the_readme() -> None:
    """Each flag and its environment variable appear in the configuration tables."""
    for option in (*RUN_OPTIONS, *SIMULATE_OPTIONS, *CONSUME_OPTIONS):
        metavar = f"[{option.metavar}]" if option.const is not None else option.metavar  # as --help shows it
        assert f"`{option.flag} {metavar}`" in README, option.flag
        assert f"`{option.env}`" in README, option.env


def test_every_metric_is_in_the_readme() -> None:
    """Each metric family the sidecar can expose (process_* aside) has a row in the metrics table."""
    body = json.dumps({"DocumentIncarnation": 1, "Events": [{
        "EventId": "E", "EventType": "Freeze", "EventStatus": "Started", "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
        "DurationInSeconds": 5}]})
    document = parse_document(body)
    snapshot = Snapshot(records=diff({}, document, 1.0).records, incarnation=1, identity=VmIdentity(name="vm"))
    registry = CollectorRegistry()
    Metrics(registry, lambda: snapshot)
    ForwardMetrics(registry)
    http_server.rejection_counter(registry, NAMESPACE)
    with processwide.restored():  # the sink turns the exporters' loggers down; the test leaves them as they were
        TracingSink(Settings(otel_traces_exporter="console").tracing, None, registry).shutdown()
        EventLogSink(Settings(otel_logs_exporter="console").tracing, registry).shutdown()
    names = {family.name + ("_total" if family.type == "counter" else "") for family in registry.collect()}
    assert len(names) > 15
    for name in names:
        assert f"| `{name}` |" in README, name
