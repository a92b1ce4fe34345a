"""Lifecycle -> spans with OpenTelemetry's InMemorySpanExporter, for every simulator scenario."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from se_exporter.core.lifecycle import EventRecord, diff
from se_exporter.core.model import Document, ScheduledEvent, VmIdentity, parse_document
from se_exporter.sidecar.settings import Settings, run_settings
from se_exporter.sidecar.sinks import DocumentChange
from se_exporter.sidecar.sinks.spans import EventIdGenerator, SpanSink, span_id_for, trace_id_for
from se_exporter.sidecar.sinks.tracing import resource_attributes
from se_exporter.simulator import scenario as scenarios
from tests.support.helpers import key_times

EPOCH = 1_795_000_000.0
A = "azure.scheduled_event."

# Outcome of every event of every scenario, as a person reading the scenario expects it.
OUTCOMES: dict[str, list[tuple[str, str]]] = {
    "live-migration": [("Freeze", "completed")],
    "user-reboot": [("Reboot", "completed")],
    "redeploy": [("Redeploy", "completed")],
    "canceled": [("Reboot", "canceled")],
    "host-failure": [("Reboot", "completed")],
    "vmss-terminate": [("Terminate", "completed")],
    "spot-preempt": [("Preempt", "completed")],
    "degraded-hardware": [("Redeploy", "completed")],
    "availability-set": [("Reboot", "completed"), ("Reboot", "completed")],
    "spot-rebalance": [("Preempt", "completed"), ("SpotRebalanceRecommendation", "canceled")],
    "auto-approved": [("Reboot", "completed"), ("Redeploy", "completed")],
    "os-image": [("Reboot", "completed")],
    "demo": [("Freeze", "canceled"), ("Freeze", "completed"), ("Preempt", "completed"), ("Reboot", "completed"),
             ("Reboot", "completed"), ("Redeploy", "canceled")],
}


def document_at(scenario: scenarios.Scenario, t: float, incarnation: int) -> Document:
    events = []
    for state in scenario.state_at(t, {}):
        spec = state.spec
        not_before = None if state.not_before is None else datetime.fromtimestamp(EPOCH + state.not_before,
                                                                                  timezone.utc)
        listed = spec.listed
        events.append(ScheduledEvent(state.event_id, spec.event_type, state.status, listed["ResourceType"],
                                     spec.resources, not_before, listed["Description"], listed["EventSource"],
                                     listed["DurationInSeconds"]))
    return Document(incarnation, tuple(events))


def run(name: str, state_dir: Path | None = None) -> list[ReadableSpan]:
    """Walk the scenario's changes through the lifecycle diff and the span sink; return the finished spans."""
    scenario = scenarios.load(name)
    exporter = InMemorySpanExporter()
    ids = EventIdGenerator()
    provider = TracerProvider(id_generator=ids)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = SpanSink(provider, ids, state_dir)
    identity = VmIdentity(name=scenario.vm["name"], vm_id=scenario.vm["vmId"])
    records: Mapping[str, EventRecord] = {}
    for incarnation, t in enumerate((0.0, *key_times(scenario)), start=1):
        document = document_at(scenario, t + 0.01, incarnation)
        step = diff(records, document, EPOCH + t + 0.01)
        records = step.records
        sink.on_change(DocumentChange(b"", document, step.transitions, step.records, EPOCH + t + 0.01,
                                   scenario.vm["name"], identity, "2020-07-01"))
    return list(exporter.get_finished_spans())


@pytest.mark.parametrize("name", sorted(OUTCOMES))
def test_spans_for_scenario(name: str) -> None:
    """Each event gets a root span with its outcome, a notice span, an impact span when it ran, and update
    spans for its transitions, all in the trace derived from its EventId and parented on its root."""
    spans = run(name)
    roots = [s for s in spans if s.name == "scheduled_event"]
    assert sorted((s.attributes[A + "type"], s.attributes[A + "outcome"]) for s in roots) == sorted(OUTCOMES[name])
    for root in roots:
        event_id = str(root.attributes[A + "id"])
        assert root.parent is None
        assert root.context.trace_id == trace_id_for(event_id)
        assert root.status.status_code != StatusCode.ERROR  # a cancelled event is not an error
        children = [s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id]
        assert all(child.context.trace_id == root.context.trace_id for child in children)
        names = sorted(child.name for child in children if child.name != "scheduled_event.update")
        completed = root.attributes[A + "outcome"] == "completed"
        assert names == (["scheduled_event.impact", "scheduled_event.notice"] if completed
                         else ["scheduled_event.notice"])
        updates = [c for c in children if c.name == "scheduled_event.update"]
        assert [u.attributes[A + "transition"] for u in updates] == [e.name for e in root.events]
        assert root.events[-1].name == root.attributes[A + "outcome"]
        assert root.start_time is not None and root.end_time is not None and root.start_time < root.end_time


