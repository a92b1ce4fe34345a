"""The sidecar process exporting spans over OTLP/HTTP and OTLP/gRPC to the suite's receiver."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from se_exporter.sidecar.sinks.spans import trace_id_for
from tests.conftest import Reliability, SimulatorFactory
from tests.support.helpers import Sidecar, wait_until
from tests.support.otlp_receiver import (
    OtlpReceiver,
    drip_body,
    drip_headers,
    flood_declared,
    flood_undeclared,
    hostile_collector,
)

pytestmark = pytest.mark.integration
FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2")
FREEZE = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
A = "azure.scheduled_event."


def advance_to(sim: Any, process: Sidecar, t: float) -> None:
    sim.advance(max(0.0, t - sim.scenario_time()))
    incarnation = sim.document()["DocumentIncarnation"]
    wait_until(lambda: process.value("azure_scheduled_events_document_incarnation") == incarnation,
               what=f"incarnation {incarnation}")


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_spans_reach_the_receiver(protocol: str, simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                  receiver: OtlpReceiver) -> None:
    """Through the official exporter: an update span within seconds of first sight, then the full span tree
    with contract attributes and the Azure resource when the event ends."""
    sim, server = simulator("live-migration")
    endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
    process = sidecar("--imds-url", server.url, *FAST, env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                                                            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol})
    advance_to(sim, process, 3)
    seen = time.monotonic()
    update = wait_until(lambda: receiver.named("scheduled_event.update"), timeout=10, what="the first update span")[0]
    assert time.monotonic() - seen < 5
    assert (update.attributes[A + "transition"], update.attributes[A + "status"]) == ("scheduled", "Scheduled")
    assert update.transport == ("grpc" if protocol == "grpc" else "http")
    advance_to(sim, process, 903)
    advance_to(sim, process, 933)
    root = wait_until(lambda: receiver.named("scheduled_event"), timeout=10, what="the root span")[0]
    assert root.trace_id == f"{trace_id_for(FREEZE):032x}"
    assert root.parent_id == ""
    assert root.attributes[A + "outcome"] == "completed"
    assert root.attributes[A + "resources"] == ["WestNO_0", "WestNO_1"]
    assert root.attributes[A + "affects_this_vm"] is True
    assert A + "not_before" not in root.attributes  # the event as last listed: Started, NotBefore empty
    assert update.attributes[A + "not_before"].endswith("Z")  # ISO 8601 UTC while it was Scheduled
    assert [name for name, _, _ in root.events] == ["scheduled", "started", "completed"]
    children = {s.name: s for s in receiver.spans if s.parent_id == root.span_id}
    assert {"scheduled_event.notice", "scheduled_event.impact", "scheduled_event.update"} <= set(children)
    assert all(s.trace_id == root.trace_id for s in receiver.spans)
    resource = root.resource
    assert (resource["service.name"], resource["cloud.provider"], resource["cloud.platform"]) == (
        "se-exporter", "azure", "azure.vm")
    assert (resource["host.name"], resource["host.id"], resource["cloud.region"]) == (
        "WestNO_0", sim.vm["vmId"], "norwayeast")
    assert resource["azure.vm.sku"] == sim.vm["sku"]


def test_two_vms_share_one_trace_per_event(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                           receiver: OtlpReceiver) -> None:
    """Two sidecars (WestNO_0, WestNO_1) seeing the same EventId put their spans in the same trace."""
    sim, server = simulator("live-migration")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint}
    first = sidecar("--imds-url", server.url, "--vm-name", "WestNO_0", *FAST, env=env)
    second = sidecar("--imds-url", server.url, "--vm-name", "WestNO_1", *FAST, env=env)
    for t in (3, 903, 933):
        advance_to(sim, first, t)
        advance_to(sim, second, t)
    roots = wait_until(lambda: len(receiver.named("scheduled_event")) == 2 and receiver.named("scheduled_event"),
                       timeout=10, what="both root spans")
    assert {r.trace_id for r in roots} == {f"{trace_id_for(FREEZE):032x}"}
    assert len({r.span_id for r in roots}) == 2
    assert {r.resource["host.name"] for r in roots} == {"WestNO_0", "WestNO_1"}


def test_kill_and_restart_mid_event(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar],
                                    receiver: OtlpReceiver, tmp_path: Path, reliability: Reliability) -> None:
    """After kill -9 and a restart: no transition counted twice, notice measured from the first sight before the
    kill, and the root span starts then too."""
    sim, server = simulator("live-migration")
    state = tmp_path / "state"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint}
    before = sidecar("--imds-url", server.url, "--state-dir", str(state), *FAST, env=env)
    advance_to(sim, before, 3)
    first_seen = time.time()
    wait_until(lambda: receiver.named("scheduled_event.update"), timeout=10, what="the first process's update span")
    before.process.send_signal(signal.SIGKILL)
    before.process.wait()
    time.sleep(1.0)  # downtime that must count as notice: this is the behaviour under test, not a settle-wait
    after = sidecar("--imds-url", server.url, "--state-dir", str(state), *FAST, env=env)
    restarted = time.time()
    advance_to(sim, after, 903)
    assert (after.total("azure_scheduled_events_transitions_total", event_type="Freeze", transition="scheduled")
            or 0) == 0
    assert after.total("azure_scheduled_events_transitions_total", event_type="Freeze", transition="started") == 1
    notice = after.total("azure_scheduled_events_notice_seconds_sum", event_type="Freeze")
    assert notice is not None and notice >= time.time() - first_seen - 0.5 > time.time() - restarted
    assert "continuing 1 open lifecycles" in after.log()
    advance_to(sim, after, 933)
    root = wait_until(lambda: receiver.named("scheduled_event"), timeout=10, what="the root span")[0]
    assert root.start_ns / 1e9 < restarted
    assert [name for name, _, _ in root.events] == ["scheduled", "started", "completed"]
    assert len([s for s in receiver.spans if s.name == "scheduled_event.update"
                and s.attributes[A + "transition"] == "scheduled"]) == 1
    reliability("Restarts", "kill -9 between Scheduled and Started, then restart",
                "no transition counted twice; notice measured from the first sight; the same root span "
                "continued")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_flushes_spans_and_exits_quickly(signum: int, simulator: SimulatorFactory,
                                                       sidecar: Callable[..., Sidecar], receiver: OtlpReceiver,
                                                       reliability: Reliability) -> None:
    """Spans ended just before SIGTERM (or SIGHUP: a closed terminal) are exported by the shutdown, "stopping"
    is logged, and the process exits 0 within 10 s."""
    sim, server = simulator("host-failure")
    process = sidecar("--imds-url", server.url, *FAST, env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint})
    advance_to(sim, process, 3)
    advance_to(sim, process, 303)
    started = time.monotonic()
    process.process.send_signal(signum)
    assert process.process.wait(timeout=10) == 0
    assert time.monotonic() - started < 10
    assert [s.attributes[A + "outcome"] for s in receiver.named("scheduled_event")] == ["completed"]
    assert "stopping" in process.log()
    reliability("Shutdown", f"{signal.Signals(signum).name} right after an event completed",
                "spans flushed, \"stopping\" logged, exit 0 within 10 s")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("answer", [flood_declared, flood_undeclared, drip_headers, drip_body],
                         ids=lambda answer: answer.__name__)
def test_a_hostile_collector_costs_failed_exports_not_memory_or_polling(
        answer: Callable[[Callable[[bytes], None]], None], simulator: SimulatorFactory,
        sidecar: Callable[..., Sidecar], reliability: Reliability) -> None:
    """A collector answering 200 with an endless body (4 GB declared, or none) or dripping a byte at a time: each
    export fails by its deadline and is counted, one log line says why, polling goes on, RSS does not grow with it,
    and SIGTERM still stops the sidecar at once."""
    sim, server = simulator("live-migration")
    with hostile_collector(answer) as endpoint:
        process = sidecar("--imds-url", server.url, *FAST,
                          env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint.removesuffix("/v1/traces")})
        wait_until(lambda: process.value("azure_scheduled_events_up") == 1, what="the first poll")
        before = _rss_kib(process.process.pid)
        advance_to(sim, process, 3)  # a Scheduled event: an update span to export
        wait_until(lambda: (process.value("azure_scheduled_events_span_export_errors_total") or 0) >= 1, timeout=15,
                   what="a failed export")
        advance_to(sim, process, 903)  # polling went on meanwhile
        wait_until(lambda: (process.value("azure_scheduled_events_span_export_errors_total") or 0) >= 2, timeout=15,
                   what="a second failed export")
        grown = _rss_kib(process.process.pid) - before
        assert process.value("azure_scheduled_events_spans_exported_total") == 0
        assert process.log().count("span export failing") == 1
        assert grown < 8 * 1024, f"RSS grew by {grown} KiB"
        started = time.monotonic()
        assert process.stop() == 0
        assert time.monotonic() - started < 10
    reliability("Traces", "an OTLP/HTTP collector answering 200 with an endless body (4 GB declared, or none), or "
                          "dripping its headers or body a byte at a time",
                "each export failed by its 5 s deadline and was counted; one log line saying why; polling went on; "
                "RSS grew less than 8 MiB; SIGTERM stopped it within 10 s")
