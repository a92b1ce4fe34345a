"""A pause told by each output: the span in its event's trace, the OpenTelemetry log record (announced or not), the
log line, and the longest pause on the event's root span when it ends."""

from __future__ import annotations

import json
import logging

import pytest
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from se_exporter.core import pause
from se_exporter.core.lifecycle import EventRecord, diff
from se_exporter.core.model import VmIdentity, parse_document
from se_exporter.sidecar.settings import Settings
from se_exporter.sidecar.sinks import DocumentChange, PauseFelt
from se_exporter.sidecar.sinks.eventlog import LogSink
from se_exporter.sidecar.sinks.otel_events import EventLogSink
from se_exporter.sidecar.sinks.spans import EventIdGenerator, SpanSink, span_id_for, trace_id_for

A = "azure.scheduled_event."
FREEZE = {"EventId": "F1", "EventStatus": "Started", "EventType": "Freeze", "ResourceType": "VirtualMachine",
          "Resources": ["vm0"], "NotBefore": "", "EventSource": "Platform", "DurationInSeconds": 5}
IDENTITY = VmIdentity(name="vm0", vm_id="id-0")
BEGAN = 1_795_000_100.0


def documents() -> tuple[DocumentChange, DocumentChange]:
    """The Freeze listed Started, then gone, with a pause of 2 s folded into its record in between."""
    listed = parse_document(json.dumps({"DocumentIncarnation": 1, "Events": [FREEZE]}).encode())
    step = diff({}, listed, BEGAN - 10)
    first = DocumentChange(b"", listed, step.transitions, step.records, BEGAN - 10, "vm0", IDENTITY, "2024-07-09")
    records = pause.fold(step.records, [pause.Pause(5.0, 2.0, "f1", "Freeze")])
    gone = parse_document(b'{"DocumentIncarnation": 2, "Events": []}')
    ended = diff(records, gone, BEGAN + 10)
    return first, DocumentChange(b"", gone, ended.transitions, ended.records, BEGAN + 10, "vm0", IDENTITY,
                                 "2024-07-09")


def felt(record: EventRecord | None, seconds: float = 2.0, throttled: bool = False) -> PauseFelt:
    key, event_type = (record.event.key, record.event.event_type) if record else (None, pause.UNANNOUNCED)
    return PauseFelt(pause.Pause(5.0, seconds, key, event_type, throttled), record, BEGAN, "vm0", IDENTITY)


def test_the_pause_span_is_in_its_events_trace_under_its_root_and_lasts_the_pause() -> None:
    exporter = InMemorySpanExporter()
    ids = EventIdGenerator()
    provider = TracerProvider(id_generator=ids)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = SpanSink(provider, ids, None)
    first, gone = documents()
    sink.on_change(first)
    record = pause.fold(first.records, [pause.Pause(5.0, 2.0, "f1", "Freeze")])["f1"]
    sink.on_pause(felt(record))
    sink.on_pause(felt(None))  # unannounced: no trace to put it in
    sink.on_pause(felt(record, throttled=True))  # throttling is not the VM's pause
    sink.on_change(gone)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    span = spans["scheduled_event.pause"]
    assert [s.name for s in exporter.get_finished_spans()].count("scheduled_event.pause") == 1
    assert span.context.trace_id == trace_id_for("F1")
    assert span.parent is not None and span.parent.span_id == span_id_for("F1", "id-0/vm0", "root")
    assert (span.start_time, span.end_time) == (int(BEGAN * 1e9), int(BEGAN * 1e9) + 2_000_000_000)
    assert span.attributes[A + "pause_seconds"] == 2.0
    assert span.attributes[A + "type"] == "Freeze"
    assert spans["scheduled_event"].attributes[A + "longest_pause_seconds"] == 2.0


def test_every_pause_is_one_log_record_an_unannounced_one_in_no_trace() -> None:
    exporter = InMemoryLogRecordExporter()
    sink = EventLogSink(Settings(), CollectorRegistry(), exporter)
    first, _ = documents()
    sink.on_change(first)
    sink.on_pause(felt(first.records["f1"]))
    sink.on_pause(felt(None, 3.0))
    assert sink.force_flush()
    announced, unannounced = [r.log_record for r in exporter.get_finished_logs()][1:]
    assert announced.event_name == unannounced.event_name == A + "pause"
    assert announced.trace_id == trace_id_for("F1")
    assert announced.attributes[A + "pause_seconds"] == 2.0
    assert announced.attributes[A + "id"] == "F1"
    assert not unannounced.trace_id
    assert unannounced.attributes[A + "pause_seconds"] == 3.0
    assert A + "id" not in unannounced.attributes
    sink.shutdown()


def test_the_log_line_says_whose_pause_it_was(caplog: pytest.LogCaptureFixture) -> None:
    first, _ = documents()
    with caplog.at_level(logging.WARNING, "se_exporter.events"):
        LogSink().on_pause(felt(first.records["f1"]))
        LogSink().on_pause(felt(None, 3.0))
    assert [r.getMessage() for r in caplog.records] == [
        "the VM (or this process) was paused for 2.00 s, while Freeze F1 was Started",
        "the VM (or this process) was paused for 3.00 s, with no event of this VM listed (unannounced)"]