def test_attributes_of_the_documented_example() -> None:
    """The live-migration root span carries the contract attributes with the values of the docs' example."""
    (root,) = [s for s in run("live-migration") if s.name == "scheduled_event"]
    assert dict(root.attributes) == {
        A + "id": "C7061BAC-AFDC-4513-B24B-AA5F13A16123", A + "type": "Freeze", A + "status": "Started",
        A + "resources": ("WestNO_0", "WestNO_1"), A + "source": "Platform", A + "resource_type": "VirtualMachine",
        A + "description": "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
        A + "duration_seconds": 5, A + "document_incarnation": 4, A + "affects_this_vm": True,
        A + "outcome": "completed", A + "longest_pause_seconds": 0.0}
    notice = next(s for s in run("live-migration") if s.name == "scheduled_event.notice")
    assert notice.end_time is not None and notice.start_time is not None
    assert (notice.end_time - notice.start_time) / 1e9 == pytest.approx(900.0)


def test_a_wall_clock_stepped_back_never_ends_a_span_before_it_began() -> None:
    """The wall clock stepped back an hour between first sight and start: each span starts at the wall clock's
    reading and lasts what the monotonic clock measured (30 s of notice, 7 s of impact), never a negative time."""
    exporter = InMemorySpanExporter()
    ids = EventIdGenerator()
    provider = TracerProvider(id_generator=ids)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = SpanSink(provider, ids, None)
    scenario = scenarios.load("live-migration")
    records: Mapping[str, EventRecord] = {}
    for incarnation, (t, wall, elapsed) in enumerate([(3.0, EPOCH, 100.0), (903.0, EPOCH - 3600 + 30, 130.0),
                                                       (934.0, EPOCH - 3600 + 37, 137.0)], start=1):
        document = document_at(scenario, t, incarnation)
        step = diff(records, document, wall, elapsed=elapsed)
        records = step.records
        sink.on_change(DocumentChange(b"", document, step.transitions, step.records, wall, "WestNO_0", None,
                                   "2020-07-01"))
    spans = {span.name: span for span in exporter.get_finished_spans() if span.name != "scheduled_event.update"}
    lengths = {name: ((span.end_time or 0) - (span.start_time or 0)) / 1e9 for name, span in spans.items()}
    assert lengths == pytest.approx({"scheduled_event.notice": 30.0, "scheduled_event.impact": 7.0,
                                     "scheduled_event": 37.0})
    assert spans["scheduled_event"].start_time == int(EPOCH * 1e9)  # the timestamp as the wall clock read it


def test_host_failure_has_a_zero_notice_span() -> None:
    """Started at first sight: the notice span exists and lasts 0 s, which is the point."""
    notice = next(s for s in run("host-failure") if s.name == "scheduled_event.notice")
    assert notice.start_time == notice.end_time


def test_reschedule_is_a_span_event_with_both_times() -> None:
    """A moved NotBefore shows on the update span and as a root span event, with the previous time."""
    spans = run("canceled")
    update = next(s for s in spans if s.name == "scheduled_event.update"
                  and s.attributes[A + "transition"] == "rescheduled")
    assert update.attributes[A + "previous_not_before"] < update.attributes[A + "not_before"]  # type: ignore[operator]
    root = next(s for s in spans if s.name == "scheduled_event")
    assert [e.name for e in root.events] == ["scheduled", "rescheduled", "canceled"]


def test_other_vms_events_say_so() -> None:
    """Events for a neighbour carry affects_this_vm = false."""
    roots = {s.attributes[A + "id"]: s for s in run("availability-set") if s.name == "scheduled_event"}
    assert roots["F1A3B5C7-D9E0-4F2A-8B4C-6D8E0F1A3B08"].attributes[A + "affects_this_vm"] is False
    assert roots["0B2C4D6E-8F0A-4B1C-9D3E-5F7A9B1C2D09"].attributes[A + "affects_this_vm"] is True


