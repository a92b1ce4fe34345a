"""The two streams end to end (issue 27): three sidecars on the simulator forward through the SDK to one hub, Azure's
own copy of the scheduled events arrives on a second hub, and `se-exporter fleet` reconciles them into every
coverage state; a restart and a kill -9 keep both pictures exact. Real SDK, Azurite, the suite's AMQP server (one
per hub: it serves one hub per instance)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from azure.eventhub import EventData

from se_exporter.simulator.faults import Fault
from tests.conftest import Reliability, SimulatorFactory
from tests.eventhubs_server import EventHubsTestServer, Store
from tests.fleet.platform_helpers import grid, iso
from tests.fleet_helpers import FleetProcess, send
from tests.helpers import Sidecar, wait_until
from tests.integration import test_fleet
from tests.integration.test_fleet import SIDECAR_FAST, TAKEOVER

pytestmark = pytest.mark.integration
azurite, container, fleets = test_fleet.azurite, test_fleet.container, test_fleet.fleets  # that module's fixtures

FREEZE_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"  # the live-migration scenario's EventId
SUBSCRIPTION, GROUP, LOCATION = "8d10da13-8125-4ba9-a717-bf7490507b3d", "maintenance-rg", "norwayeast"  # the sims'
VMS = ("web_0", "web_1", "web_2", "web_3")  # observed, missed (blind to it), imds_unreachable, no sidecar at all
GRACE = "3"
EXPECTED = {"observed": 1.0, "missed": 1.0, "imds_unreachable": 1.0, "no_sidecar": 1.0}


def platform_message(status: str, at: float, grid_id: str | None = None) -> bytes:
    """The platform's copy of the Freeze, as Event Grid delivers it to an event hub (an array of one event), for the
    sims' subscription, resource group, region and scale set."""
    event = grid(status, grid_id=grid_id, event_id=FREEZE_ID, at=at, resources=list(VMS), event_type="Freeze")
    info = event["data"]["resourceInfo"]
    info["location"] = LOCATION
    info["id"] = (f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/Microsoft.Compute/"
                  f"virtualMachineScaleSets/web/providers/microsoft.maintenance/scheduledevents/{FREEZE_ID}")
    event["subject"] = info["id"]
    event["eventTime"] = iso(at)
    return json.dumps([event]).encode()


def publish(hub: EventHubsTestServer, bodies: list[bytes]) -> None:
    """Publish on the platform's hub with the SDK's producer. (Once `se-exporter simulate --platform-eventhub-*`
    publishes the scenario's platform copy, this is the one place to switch to it.)"""
    send(hub.connection_string(), [EventData(body) for body in bodies])


def coverage(fleet: FleetProcess) -> dict[str, float]:
    return {labels["coverage"]: value for (name, frozen), value in fleet.samples().items()
            if name == "azure_scheduled_fleet_platform_event_vms" and (labels := dict(frozen))["event_id"] == FREEZE_ID}


def count(fleet: FleetProcess, name: str, **labels: str) -> float:
    return fleet.value(name, **labels) or 0.0


def start_sidecars(simulator: SimulatorFactory, sidecar: Callable[..., Sidecar], hub: EventHubsTestServer,
                   ) -> list[Any]:
    """Three sims and their sidecars: web_0 (live-migration), web_1 (canceled), web_2 (live-migration), all held."""
    sims = []
    for index, scenario in enumerate(("live-migration", "canceled", "live-migration")):
        sim, server = simulator(scenario, vm_name=VMS[index], held=True)
        sim.vm.update(vmId=f"00000000-0000-4000-8000-00000000000{index}", vmScaleSetName="web")
        sims.append(sim)
        sidecar("--imds-url", server.url, *SIDECAR_FAST, "--heartbeat-interval", "0.5",
                env={"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": hub.connection_string()})
    return sims


def summed(replicas: list[FleetProcess], name: str, **labels: str) -> float:
    return sum(count(replica, name, **labels) for replica in replicas)


