"""The sidecar process with ``--api-version auto`` against the simulator, exporting transitions as OpenTelemetry log
records (and spans) over OTLP/HTTP and OTLP/gRPC to the suite's receiver."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from urllib.parse import parse_qs

import pytest

from se_exporter.sidecar.sinks.spans import trace_id_for
from tests.conftest import SimulatorFactory
from tests.support.helpers import Sidecar, caught_up, step_through, wait_until
from tests.support.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.integration
FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2")
A = "azure.scheduled_event."
RECOMMENDATION = "5A0C7E21-3B4D-4F6A-8C9E-0D1F2A3B4C01"
PREEMPT = "5A0C7E21-3B4D-4F6A-8C9E-0D1F2A3B4C02"


def otlp(receiver: OtlpReceiver, protocol: str) -> dict[str, str]:
    endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_BLRP_SCHEDULE_DELAY": "100"}


def asked(sim: object) -> list[str]:
    return [parse_qs(r.query)["api-version"][0] for r in sim.requests  # type: ignore[attr-defined]
            if r.path == "/metadata/scheduledevents"]


def api_version(process: Sidecar) -> str | None:
    return next((dict(labels)["api_version"] for name, labels in process.samples()
                 if name == "azure_scheduled_events_build_info"), None)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_served_newest_version_shows_the_recommendation_and_logs_each_transition(
        protocol: str, simulator: SimulatorFactory, sidecar: Callable[..., Sidecar], receiver: OtlpReceiver) -> None:
    """IMDS serving 2024-07-09: the sidecar uses it, shows the SpotRebalanceRecommendation, links and times the
    Preempt after it, and the receiver gets one log record with event.name per transition, in the event's trace
    (the trace of its spans), with cloud.platform azure.vm."""
    sim, server = simulator("spot-rebalance", held=True)
    process = sidecar("--imds-url", server.url, *FAST, env=otlp(receiver, protocol))
    step_through(sim, process)
    assert api_version(process) == "2024-07-09"
    assert set(asked(sim)) == {"2024-07-09"}
    assert process.total("azure_scheduled_events_transitions_total", event_type="SpotRebalanceRecommendation",
                         transition="scheduled") == 1.0
    assert process.value("azure_scheduled_events_spot_rebalance_to_preempt_seconds_count") == 1.0
    expected = [(RECOMMENDATION, "scheduled"), (PREEMPT, "scheduled"), (PREEMPT, "started"),
                (RECOMMENDATION, "canceled"), (PREEMPT, "completed")]
    records = wait_until(lambda: len(receiver.events(A)) >= len(expected) and receiver.events(A), timeout=15,
                         what="a log record per transition")
    assert sorted((r.attributes[A + "id"], r.event_name) for r in records) == sorted(
        (event_id, A + kind) for event_id, kind in expected)
    assert {r.transport for r in records} == {"grpc" if protocol == "grpc" else "http"}
    roots = wait_until(lambda: len(receiver.named("scheduled_event")) == 2 and receiver.named("scheduled_event"),
                       timeout=15, what="both root spans")
    root_of = {root.attributes[A + "id"]: root for root in roots}
    for record in records:
        event_id = record.attributes[A + "id"]
        assert record.trace_id == f"{trace_id_for(event_id):032x}" == root_of[event_id].trace_id
        assert record.span_id == root_of[event_id].span_id
        assert record.resource["cloud.platform"] == "azure.vm"
        assert record.resource["cloud.account.id"] == sim.vm["subscriptionId"]
    (preempt,) = [r for r in records if r.event_name == A + "scheduled" and r.attributes[A + "type"] == "Preempt"]
    assert preempt.attributes[A + "follows_recommendation_id"] == RECOMMENDATION


def test_a_vm_without_the_newest_version_falls_back_and_shows_every_event(
        simulator: SimulatorFactory, sidecar: Callable[..., Sidecar], receiver: OtlpReceiver) -> None:
    """IMDS answering 404 for 2024-07-09: the sidecar falls back to 2020-07-01 without a failed poll, polls on,
    shows the Preempt and its transitions, and never the recommendation; no false transition."""
    sim, server = simulator("spot-rebalance-unserved", held=True)
    process = sidecar("--imds-url", server.url, *FAST, env=otlp(receiver, "http/protobuf"))
    step_through(sim, process)
    assert api_version(process) == "2020-07-01"
    versions = asked(sim)
    assert versions[0] == "2024-07-09" and set(versions[1:]) == {"2020-07-01"}
    assert process.value("azure_scheduled_events_polls_total", outcome="http_error") is None  # never counted
    transitions = {(dict(labels)["event_type"], dict(labels)["transition"]): value
                   for (name, labels), value in process.samples().items()
                   if name == "azure_scheduled_events_transitions_total" and value}
    assert transitions == {("Preempt", "scheduled"): 1.0, ("Preempt", "started"): 1.0, ("Preempt", "completed"): 1.0}
    assert "does not serve Scheduled Events api-version 2024-07-09" in process.log()
    records = wait_until(lambda: len(receiver.events(A)) >= 3 and receiver.events(A), timeout=15,
                         what="the Preempt's three log records")
    assert [r.event_name for r in records] == [A + "scheduled", A + "started", A + "completed"]


def test_switching_versions_mid_run_makes_no_false_transition(
        simulator: SimulatorFactory, sidecar: Callable[..., Sidecar]) -> None:
    """IMDS stops serving 2024-07-09 while the recommendation is listed: the sidecar switches to 2020-07-01 without
    a failed poll and without ending the recommendation, and keeps following the Preempt."""
    sim, server = simulator("spot-rebalance", held=True)
    process = sidecar("--imds-url", server.url, *FAST)
    caught_up(sim, process)
    sim.advance(3)
    caught_up(sim, process)
    request = urllib.request.Request(f"{server.url}/_simulator/versions", method="POST",
                                     data=json.dumps({"newest": "2020-07-01"}).encode())
    with urllib.request.urlopen(request, timeout=5):
        pass
    wait_until(lambda: api_version(process) == "2020-07-01", what="the switch to 2020-07-01")
    sim.advance(38)
    caught_up(sim, process)
    assert process.total("azure_scheduled_events_pending", event_type="SpotRebalanceRecommendation",
                         event_status="Scheduled") == 1.0
    assert process.total("azure_scheduled_events_transitions_total", event_type="SpotRebalanceRecommendation",
                         transition="canceled") is None  # never counted: no series
    assert process.total("azure_scheduled_events_transitions_total", event_type="Preempt",
                         transition="scheduled") == 1.0
    assert process.value("azure_scheduled_events_polls_total", outcome="http_error") is None  # never counted
    assert "api-version in use: 2020-07-01 (was 2024-07-09)" in process.log()


def test_started_without_scheduled_is_one_transition_with_zero_notice(
        simulator: SimulatorFactory, sidecar: Callable[..., Sidecar], receiver: OtlpReceiver) -> None:
    """An auto-approved user reboot (Started at first sight): one started transition, no scheduled one, the notice
    histogram's zero bucket, and one log record saying it skipped Scheduled."""
    sim, server = simulator("auto-approved", held=True)
    process = sidecar("--imds-url", server.url, *FAST, env=otlp(receiver, "grpc"))
    step_through(sim, process, until=3)
    assert process.total("azure_scheduled_events_transitions_total", event_type="Reboot", transition="started") == 1.0
    assert process.total("azure_scheduled_events_transitions_total", event_type="Reboot",
                         transition="scheduled") is None  # never counted: no series
    assert process.total("azure_scheduled_events_notice_seconds_bucket", event_type="Reboot", le="0.0") == 1.0
    (record,) = wait_until(lambda: receiver.events(A), timeout=15, what="the started record")
    assert (record.event_name, record.attributes[A + "skipped_scheduled"], record.attributes[A + "notice_seconds"]) \
        == (A + "started", True, 0.0)