def test_trace_id_derivation_is_the_documented_one() -> None:
    """trace id = first 16 bytes of SHA-256 of the lower-cased EventId (what the README tells consumers)."""
    event_id = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
    expected = hashlib.sha256(event_id.lower().encode()).hexdigest()[:32]
    assert f"{trace_id_for(event_id):032x}" == expected
    assert trace_id_for(event_id.lower()) == trace_id_for(event_id)
    assert span_id_for(event_id, "vm-a", "root") != span_id_for(event_id, "vm-b", "root")


def test_span_events_survive_a_restart(tmp_path: Path) -> None:
    """Span events gathered before a restart end up on the root span emitted after it."""
    scenario = scenarios.load("canceled")
    ids = EventIdGenerator()
    exporter = InMemorySpanExporter()
    identity = VmIdentity(name="WestNO_0", vm_id="vm-id")

    def sink() -> SpanSink:
        provider = TracerProvider(id_generator=ids)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return SpanSink(provider, ids, tmp_path)

    first = sink()
    records: Mapping[str, EventRecord] = {}
    for incarnation, t in enumerate((10.0, 130.0), start=1):
        document = document_at(scenario, t, incarnation)
        step = diff(records, document, EPOCH + t)
        records = step.records
        first.on_change(DocumentChange(b"", document, step.transitions, records, EPOCH + t, "WestNO_0", identity, ""))
    second = sink()  # a new process: only the state directory carries over
    document = document_at(scenario, 400.0, 3)
    step = diff(records, document, EPOCH + 400)
    second.on_change(DocumentChange(b"", document, step.transitions, step.records, EPOCH + 400, "WestNO_0", identity,
                                    ""))
    root = next(s for s in exporter.get_finished_spans() if s.name == "scheduled_event")
    assert [e.name for e in root.events] == ["scheduled", "rescheduled", "canceled"]
    assert root.start_time == int((EPOCH + 10.0) * 1e9)
    assert root.context.span_id == span_id_for(root.attributes[A + "id"], "vm-id/WestNO_0", "root")  # type: ignore[arg-type]


def test_resource_uses_the_current_semantic_conventions() -> None:
    """The resource is filled from compute metadata under the current semantic-convention names (cloud.platform
    azure.vm, the subscription as cloud.account.id), plus the Azure detector's scale set and SKU keys."""
    identity = VmIdentity(name="WestNO_0", vm_id="id-1", vmss_name="ss", location="norwayeast", vm_size="D2",
                          resource_id="/subscriptions/s/x", sku="22_04-lts", os_type="Linux", os_version="22.04",
                          subscription_id="sub-1", resource_group="rg-1")
    attributes = Resource.create(resource_attributes(Settings(), identity)).attributes
    assert {key: attributes[key] for key in (
        "service.name", "cloud.provider", "cloud.platform", "cloud.region", "cloud.resource_id", "host.id",
        "host.name", "host.type", "azure.vm.scaleset.name", "azure.vm.sku", "cloud.account.id",
        "azure.resource_group.name")} == {
        "service.name": "se-exporter", "cloud.provider": "azure", "cloud.platform": "azure.vm",
        "cloud.region": "norwayeast", "cloud.resource_id": "/subscriptions/s/x", "host.id": "id-1",
        "host.name": "WestNO_0", "host.type": "D2", "azure.vm.scaleset.name": "ss", "azure.vm.sku": "22_04-lts",
        "cloud.account.id": "sub-1", "azure.resource_group.name": "rg-1"}
    assert "k8s.node.name" not in attributes


def test_resource_on_aks_names_the_platform_and_the_node() -> None:
    """In a Kubernetes pod with K8S_NODE_NAME from the downward API, cloud.platform is azure.aks and k8s.node.name
    the node's name."""
    settings = run_settings(argparse.Namespace(), {"KUBERNETES_SERVICE_HOST": "10.0.0.1",
                                                   "K8S_NODE_NAME": "aks-pool-12345-vmss000002"})
    attributes = Resource.create(resource_attributes(settings, VmIdentity(vm_id="id-1"))).attributes
    assert (attributes["cloud.platform"], attributes["k8s.node.name"], attributes["host.id"]) == (
        "azure.aks", "aks-pool-12345-vmss000002", "id-1")