def test_two_replicas_together_show_every_coverage_state_once(
        simulator: SimulatorFactory, sidecar: Callable[..., Sidecar], hubs: Callable[..., EventHubsTestServer],
        fleets: Callable[..., Any]) -> None:
    """Two replicas share both hubs' partitions however the balancing splits them: summed over the replicas, each
    coverage state is there once, the event's info series is on one replica, and each count is made once."""
    sidecars_hub = hubs(Store(partition_count=2))
    platform_hub = hubs(Store(hub="grid", partition_count=2))
    sims = start_sidecars(simulator, sidecar, sidecars_hub)
    env = {"SE_EXPORTER_PLATFORM_EVENTHUB_CONNECTION_STRING": platform_hub.connection_string()}
    replicas = [fleets(sidecars_hub, "--reconcile-grace", GRACE, "--vm-expiry", "60", env=env) for _ in range(2)]
    wait_until(lambda: [count(replica, "azure_scheduled_fleet_owned_partitions") for replica in replicas] == [2, 2],
               timeout=60, what="the four partitions split over the two replicas")
    sims[0].advance(3)
    sims[1].advance(3)
    wait_until(lambda: summed(replicas, "azure_scheduled_fleet_vms") == 3, timeout=60, what="the sidecars' VMs")
    sims[2].inject(Fault("status", status=500, count=0))
    wait_until(lambda: summed(replicas, "azure_scheduled_fleet_imds_unreachable_vms") == 1, timeout=30,
               what="web_2's sidecar reporting that it cannot read IMDS")
    announced = time.time()
    publish(platform_hub, [platform_message("Scheduled", announced)])

    def total() -> dict[str, float]:
        states: dict[str, float] = {}
        for replica in replicas:
            for state, value in coverage(replica).items():
                states[state] = states.get(state, 0.0) + value
        return states

    wait_until(lambda: total() == EXPECTED, timeout=60, what="every coverage state once over the replicas")
    infos = [name for replica in replicas for (name, _labels) in replica.samples()
             if name == "azure_scheduled_fleet_platform_event_info"]
    assert len(infos) == 1
    wait_until(lambda: all(summed(replicas, "azure_scheduled_fleet_missed_events_total", event_type="Freeze",
                                  reason=reason) == 1 for reason in ("missed", "imds_unreachable", "no_sidecar")),
               timeout=30, what="each miss counted once over the replicas")
    assert summed(replicas, "azure_scheduled_fleet_platform_events_total", event_type="Freeze",
                  event_status="Scheduled") == 1
    assert summed(replicas, "azure_scheduled_fleet_announcement_lag_seconds_count") == 1


