"""The sidecar process against the simulator over real HTTP: scenarios, faults, proxies, endpoints."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from se_exporter.core.lifecycle import TRANSITIONS
from se_exporter.core.model import EVENT_TYPES
from se_exporter.simulator import scenario as scenarios
from se_exporter.simulator.faults import Fault
from se_exporter.simulator.server import Simulator
from tests.conftest import Reliability, SimulatorFactory
from tests.support.child_logs import attach
from tests.support.helpers import Sidecar, free_port, http_get, key_times, series, stop_process, total, wait_until

pytestmark = pytest.mark.integration
FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2", "--imds-timeout", "0.5")

# What a person reading each scenario expects the exporter to count, by (EventType, transition).
EXPECTED: dict[str, dict[tuple[str, str], int]] = {
    "live-migration": {("Freeze", "scheduled"): 1, ("Freeze", "started"): 1, ("Freeze", "completed"): 1},
    "user-reboot": {("Reboot", "scheduled"): 1, ("Reboot", "started"): 1, ("Reboot", "completed"): 1},
    "redeploy": {("Redeploy", "scheduled"): 1, ("Redeploy", "started"): 1, ("Redeploy", "completed"): 1},
    "canceled": {("Reboot", "scheduled"): 1, ("Reboot", "rescheduled"): 1, ("Reboot", "canceled"): 1},
    "host-failure": {("Reboot", "started"): 1, ("Reboot", "completed"): 1},
    "vmss-terminate": {("Terminate", "scheduled"): 1, ("Terminate", "started"): 1, ("Terminate", "completed"): 1},
    "spot-preempt": {("Preempt", "scheduled"): 1, ("Preempt", "started"): 1, ("Preempt", "completed"): 1},
    "degraded-hardware": {("Redeploy", "scheduled"): 1, ("Redeploy", "started"): 1, ("Redeploy", "completed"): 1},
    "availability-set": {("Reboot", "scheduled"): 2, ("Reboot", "started"): 2, ("Reboot", "completed"): 2},
    "demo": {("Freeze", "scheduled"): 2, ("Freeze", "started"): 1, ("Freeze", "completed"): 1,
             ("Freeze", "rescheduled"): 1, ("Freeze", "canceled"): 1,
             ("Reboot", "scheduled"): 1, ("Reboot", "started"): 2, ("Reboot", "completed"): 2,
             ("Preempt", "scheduled"): 1, ("Preempt", "started"): 1, ("Preempt", "completed"): 1,
             ("Redeploy", "scheduled"): 1, ("Redeploy", "canceled"): 1},
    "spot-rebalance": {("SpotRebalanceRecommendation", "scheduled"): 1, ("SpotRebalanceRecommendation", "canceled"): 1,
                       ("Preempt", "scheduled"): 1, ("Preempt", "started"): 1, ("Preempt", "completed"): 1},
    # The VM does not serve 2024-07-09: the recommendation is never seen.
    "spot-rebalance-unserved": {("Preempt", "scheduled"): 1, ("Preempt", "started"): 1, ("Preempt", "completed"): 1},
    # Started at first sight: no scheduled transition.
    "auto-approved": {("Reboot", "started"): 1, ("Reboot", "completed"): 1,
                      ("Redeploy", "started"): 1, ("Redeploy", "completed"): 1},
    "os-image": {("Reboot", "scheduled"): 1, ("Reboot", "started"): 1, ("Reboot", "completed"): 1},
    # Polled as its first VM, web_0: every event of the scale set reaches it (web_2 alone is blind to one).
    "fleet": {("Freeze", "scheduled"): 1, ("Freeze", "started"): 1, ("Freeze", "completed"): 1,
              ("Reboot", "scheduled"): 2, ("Reboot", "started"): 1, ("Reboot", "completed"): 1,
              ("Reboot", "canceled"): 1,
              ("Redeploy", "scheduled"): 1, ("Redeploy", "started"): 1, ("Redeploy", "completed"): 1},
}
# Events that are for this VM (by the scenario VM's name in Resources) vs for neighbours.
AFFECTS = {"availability-set": {"F1A3B5C7-D9E0-4F2A-8B4C-6D8E0F1A3B08": "false",
                                "0B2C4D6E-8F0A-4B1C-9D3E-5F7A9B1C2D09": "true"},
           "vmss-terminate": {"A4B2C0D8-E6F4-4A2B-8C0D-9E8F7A6B5C05": "true"}}


def test_every_builtin_scenario_has_expectations() -> None:
    """No built-in scenario ships without an end-to-end check."""
    assert set(EXPECTED) == set(scenarios.builtin_names())


def _listed(process: Sidecar) -> dict[str, str]:
    return {labels["event_id"]: labels["event_status"]
            for labels in series(process.samples(), "azure_scheduled_event_info")}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_scenario_end_to_end(name: str, simulator: SimulatorFactory, sidecar: Callable[..., Sidecar]) -> None:
    """Stepping through every change of the scenario, /metrics mirrors the document and counts the transitions."""
    sim, server = simulator(name, held=True)  # the demo's own clock would change it 2 s after a step, unread
    process = sidecar("--imds-url", server.url, *FAST)
    wait_until(lambda: process.value("azure_scheduled_events_vm_info", **_vm_labels(sim)), what="VM identity")
    for key_time in key_times(sim.scenario):
        sim.advance(max(0.0, key_time + 0.01 - sim.scenario_time()))
        document = sim.document(sim.newest_served)  # the version --api-version auto settles on
        incarnation = document["DocumentIncarnation"]
        wait_until(lambda wanted=incarnation: process.value("azure_scheduled_events_document_incarnation") == wanted,
                   what=f"incarnation {incarnation}")
        assert _listed(process) == {e["EventId"]: e["EventStatus"] for e in document["Events"]}
        for labels in series(process.samples(), "azure_scheduled_event_info"):
            wanted = AFFECTS.get(name, {}).get(labels["event_id"])
            if wanted:
                assert labels["affects_this_vm"] == wanted, labels
    samples = process.samples()
    for event_type in EVENT_TYPES:
        for transition in TRANSITIONS:
            count = total(samples, "azure_scheduled_events_transitions_total", event_type=event_type,
                          transition=transition)
            assert count == EXPECTED[name].get((event_type, transition)), (event_type, transition)  # None: no series
    assert process.value("azure_scheduled_events_up") == 1
    assert process.stop() == 0


def _vm_labels(sim: Simulator) -> dict[str, str]:
    vm = sim.vm
    return {"vm_name": vm["name"], "vm_id": vm["vmId"], "vmss_name": vm["vmScaleSetName"],
            "location": vm["location"], "resource_group": vm["resourceGroupName"],
            "subscription_id": vm["subscriptionId"], "vm_size": vm["vmSize"], "zone": vm["zone"]}


def test_degraded_hardware_countdown_and_host_failure_notice(simulator: SimulatorFactory,
                                                             sidecar: Callable[..., Sidecar]) -> None:
    """Days of notice show as a countdown of about 7 days; notice time is observed when the event starts."""
    sim, server = simulator("degraded-hardware")
    process = sidecar("--imds-url", server.url, *FAST)
    sim.advance(3)
    countdown = wait_until(lambda: process.value("azure_scheduled_event_seconds_until_not_before",
                                                 event_id="E3D5C7B9-A1F0-4E2D-8C6B-4A9F1E3D5C07",
                                                 event_type="Redeploy"), what="countdown")
    assert 604_790 < countdown <= 604_800
    sim.advance(604_800)
    wait_until(lambda: process.total("azure_scheduled_events_notice_seconds_count", event_type="Redeploy") == 1,
               what="notice observed")


def test_health_and_readiness_endpoints(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar]) -> None:
    """/healthz is 200 while polling; /readyz turns 200 once a document was read; / links them."""
    _, server = simulator("live-migration")
    process = sidecar("--imds-url", server.url, *FAST)
    wait_until(lambda: http_get(process.base_url + "/readyz")[0] == 200, what="ready")
    assert http_get(process.base_url + "/healthz") == (200, "poll loop running\n")
    assert "/metrics" in http_get(process.base_url + "/")[1]
    # FAST polls 20 times a second: faster than IMDS serves without throttling, which start-up says once.
    assert process.log().count("--poll-interval 0.05 is below 0.2 s: IMDS throttles") == 1


def test_not_ready_while_imds_never_answered(sidecar: Callable[..., Sidecar]) -> None:
    """Against a dead IMDS: alive (healthz 200), not ready (readyz 503), up 0, connection errors counted."""
    process = sidecar("--imds-url", f"http://127.0.0.1:{free_port()}", *FAST)
    wait_until(lambda: (process.value("azure_scheduled_events_polls_total", outcome="connection_error") or 0) >= 2,
               what="connection errors counted")
    assert http_get(process.base_url + "/readyz")[0] == 503
    assert http_get(process.base_url + "/healthz")[0] == 200
    assert process.value("azure_scheduled_events_up") == 0
    assert process.value("azure_scheduled_events_last_success_timestamp_seconds") == 0


def test_proxy_settings_are_ignored(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                    reliability: Reliability) -> None:
    """With every proxy variable pointing at a listening trap, IMDS is still polled directly; the trap stays silent."""
    _, server = simulator("live-migration")
    with socket.socket() as trap:
        trap.bind(("127.0.0.1", 0))
        trap.listen()
        trap.setblocking(False)
        proxy = f"http://127.0.0.1:{trap.getsockname()[1]}"
        env = {name: proxy for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                                        "all_proxy")}
        process = sidecar("--imds-url", server.url, *FAST, env=env)
        wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="direct poll")
        wait_until(lambda: process.value("azure_scheduled_events_vm_info", **_vm_labels(server.simulator)),
                   what="identity read directly too")
        with pytest.raises(BlockingIOError):
            trap.accept()
    reliability("Security", "HTTP_PROXY, HTTPS_PROXY, ALL_PROXY pointing at a listening trap",
                "IMDS and compute metadata reached directly; the trap saw nothing")


def test_old_api_version_end_to_end(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar]) -> None:
    """Polling with the 2017-03-01 preview shape: string incarnation, ISO NotBefore, underscored names all work."""
    sim, server = simulator("live-migration")
    sim.advance(10)
    process = sidecar("--imds-url", server.url, "--api-version", "2017-03-01", *FAST)
    wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="preview document")
    info = series(process.samples(), "azure_scheduled_event_info")
    assert [(i["event_type"], i["affects_this_vm"], i["event_source"]) for i in info] == [
        ("Freeze", "true", "unknown")]
    assert process.value("azure_scheduled_event_duration_seconds", event_id=info[0]["event_id"],
                         event_type="Freeze") is None
    assert process.value("azure_scheduled_events_document_warnings_total") == 0


def test_unknown_fields_and_types_end_to_end(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar]) -> None:
    """A document with an unknown EventType, extra fields and a wrongly typed duration is shown, with a warning."""
    sim, server = simulator("live-migration")
    body = ('{"DocumentIncarnation": 9, "NewTopLevel": true, "Events": [{"EventId": "X1", "EventType": "Hibernate",'
            ' "EventStatus": "Scheduled", "ResourceType": "VirtualMachine", "Resources": ["WestNO_0"],'
            ' "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT", "DurationInSeconds": "long", "Zone": 3}]}')
    sim.inject(Fault("body", text=body, count=0))
    process = sidecar("--imds-url", server.url, *FAST)
    wait_until(lambda: process.value("azure_scheduled_events_document_incarnation") == 9, what="odd document")
    assert process.total("azure_scheduled_events_pending", event_type="Hibernate", event_status="Scheduled") == 1
    assert process.value("azure_scheduled_events_document_warnings_total") == 1
    assert "DurationInSeconds" in process.log()


def test_json_logs(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar]) -> None:
    """--log-format json writes one JSON object per line, transitions with their fields."""
    sim, server = simulator("live-migration")
    sim.advance(10)
    process = sidecar("--imds-url", server.url, "--log-format", "json", *FAST)
    wait_until(lambda: '"transition": "scheduled"' in process.log(), what="a transition logged")
    lines = [json.loads(line) for line in process.log().splitlines() if line.strip()]
    scheduled = next(line for line in lines if line.get("transition") == "scheduled")
    assert scheduled["event_type"] == "Freeze"
    assert scheduled["affects_this_vm"] in ("true", "unknown")
    assert scheduled["level"] == "warning"




def test_demo_mode_shows_pending_events_and_never_posts(sidecar: Callable[..., Sidecar],
                                                        reliability: Reliability) -> None:
    """`run --simulate` (what `make demo` runs) lists pending events within seconds; its simulator sees only GETs."""
    process = sidecar("--simulate", "--speed", "5")
    wait_until(lambda: process.total("azure_scheduled_events_pending", event_type="Freeze",
                                     event_status="Scheduled") == 1, what="the demo's Freeze")
    wait_until(lambda: process.total("azure_scheduled_events_pending", event_type="Redeploy",
                                     event_status="Scheduled") == 1, what="the demo's degraded-hardware Redeploy")
    match = re.search(r"polling (http://127\.0\.0\.1:\d+)/metadata", process.log())
    assert match, process.log()
    status, body = http_get(match.group(1) + "/_simulator/requests")
    assert status == 200
    methods = {request["method"] for request in json.loads(body) if request["path"].startswith("/metadata")}
    assert methods == {"GET"}
    reliability("Security", "every simulator the suite starts, checked at teardown",
                "zero POST, PUT or DELETE requests from se-exporter")


def test_simulate_command_serves_faults_from_flags(tmp_path: Path) -> None:
    """`se-exporter simulate --fault ...` serves the scenario on loopback and applies the fault first."""
    out = tmp_path / "simulate.out"
    with out.open("wb") as stdout:
        child = subprocess.Popen([sys.executable, "-m", "se_exporter", "simulate", "--listen", "127.0.0.1:0",
                                  "--scenario", "host-failure", "--fault", "throttle,retry_after=3"],
                                 stdout=stdout, stderr=subprocess.STDOUT)
    attach(f"se-exporter simulate (pid {child.pid})", out, lambda: child.poll() is None)
    try:
        url = wait_until(lambda: re.search(r"at (http://127\.0\.0\.1:\d+)", out.read_text()), timeout=20,
                         what="the simulator URL").group(1)
        events = url + "/metadata/scheduledevents?api-version=2020-07-01"
        request = urllib.request.Request(events, headers={"Metadata": "true"})
        with pytest.raises(urllib.error.HTTPError) as throttled:
            urllib.request.urlopen(request, timeout=5)
        throttled.value.close()
        assert (throttled.value.code, throttled.value.headers["Retry-After"]) == (429, "3")
        with urllib.request.urlopen(request, timeout=5) as response:
            assert json.load(response)["DocumentIncarnation"] >= 1
    finally:
        assert stop_process(child) == 0
