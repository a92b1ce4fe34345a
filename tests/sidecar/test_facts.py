"""A transition's facts read the same in every output that tells a person: the log line, the update span and the
OpenTelemetry log record (sinks/facts.py): the same times (ISO 8601, ``Z``) and the same seconds."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from se_exporter.core import spot
from se_exporter.core.lifecycle import EventRecord, diff
from se_exporter.core.model import VmIdentity
from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks import DocumentChange
from se_exporter.sidecar.sinks.eventlog import LogSink
from se_exporter.sidecar.sinks.otel_events import EventLogSink
from se_exporter.sidecar.sinks.spans import EventIdGenerator, SpanSink, attribute_name
from se_exporter.simulator import scenario as scenarios
from tests.sidecar.test_spans import EPOCH, document_at
from tests.support.helpers import key_times

A = "azure.scheduled_event."


def told(name: str, caplog: pytest.LogCaptureFixture) -> tuple[list[dict[str, Any]], list[Mapping[str, Any]],
                                                                  list[Mapping[str, Any]]]:
    """The scenario walked through the three sinks at once: the log lines' fields, the update spans' attributes
    and the log records' attributes, each in the order the transitions came."""
    scenario = scenarios.load(name)
    spans, records = InMemorySpanExporter(), InMemoryLogRecordExporter()
    ids = EventIdGenerator()
    provider = TracerProvider(id_generator=ids)
    provider.add_span_processor(SimpleSpanProcessor(spans))
    sinks = [LogSink(), SpanSink(provider, ids, None), EventLogSink(Settings(), CollectorRegistry(), records)]
    identity = VmIdentity(name=scenario.vm["name"], vm_id=scenario.vm["vmId"])
    current: Mapping[str, EventRecord] = {}
    ended: Mapping[str, EventRecord] = {}
    with caplog.at_level(logging.INFO, logger="se_exporter.events"):
        for incarnation, t in enumerate((0.0, *key_times(scenario)), start=1):
            document = document_at(scenario, t + 0.01, incarnation)
            step = diff(current, document, EPOCH + t + 0.01, ended)
            current, ended = step.records, step.ended
            follows = spot.links(step.transitions, step.records, step.ended)
            change = DocumentChange(b"", document, step.transitions, step.records, EPOCH + t + 0.01,
                                    scenario.vm["name"], identity, "2024-07-09", follows)
            for sink in sinks:
                sink.on_change(change)
    sinks[2].force_flush()
    lines = [dict(record.se_fields) for record in caplog.records if record.name == "se_exporter.events"]
    updates = [span.attributes or {} for span in spans.get_finished_spans()
               if span.name == "scheduled_event.update" and (span.attributes or {})[A + "transition"] != "changed"]
    return lines, updates, [r.log_record.attributes or {} for r in records.get_finished_logs()]


def _one(value: Any) -> Any:
    """A list as OpenTelemetry keeps it (a tuple)."""
    return tuple(value) if isinstance(value, list) else value


@pytest.mark.parametrize("name", ["demo", "spot-rebalance", "host-failure"])
def test_the_log_line_the_update_span_and_the_log_record_say_the_same(name: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Every fact of every log line (but affects_this_vm, a word there and a boolean in OpenTelemetry) is the
    attribute of the same name, with the same value, on the transition's update span and its log record."""
    lines, updates, records = told(name, caplog)
    assert len(lines) == len(updates) == len(records) > 0
    for line, update, record in zip(lines, updates, records, strict=True):
        said = {attribute_name(fact): _one(value) for fact, value in line.items() if fact != "affects_this_vm"}
        assert said == {key: _one(update[key]) for key in said} == {key: _one(record[key]) for key in said}


def test_times_and_seconds_have_one_form(caplog: pytest.LogCaptureFixture) -> None:
    """Times end in Z in every output; a notice is never below 0 and kept to the millisecond; a moved NotBefore, a
    notice and a recommendation's lead are all said somewhere in the demo."""
    lines, _, _ = told("demo", caplog)
    said = {fact for line in lines for fact in line}
    assert {"not_before", "previous_not_before", "notice_seconds", "impact_seconds"} <= said
    for line in lines:
        for fact in ("not_before", "previous_not_before"):
            if fact in line:
                assert str(line[fact]).endswith("Z") and "+00:00" not in str(line[fact])
        for fact in ("notice_seconds", "impact_seconds", "recommendation_lead_seconds"):
            if fact in line:
                assert line[fact] >= 0 and round(line[fact], 3) == line[fact]