def test_two_streams_show_every_coverage_state_and_survive_a_restart_and_a_kill(
        simulator: SimulatorFactory, sidecar: Callable[..., Sidecar], hubs: Callable[..., EventHubsTestServer],
        fleets: Callable[..., Any], reliability: Reliability) -> None:
    """web_0's sidecar lists the Freeze (observed), web_1's is alive and lists only an event of its own (missed; and
    that event, never announced, is unannounced), web_2's cannot read IMDS (imds_unreachable), web_3 has no sidecar
    (no_sidecar). Statuses out of order, an Event Grid duplicate, a foreign Event Grid event and garbage are counted
    and skipped. After SIGTERM and a successor, and after kill -9 and a successor, both pictures are the same and
    nothing is counted twice."""
    sidecars_hub = hubs(Store(partition_count=2))
    platform_hub = hubs(Store(hub="grid", partition_count=2))
    sims = start_sidecars(simulator, sidecar, sidecars_hub)
    platform_env = {"SE_EXPORTER_PLATFORM_EVENTHUB_CONNECTION_STRING": platform_hub.connection_string()}
    args = ("--reconcile-grace", GRACE, "--vm-expiry", "60")
    fleet = fleets(sidecars_hub, *args, env=platform_env)
    sims[0].advance(3)  # web_0 lists the Freeze
    sims[1].advance(3)  # web_1 lists the canceled scenario's Reboot, never the Freeze
    wait_until(lambda: count(fleet, "azure_scheduled_fleet_vms") == 3, timeout=60, what="the three sidecars' VMs")
    sims[2].inject(Fault("status", status=500, count=0))  # web_2's IMDS answers 500 from now on
    wait_until(lambda: count(fleet, "azure_scheduled_fleet_imds_unreachable_vms") == 1, timeout=30,
               what="web_2's sidecar reporting that it cannot read IMDS")

    announced = time.time()
    publish(platform_hub, [platform_message("Scheduled", announced), platform_message("Scheduled", announced),
                           json.dumps([{**json.loads(platform_message("Scheduled", announced))[0],
                                        "eventType": "Microsoft.Storage.BlobCreated", "id": "blob"}]).encode(),
                           b"\x00garbage"])
    wait_until(lambda: coverage(fleet) == EXPECTED, timeout=60, what="every coverage state on the fleet")
    assert count(fleet, "azure_scheduled_fleet_platform_duplicates_total") == 1
    assert count(fleet, "azure_scheduled_fleet_invalid_messages_total", reason="other_event_type") == 1
    assert count(fleet, "azure_scheduled_fleet_invalid_messages_total", reason="not_json") \
        + count(fleet, "azure_scheduled_fleet_invalid_messages_total", reason="not_envelope") == 1
    # Counted once the blob remembering the count is written (the next checkpoint): waited for.
    wait_until(lambda: all(count(fleet, "azure_scheduled_fleet_missed_events_total", event_type="Freeze",
                                 reason=reason) == 1 for reason in ("missed", "imds_unreachable", "no_sidecar")),
               timeout=30, what="each miss counted once")
    wait_until(lambda: count(fleet, "azure_scheduled_fleet_unannounced_events_total", event_type="Reboot") == 1,
               timeout=30, what="web_1's own event counted as never announced")
    wait_until(lambda: count(fleet, "azure_scheduled_fleet_announcement_lag_seconds_count") == 1, timeout=30,
               what="web_0's lag observed")

    # Completed before Started (Event Grid's order is not the platform's): both counted once, the impact of 5 s on
    # four VMs once both ends are known.
    publish(platform_hub, [platform_message("Completed", announced + 15), platform_message("Started", announced + 10)])
    wait_until(lambda: count(fleet, "azure_scheduled_fleet_impact_seconds_total", event_type="Freeze",
                             scope_name="web", location=LOCATION) == 20.0, timeout=30, what="the impact counted")
    for status in ("Scheduled", "Started", "Completed"):
        assert count(fleet, "azure_scheduled_fleet_platform_events_total", event_type="Freeze",
                     event_status=status) == 1, status
    info = wait_until(lambda: [dict(labels) for (name, labels) in fleet.samples()
                               if name == "azure_scheduled_fleet_platform_event_info"
                               and dict(labels)["event_status"] == "Completed"], timeout=30, what="Completed shown")
    assert info == [{"event_id": FREEZE_ID, "event_type": "Freeze", "event_status": "Completed",
                     "event_source": "Platform", "scope_type": "scale_set", "scope_name": "web",
                     "resource_group": GROUP, "subscription_id": SUBSCRIPTION, "location": LOCATION}]
    wait_until(lambda: coverage(fleet) == EXPECTED, timeout=30, what="coverage kept once the event ended")

    def same_after(successor: FleetProcess, what: str) -> None:
        wait_until(lambda: coverage(successor) == EXPECTED, timeout=60, what=f"coverage after {what}")
        wait_until(lambda: count(successor, "azure_scheduled_fleet_vms") == 3, timeout=30, what=f"VMs after {what}")
        wait_until(lambda: [dict(labels)["event_status"] for (name, labels) in successor.samples()
                            if name == "azure_scheduled_fleet_platform_event_info"] == ["Completed"], timeout=30,
                   what=f"the event listed as Completed after {what}")
        for name in ("azure_scheduled_fleet_platform_events_total", "azure_scheduled_fleet_missed_events_total",
                     "azure_scheduled_fleet_impact_seconds_total", "azure_scheduled_fleet_platform_duplicates_total",
                     "azure_scheduled_fleet_unannounced_events_total"):
            assert sum(value for (sample, _labels), value in successor.samples().items() if sample == name) == 0, \
                f"{name} counted again after {what}"

    assert fleet.stop() == 0
    successor = fleets(sidecars_hub, *args, env=platform_env)
    same_after(successor, "SIGTERM and a successor")
    publish(platform_hub, [platform_message("Completed", announced + 15, grid_id="late-copy")])
    wait_until(lambda: count(successor, "azure_scheduled_fleet_documents_consumed_total") >= 1, timeout=30,
               what="the late copy read")
    successor.kill()
    third = fleets(sidecars_hub, *args, env=platform_env)
    wait_until(lambda: count(third, "azure_scheduled_fleet_owned_partitions") == 4, timeout=TAKEOVER + 30,
               what="the killed replica's partitions taken over")
    same_after(third, "kill -9 and a successor")
    reliability("Fleet", "three sidecars on the simulator and the platform's copy on a second hub; a restart and a "
                "kill -9 of the replica", "every coverage state (observed, missed, imds_unreachable, no_sidecar) "
                "shown; statuses out of order, a duplicate, a foreign Event Grid event and garbage counted and "
                "skipped; both pictures the same after SIGTERM and after kill -9, nothing counted twice")
