"""Lifecycle transitions as OpenTelemetry log records (events with event.name), through the SDK's in-memory log
exporter: one per transition, in the event's trace and its root span's context, with the event's attributes."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, LogRecordExportResult
from prometheus_client import CollectorRegistry

from se_exporter.core import spot
from se_exporter.core.lifecycle import EventRecord, diff
from se_exporter.core.model import VmIdentity
from se_exporter.infra import processwide
from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks import DocumentChange
from se_exporter.sidecar.sinks.otel_events import EventLogSink
from se_exporter.sidecar.sinks.spans import span_id_for, trace_id_for
from se_exporter.simulator import scenario as scenarios
from tests.sidecar.test_spans import EPOCH, document_at
from tests.support.helpers import key_times

A = "azure.scheduled_event."


def run(name: str) -> tuple[list[tuple[str, EventRecord | None]], InMemoryLogRecordExporter, VmIdentity]:
    """Walk the scenario through the diff and the log sink; the transitions made, and the exporter."""
    scenario = scenarios.load(name)
    exporter = InMemoryLogRecordExporter()
    registry = CollectorRegistry()
    sink = EventLogSink(Settings(), registry, exporter)
    identity = VmIdentity(name=scenario.vm["name"], vm_id=scenario.vm["vmId"], subscription_id="sub-1")
    records: Mapping[str, EventRecord] = {}
    ended: Mapping[str, EventRecord] = {}
    made: list[tuple[str, EventRecord | None]] = []
    for incarnation, t in enumerate((0.0, *key_times(scenario)), start=1):
        document = document_at(scenario, t + 0.01, incarnation)
        step = diff(records, document, EPOCH + t + 0.01, ended)
        records, ended = step.records, step.ended
        follows = spot.links(step.transitions, step.records, step.ended)
        made += [(f"{t.event.event_id}/{t.kind.value}", follows.get(t.event.key)) for t in step.transitions]
        sink.on_change(DocumentChange(b"", document, step.transitions, step.records, EPOCH + t + 0.01,
                                   scenario.vm["name"], identity, "2024-07-09", follows))
    assert sink.force_flush()
    assert registry.get_sample_value("azure_scheduled_events_log_records_exported_total") == len(made)
    sink.shutdown()
    return made, exporter, identity


@pytest.mark.parametrize("name", ["live-migration", "canceled", "spot-rebalance", "auto-approved", "host-failure"])
def test_one_record_per_transition_in_the_events_trace(name: str) -> None:
    """Each transition gives exactly one record named azure.scheduled_event.<transition>, whose trace and span ids
    are the event's trace and its root span (the spans' ids), with the span's attributes and cloud.platform
    azure.vm on the resource."""
    made, exporter, identity = run(name)
    records = [r.log_record for r in exporter.get_finished_logs()]
    assert [f"{r.attributes[A + 'id']}/{r.attributes[A + 'transition']}" for r in records] == [m for m, _ in made]
    vm_key = f"{identity.vm_id}/{identity.name}"
    for record in records:
        event_id = str(record.attributes[A + "id"])
        assert record.event_name == A + str(record.attributes[A + "transition"])
        assert (record.trace_id, record.span_id) == (trace_id_for(event_id), span_id_for(event_id, vm_key, "root"))
        assert record.attributes[A + "api_version"] == "2024-07-09"
    resource = exporter.get_finished_logs()[0].resource.attributes
    assert (resource["cloud.platform"], resource["cloud.account.id"], resource["host.id"]) == (
        "azure.vm", "sub-1", identity.vm_id)


def test_a_started_at_first_sight_record_says_it_had_no_notice() -> None:
    """The auto-approved user reboot's started record carries notice 0 and skipped_scheduled, and no scheduled
    record comes before it."""
    _, exporter, _ = run("auto-approved")
    records = [r.log_record for r in exporter.get_finished_logs()]
    started = [r for r in records if r.event_name == A + "started"]
    assert len(started) == 2
    assert all((r.attributes[A + "notice_seconds"], r.attributes[A + "skipped_scheduled"]) == (0.0, True)
               for r in started)
    assert not [r for r in records if r.event_name == A + "scheduled"]


def test_the_preempt_record_names_the_recommendation_it_follows() -> None:
    """The Preempt's scheduled record links the SpotRebalanceRecommendation first seen 38 s before it."""
    _, exporter, _ = run("spot-rebalance")
    (preempt,) = [r.log_record for r in exporter.get_finished_logs()
                  if r.log_record.attributes[A + "type"] == "Preempt"
                  and r.log_record.event_name == A + "scheduled"]
    assert preempt.attributes[A + "follows_recommendation_id"] == "5A0C7E21-3B4D-4F6A-8C9E-0D1F2A3B4C01"
    assert preempt.attributes[A + "recommendation_lead_seconds"] == pytest.approx(38.0)


class RefusingExporter(InMemoryLogRecordExporter):
    """Fails every batch, saying why on the OTLP HTTP log exporter's own logger, as the real one does."""

    def export(self, batch: Any) -> LogRecordExportResult:
        logging.getLogger("opentelemetry.exporter.otlp.proto.http._log_exporter").warning(
            "Failed to export logs batch code: 503, reason: collector overloaded")
        return LogRecordExportResult.FAILURE


def test_a_failing_log_exporter_is_counted_and_said_once_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    """Every failed record is counted; the sidecar logs one line naming the exporter's reason, and the exporter's
    own per-batch lines stay out of the log."""
    scenario = scenarios.load("live-migration")
    registry = CollectorRegistry()
    sink = EventLogSink(Settings(), registry, RefusingExporter())
    identity = VmIdentity(name=scenario.vm["name"], vm_id=scenario.vm["vmId"])
    records: Mapping[str, EventRecord] = {}
    with processwide.restored(), caplog.at_level(logging.INFO):
        for incarnation, t in enumerate((0.0, *key_times(scenario)), start=1):
            document = document_at(scenario, t + 0.01, incarnation)
            step = diff(records, document, EPOCH + t + 0.01)
            records = step.records
            sink.on_change(DocumentChange(b"", document, step.transitions, step.records, EPOCH + t + 0.01,
                                       scenario.vm["name"], identity, "2024-07-09"))
            sink.force_flush()
        sink.shutdown()
    assert registry.get_sample_value("azure_scheduled_events_log_record_export_errors_total") == 3.0
    failing = [r.getMessage() for r in caplog.records if "log record export failing" in r.getMessage()]
    assert len(failing) == 1 and "collector overloaded" in failing[0]
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
