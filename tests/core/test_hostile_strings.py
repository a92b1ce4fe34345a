"""A string no UTF-8 encoder takes (an unpaired surrogate, a valid JSON escape) and control characters, in every
field IMDS hands us, through every output: spans exported over OTLP, the forward file, logs and /metrics (the last
two in test_logs.py and test_app.py). The model hands out encodable strings; the raw bytes are forwarded as sent."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from prometheus_client import CollectorRegistry

from se_exporter.core.lifecycle import diff
from se_exporter.core.model import VmIdentity, parse_document
from se_exporter.sidecar.forwarding.envelope import Sequencer
from se_exporter.sidecar.forwarding.forward import ForwardMetrics, ForwardSink
from se_exporter.sidecar.forwarding.forward_file import FileTarget
from se_exporter.sidecar.sinks import DocumentChange
from se_exporter.sidecar.sinks.spans import EventIdGenerator, SpanSink, trace_id_for
from se_exporter.sidecar.sinks.tracing import span_line
from tests.conftest import Reliability
from tests.support.helpers import wait_until
from tests.support.otlp_receiver import OtlpReceiver

A = "azure.scheduled_event."
# Exactly as IMDS could send it: JSON escapes of lone surrogates and of control characters, and a CRLF layout.
RAW = (b'{"DocumentIncarnation": 4,\r\n "Events": [{"EventId": "LLLL-\\ud800", "EventType": "Freeze",'
       b' "EventStatus": "Scheduled", "Resources": ["vm0\\udc00", "x\\u001b[2J\\n"], "Description": "d\\ud83d",'
       b' "EventSource": "Platform\\u2028", "ResourceType": "VirtualMachine\\ud800"}]}')
IDENTITY = VmIdentity.from_compute({"name": "vm\ud800", "vmId": "id-\udfff", "location": "west\x1beurope"})


def change(now: float, raw: bytes = RAW) -> DocumentChange:
    document = parse_document(raw)
    step = diff({}, document, now)
    return DocumentChange(raw, document, step.transitions, step.records, now, IDENTITY.name, IDENTITY, "2020-07-01")


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    server = OtlpReceiver()
    yield server
    server.close()


def test_spans_with_unencodable_strings_reach_an_otlp_receiver(receiver: OtlpReceiver) -> None:
    """The official OTLP/HTTP exporter delivers the update span of such an event, its attributes spelt out, in the
    trace of the (lower-cased, written-out) EventId."""
    provider = TracerProvider(id_generator=(ids := EventIdGenerator()))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.http_endpoint + "/v1/traces",
                                                                     timeout=5)))
    SpanSink(provider, ids, None).on_change(change(1_795_000_000.0))
    provider.shutdown()
    spans = wait_until(lambda: receiver.named("scheduled_event.update"), what="the update span")
    attributes = spans[0].attributes
    assert attributes[A + "id"] == "LLLL-\\ud800"
    assert attributes[A + "resources"] == ["vm0\\udc00", "x\x1b[2J\n"]
    assert attributes[A + "description"] == "d\\ud83d"
    assert spans[0].trace_id == format(trace_id_for("LLLL-\\ud800"), "032x")


def test_the_forward_file_carries_the_exact_bytes_and_encodable_properties(tmp_path: Path) -> None:
    """The file line parses as JSON; its body is the raw text byte for byte; the properties from compute metadata
    are spelt out rather than breaking the line."""
    metrics = ForwardMetrics(CollectorRegistry())
    target = FileTarget(tmp_path / "documents.jsonl", metrics)
    sink = ForwardSink(Sequencer(tmp_path / "state"), [target], metrics)
    sink.on_change(change(1_795_000_000.0))
    sink.shutdown(5)  # written (by the sink's worker) and closed
    lines = (tmp_path / "documents.jsonl").read_bytes().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["body"].encode("utf-8") == RAW
    assert record["properties"]["vm_name"] == "vm\\ud800"
    assert record["properties"]["vm_id"] == "id-\\udfff"
    assert record["partition_key"] == "id-\\udfff"


FORGING = (b'{"DocumentIncarnation": 5, "Events": [{"EventId": "E1\\n2026-01-01T00:00:00.000Z span forged\\u001b[31m'
           b'\\u2028\\u0085\\u202e", "EventType": "Freeze\\r", "EventStatus": "Scheduled", "Resources": ["vm0"]}]}')


def test_console_span_lines_stay_one_line_and_show_escapes(reliability: Reliability) -> None:
    """The SDK's ConsoleSpanExporter with the sidecar's text formatter writes each span of an event whose EventId
    holds a newline, an ANSI escape, U+2028, NEL and a bidi override as one line, the characters written as visible
    escapes as log lines are (docs/architecture.md 'Log lines stay lines'): nothing forged, nothing sent to the
    terminal."""
    out = io.StringIO()
    provider = TracerProvider(id_generator=(ids := EventIdGenerator()))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=span_line)))
    SpanSink(provider, ids, None).on_change(change(1_795_000_000.0, FORGING))
    provider.shutdown()
    lines = out.getvalue().split("\n")
    assert lines[-1] == "" and len(lines) > 1
    for line in lines[:-1]:
        assert " span " in line and not set(line) & set("\r\x1b\u2028\x85\u202e"), repr(line)
    assert "E1\\n2026-01-01T00:00:00.000Z span forged\\x1b[31m\\u2028\\x85\\u202e" in out.getvalue()
    assert "Freeze\\r" in out.getvalue()
    reliability("Security", "newline, CR, ANSI escape, U+2028, NEL and a bidi override in an EventId and EventType, "
                "printed by --otel-traces-exporter console", "each span one line, the characters shown as escapes")
