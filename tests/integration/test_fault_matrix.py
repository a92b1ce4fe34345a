"""The fault matrix: for every fault, the process lives, the fault shows in a metric and in one log line, and
the sidecar recovers on the next good poll. Each proven row lands in the README's Reliability table."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.faults import Fault
from se_exporter.simulator.server import Simulator, start
from tests.conftest import Reliability, SimulatorFactory
from tests.helpers import Sidecar, free_port, wait_until

pytestmark = pytest.mark.integration
FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2", "--imds-timeout", "0.5")

# (what a person would call the fault, the simulator fault, the outcome label it must be counted under)
IMDS_FAULTS = [
    ("429 with Retry-After", Fault("throttle", status=429, retry_after="1", count=0), "throttled"),
    ("429 without Retry-After", Fault("throttle", status=429, count=0), "throttled"),
    ("HTTP 500", Fault("status", status=500, count=0), "http_error"),
    ("HTTP 503", Fault("status", status=503, count=0), "http_error"),
    ("malformed JSON", Fault("malformed", count=0), "invalid_document"),
    ("HTML from a captive proxy", Fault("non_json", count=0), "invalid_document"),
    ("JSON that is not a document", Fault("invalid", count=0), "invalid_document"),
    ("empty body", Fault("empty", count=0), "invalid_document"),
    ("10 MB body (refused unread)", Fault("huge", count=0), "invalid_document"),
    ("no answer (timeout)", Fault("hang", seconds=2, count=0), "timeout"),
    ("slow answers beyond the timeout", Fault("delay", seconds=1.5, count=0), "timeout"),
    ("connection reset", Fault("reset", count=0), "connection_error"),
]


@pytest.mark.parametrize(("name", "fault", "outcome"), IMDS_FAULTS, ids=[f[0] for f in IMDS_FAULTS])
def test_imds_fault(name: str, fault: Fault, outcome: str, simulator: SimulatorFactory,
                    sidecar: Callable[..., Sidecar], reliability: Reliability) -> None:
    """During the fault: alive, up 0, outcome counted, last state kept, one log line; after it: up 1 again."""
    sim, server = simulator("live-migration")
    sim.advance(10)  # a Scheduled Freeze is listed
    process = sidecar("--imds-url", server.url, *FAST)
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="first document")
    sim.inject(fault)
    wait_until(lambda: process.value("azure_scheduled_events_up") == 0, what="up to drop")
    wait_until(lambda: (process.value("azure_scheduled_events_polls_total", outcome=outcome) or 0) >= 2,
               timeout=15, what=f"{outcome} counted")
    assert process.process.poll() is None
    assert process.value("azure_scheduled_events_pending", event_type="Freeze", event_status="Scheduled") == 1
    sim.clear_faults()
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, timeout=15, what="recovery")
    failures = re.findall(r"IMDS poll failed: .*", process.log())
    assert len(failures) == 1, failures
    assert len(re.findall(r"IMDS recovered after \d+ failed polls", process.log())) == 1
    assert process.value("azure_scheduled_events_transitions_total", event_type="Freeze",
                         transition="canceled") == 0
    reliability("IMDS", name, f"alive; `up` 0 with the last state kept; `outcome=\"{outcome}\"`; one log line; "
                              "recovered on the next good poll")


def test_redirect_to_another_port(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                  reliability: Reliability) -> None:
    """A 302 to another simulator is counted as http_error and the other one never hears from us."""
    sim, server = simulator("live-migration")
    other, other_server = simulator("host-failure")
    process = sidecar("--imds-url", server.url, *FAST)
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="first document")
    sim.inject(Fault("redirect", location=other_server.url + "/metadata/scheduledevents?api-version=2020-07-01",
                     count=0))
    wait_until(lambda: (process.value("azure_scheduled_events_polls_total", outcome="http_error") or 0) >= 3,
               what="redirects counted")
    assert len(re.findall(r"IMDS poll failed: HTTP 302 redirect to", process.log())) == 1
    assert list(other.requests) == []
    sim.clear_faults()
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="recovery")
    reliability("IMDS", "302 redirect to another port", "not followed (the target saw no request); "
                                                         "`outcome=\"http_error\"`; one log line; recovered")


def test_slow_first_call(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                         reliability: Reliability) -> None:
    """The first call may take long (the service switching on): it is not cut off by --imds-timeout."""
    sim, server = simulator("live-migration")
    sim.inject(Fault("first_call_delay", seconds=1.0))
    process = sidecar("--imds-url", server.url, "--poll-interval", "0.05", "--imds-timeout", "0.3",
                      "--first-call-timeout", "10")
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="slow first document")
    assert process.value("azure_scheduled_events_polls_total", outcome="timeout") == 0
    reliability("IMDS", "slow first call (1 s, timeout 0.3 s)", "waited for with --first-call-timeout; no timeout")


def test_connection_refused_then_imds_appears(sidecar: Callable[..., Sidecar], reliability: Reliability) -> None:
    """Refused connections are counted; once IMDS listens on that port, the next poll recovers."""
    port = free_port()
    process = sidecar("--imds-url", f"http://127.0.0.1:{port}", *FAST)
    wait_until(lambda: (process.value("azure_scheduled_events_polls_total", outcome="connection_error") or 0) >= 1,
               what="refused counted")
    assert len(re.findall(r"IMDS poll failed: .*", process.log())) == 1
    late_sim = Simulator(scenarios.load("host-failure"))
    late = start(late_sim, "127.0.0.1", port)
    try:
        wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="recovery")
    finally:
        late.shutdown()
        late.server_close()
    assert late_sim.posts_from("se-exporter") == 0
    reliability("IMDS", "connection refused", "alive; `outcome=\"connection_error\"`; one log line; "
                                             "recovered when IMDS appeared")


def test_otlp_endpoint_down(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                            reliability: Reliability) -> None:
    """With the OTLP endpoint down, events still flow to /metrics, export errors are counted and logged once,
    and shutdown stays prompt."""
    sim, server = simulator("host-failure")
    process = sidecar("--imds-url", server.url, *FAST, env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    for t in (3, 303):
        sim.advance(max(0.0, t - sim.scenario_time()))
        incarnation = sim.document()["DocumentIncarnation"]
        wait_until(lambda wanted=incarnation: process.value("azure_scheduled_events_document_incarnation") == wanted,
                   what="document read")
    assert process.value("azure_scheduled_events_transitions_total", event_type="Reboot", transition="completed") == 1
    wait_until(lambda: (process.value("azure_scheduled_events_span_export_errors_total") or 0) > 0, timeout=20,
               what="span export errors counted")
    assert len(re.findall(r"span export failing", process.log())) == 1
    assert process.stop() == 0
    reliability("OpenTelemetry", "OTLP endpoint down", "metrics and logs unaffected; "
                                                       "`span_export_errors_total` counted; one log line; exit 0")