@pytest.mark.parametrize(("exporter", "protocol", "absent"), [
    ("none", "http/protobuf", "opentelemetry"),
    ("otlp", "http/protobuf", "grpc"),
    ("otlp", "http/protobuf", "httpcore"),  # IMDS goes through our http.client transport
    ("none", "http/protobuf", "httpx"),  # ... asked with plain values
    ("none", "http/protobuf", "aiohttp"),  # the HTTP server is h11 on asyncio (se_exporter/infra/http_server.py)
    ("otlp", "http/protobuf", "se_exporter.simulator.server"),
])
def test_unconfigured_exporters_are_not_imported(exporter: str, protocol: str, absent: str) -> None:
    """With OTEL_TRACES_EXPORTER=none nothing of OpenTelemetry is imported; with OTLP/HTTP, no gRPC; and what
    the sidecar does not use (httpx, aiohttp, the simulator) is not loaded."""
    script = (
        "import sys\n"
        "from se_exporter.cli import build_parser\n"
        "from se_exporter.sidecar.settings import run_settings\n"
        "from se_exporter.sidecar.sinks.table import make_forwarding\n"
        f"settings = run_settings(build_parser().parse_args(['run']), {{'OTEL_TRACES_EXPORTER': '{exporter}',"
        f" 'OTEL_EXPORTER_OTLP_PROTOCOL': '{protocol}', 'OTEL_EXPORTER_OTLP_ENDPOINT': 'http://127.0.0.1:9'}})\n"
        "if settings.otel_traces_exporter != 'none':\n"
        "    from se_exporter.sidecar.sinks.tracing import make_tracing\n"
        "    from prometheus_client import CollectorRegistry\n"
        "    make_tracing(settings, None, CollectorRegistry())\n"
        "    assert 'requests' in sys.modules or settings.otel_protocol == 'grpc'\n"
        "from se_exporter.sidecar.transport import KeepAliveTransport\n"
        "KeepAliveTransport()\n"
        f"loaded = sorted(m for m in sys.modules if m == '{absent}' or m.startswith('{absent}.'))\n"
        "print(loaded)\n"
        "sys.exit(1 if loaded else 0)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_megabyte_description_costs_kilobytes_in_spans_and_their_state_file(tmp_path: Path) -> None:
    """Three events with a 1 MiB Description each, NotBefore moved in every document: every attribute of every span
    and span event holds at most 1,024 characters (the Description cut and marked), and spans.json stays small
    (span events carry neither the Description nor the Resources: their span does)."""
    exporter = InMemorySpanExporter()
    ids = EventIdGenerator()
    provider = TracerProvider(id_generator=ids)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = SpanSink(provider, ids, tmp_path)
    huge = "x" * (1 << 20)
    records: Mapping[str, EventRecord] = {}
    for incarnation in range(1, 21):
        not_before = datetime.fromtimestamp(EPOCH + 3600 + 60 * incarnation, timezone.utc)
        body = json.dumps({"DocumentIncarnation": incarnation, "Events": [{
            "EventId": f"E{n}", "EventType": "Freeze", "EventStatus": "Scheduled", "ResourceType": "VirtualMachine",
            "Resources": ["WestNO_0"] * 1000, "NotBefore": not_before.strftime("%a, %d %b %Y %H:%M:%S GMT"),
            "Description": huge, "EventSource": "Platform", "DurationInSeconds": 5} for n in range(3)]})
        document = parse_document(body)
        step = diff(records, document, EPOCH + incarnation)
        records = step.records
        sink.on_change(DocumentChange(b"", document, step.transitions, records, EPOCH + incarnation, "WestNO_0", None,
                                   "2020-07-01"))
    spans = exporter.get_finished_spans()
    assert len(spans) == 60  # one update span per document and event: scheduled, then rescheduled
    for span in spans:
        for value in (span.attributes or {}).values():
            values = value if isinstance(value, tuple) else (value,)
            assert len(values) <= 256 and all(len(str(item)) <= 1024 for item in values)
    assert str(spans[0].attributes[A + "description"]).endswith("...[truncated]")
    assert (tmp_path / "spans.json").stat().st_size < 256 * 1024
