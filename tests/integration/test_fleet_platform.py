"""The two streams end to end: `se-exporter simulate` plays four VMs of a scale set and publishes the
platform's own copy of their events to a second hub (its --platform-eventhub-* flags, through the official SDK),
three sidecars on three of its VMs forward through the SDK to the first hub, and `se-exporter fleet` reconciles
the two into every coverage state; a restart and a kill -9 keep both pictures exact. Real SDK, Azurite, the suite's
AMQP server (one per hub: it serves one hub per instance). Hostile input the simulator would never send (a foreign
Event Grid event, garbage, a late status out of order) goes in with the SDK's producer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData

from se_exporter.fleet.platform.reader import PlatformEvent, read_platform
from tests.conftest import Reliability
from tests.integration import test_fleet, test_simulator_platform
from tests.integration.test_fleet import SIDECAR_FAST, TAKEOVER
from tests.integration.test_simulator_platform import Simulate
from tests.support.eventhubs_server import EventHubsTestServer, Store
from tests.support.fleet_helpers import FleetProcess, send
from tests.support.helpers import Sidecar, wait_until

pytestmark = pytest.mark.integration
azurite, container, fleets = test_fleet.azurite, test_fleet.container, test_fleet.fleets  # that module's fixtures
simulate = test_simulator_platform.simulate

FREEZE_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
LOST_ID = "9D5E4F60-7A81-4C93-8EA0-1B2C3D4E5F25"  # a Reboot the VMs list and the platform never announces
GROUP, LOCATION = "maintenance-rg", "norwayeast"
SIDECARS = ("web_0", "web_1", "web_2")  # web_3 runs none
ANNOUNCED, STARTED = 600.0, 1200.0  # scenario seconds: reached only by jumps, once the test is ready for them
SCENARIO = {
    "description": "Two streams: a Freeze of four VMs; web_1's sidecar is blind to it, web_2's cannot read "
                   "IMDS (a fault the test injects), web_3 runs no sidecar; a Reboot the platform never announces.",
    "vm": {"vmScaleSetName": "web", "location": LOCATION, "resourceGroupName": GROUP},
    "vms": [{"name": "web_0"}, {"name": "web_1"}, {"name": "web_2"}, {"name": "web_3"}],
    "platform": {"duplicate_every": 1},  # every message twice: Event Grid's duplicates, each one
    "events": [
        {"EventId": FREEZE_ID, "EventType": "Freeze", "Resources": ["web_0", "web_1", "web_2", "web_3"],
         "blind": ["web_1"], "DurationInSeconds": 5, "appear_at": ANNOUNCED, "notice": STARTED - ANNOUNCED,
         "started_for": 5},
        {"EventId": LOST_ID, "EventType": "Reboot", "Resources": ["web_0"], "announced": False,
         "appear_at": ANNOUNCED, "notice": 3600},
    ],
}
GRACE = "3"
EXPECTED = {"observed": 1.0, "missed": 1.0, "imds_unreachable": 1.0, "no_sidecar": 1.0}
PLATFORM_MAX = 1 << 20


class Streams:
    """The simulator and its platform copy on the platform hub, three sidecars on its VMs on the sidecars' hub, and
    web_2's IMDS failing from the moment its sidecar has been heard (see ``blind_web_2``)."""

    def __init__(self, simulate: Callable[..., Simulate], sidecar: Callable[..., Sidecar],
                 hubs: Callable[..., EventHubsTestServer], tmp_path: Path) -> None:
        self.sidecars_hub = hubs(Store(partition_count=2))
        self.platform_hub = hubs(Store(hub="grid", partition_count=2))
        scenario = tmp_path / "both-streams.json"
        scenario.write_text(json.dumps(SCENARIO))
        self.sim = simulate("--platform-eventhub-connection-string", self.platform_hub.connection_string(),
                            scenario=str(scenario))
        for name in SIDECARS:
            sidecar("--imds-url", f"{self.sim.url}/vms/{name}", *SIDECAR_FAST, "--heartbeat-interval", "0.5",
                    env={"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": self.sidecars_hub.connection_string()})
        self.env = {"SE_EXPORTER_PLATFORM_EVENTHUB_CONNECTION_STRING": self.platform_hub.connection_string()}

    def blind_web_2(self) -> None:
        """From now on web_2's IMDS answers 500: its sidecar stays alive, and says it cannot read IMDS."""
        self.sim.post("/vms/web_2/_simulator/faults", {"kind": "status", "status": 500, "count": 0})

    def jump_to(self, second: float) -> None:
        """Scenario time to ``second`` (a few milliseconds past it): what is due then is published at once, dated
        now, not in the past a larger jump would date it to."""
        self.sim.advance(second - self.sim.get("/_simulator/state")["scenario_time"])

    def platform(self) -> list[PlatformEvent]:
        """The simulator's messages on the platform hub, in the order they were enqueued (duplicates included)."""
        events = []
        for stored in sorted(self.platform_hub.store.all(), key=lambda event: event.enqueued_time_ms):
            read = read_platform(stored.body, PLATFORM_MAX, 0.0) if b"ScheduledEventEmitted" in stored.body else None
            events += read.events if read is not None else []
        return events

    def published(self, status: str) -> PlatformEvent:
        return next(event for event in self.platform() if event.event_status == status)


def coverage(fleet: FleetProcess) -> dict[str, float]:
    return {labels["coverage"]: value for (name, frozen), value in fleet.samples().items()
            if name == "azure_scheduled_fleet_platform_event_vms" and (labels := dict(frozen))["event_id"] == FREEZE_ID}


def count(fleet: FleetProcess, name: str, **labels: str) -> float:
    return fleet.value(name, **labels) or 0.0


def summed(replicas: list[FleetProcess], name: str, **labels: str) -> float:
    return sum(count(replica, name, **labels) for replica in replicas)


def foreign_and_garbage(streams: Streams) -> None:
    """Published with the SDK's producer: another Event Grid event (a blob created) and bytes that are no JSON."""
    foreign = [{"id": "blob", "topic": "/subscriptions/x", "subject": "/blobServices/default/containers/c/blobs/b",
                "eventType": "Microsoft.Storage.BlobCreated", "eventTime": "2026-05-01T00:00:00.0000000Z",
                "data": {"api": "PutBlob"}, "dataVersion": "1", "metadataVersion": "1"}]
    send(streams.platform_hub.connection_string(), [EventData(json.dumps(foreign)), EventData(b"\x00garbage")])


def test_two_replicas_together_show_every_coverage_state_once(
        simulate: Callable[..., Simulate], sidecar: Callable[..., Sidecar], hubs: Callable[..., EventHubsTestServer],
        fleets: Callable[..., Any], tmp_path: Path) -> None:
    """Two replicas share both hubs' partitions however the balancing splits them: summed over the replicas, each
    coverage state is there once, the event's info series is on one replica, and each count is made once."""
    streams = Streams(simulate, sidecar, hubs, tmp_path)
    replicas = [fleets(streams.sidecars_hub, "--reconcile-grace", GRACE, "--vm-expiry", "60", env=streams.env)
                for _ in range(2)]
    wait_until(lambda: [count(replica, "azure_scheduled_fleet_owned_partitions") for replica in replicas] == [2, 2],
               timeout=60, what="the four partitions split over the two replicas")
    wait_until(lambda: summed(replicas, "azure_scheduled_fleet_vms") == 3, timeout=60, what="the sidecars' VMs")
    streams.blind_web_2()
    wait_until(lambda: summed(replicas, "azure_scheduled_fleet_imds_unreachable_vms") == 1, timeout=30,
               what="web_2's sidecar reporting that it cannot read IMDS")
    streams.jump_to(ANNOUNCED)

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
        simulate: Callable[..., Simulate], sidecar: Callable[..., Sidecar], hubs: Callable[..., EventHubsTestServer],
        fleets: Callable[..., Any], reliability: Reliability, tmp_path: Path) -> None:
    """The simulator's Freeze of web_0..web_3: web_0's sidecar lists it (observed), web_1's is alive and blind to it
    (missed), web_2's has failed to read IMDS since before it was announced (imds_unreachable), web_3 runs none
    (no_sidecar); the Reboot the platform never announces is unannounced. Every message came twice (Event Grid's
    duplicates); a foreign Event Grid event and garbage are counted and skipped. After SIGTERM and a successor, a
    late Started after the Completed (out of order), and kill -9 and a successor, both pictures are the same and
    nothing is counted twice."""
    streams = Streams(simulate, sidecar, hubs, tmp_path)
    args = ("--reconcile-grace", GRACE, "--vm-expiry", "60")
    fleet = fleets(streams.sidecars_hub, *args, env=streams.env)
    wait_until(lambda: count(fleet, "azure_scheduled_fleet_vms") == 3, timeout=60, what="the three sidecars' VMs")
    streams.blind_web_2()
    wait_until(lambda: count(fleet, "azure_scheduled_fleet_imds_unreachable_vms") == 1, timeout=30,
               what="web_2's sidecar reporting that it cannot read IMDS")
    streams.jump_to(ANNOUNCED)
    foreign_and_garbage(streams)
    wait_until(lambda: coverage(fleet) == EXPECTED, timeout=60, what="every coverage state on the fleet")
    # Counted once the blob remembering the count is written (the next checkpoint): waited for.
    wait_until(lambda: all(count(fleet, "azure_scheduled_fleet_missed_events_total", event_type="Freeze",
                                 reason=reason) == 1 for reason in ("missed", "imds_unreachable", "no_sidecar")),
               timeout=30, what="each miss counted once")
    wait_until(lambda: count(fleet, "azure_scheduled_fleet_unannounced_events_total", event_type="Reboot") == 1,
               timeout=30, what="the Reboot never announced counted as such")
    wait_until(lambda: count(fleet, "azure_scheduled_fleet_announcement_lag_seconds_count") == 1, timeout=30,
               what="web_0's lag observed")
    wait_until(lambda: count(fleet, "azure_scheduled_fleet_invalid_messages_total", reason="other_event_type") == 1,
               timeout=30, what="the foreign Event Grid event counted")
    assert count(fleet, "azure_scheduled_fleet_invalid_messages_total", reason="not_json") \
        + count(fleet, "azure_scheduled_fleet_invalid_messages_total", reason="not_envelope") == 1

    # The Freeze starts and ends; IMDS drops it, the platform tells Started and Completed: coverage stays, and the
    # impact is the platform's Started to Completed on each of the four VMs.
    streams.jump_to(STARTED + 5)
    wait_until(lambda: (stats := streams.sim.platform())["published"] == 3
               and stats["eventhub"]["sent"] == 3 + stats["duplicates"], timeout=30,
               what="the simulator's Started and Completed sent to the platform hub")
    impact = 4 * (streams.published("Completed").event_time - streams.published("Started").event_time)
    wait_until(lambda: count(fleet, "azure_scheduled_fleet_impact_seconds_total", event_type="Freeze",
                             scope_name="web", location=LOCATION) == pytest.approx(impact), timeout=30,
               what="the impact counted")
    for status in ("Scheduled", "Started", "Completed"):
        assert count(fleet, "azure_scheduled_fleet_platform_events_total", event_type="Freeze",
                     event_status=status) == 1, status
    published = streams.platform()  # three statuses, each twice (and again, should a send have been retried)
    assert len(published) >= 6
    duplicates = len(published) - len({event.grid_id for event in published})
    # Counted once the blob remembering the count is written (within a checkpoint interval of the copy's reading)
    wait_until(lambda: count(fleet, "azure_scheduled_fleet_platform_duplicates_total") == duplicates, timeout=30,
               what=f"the {duplicates} duplicates counted")
    scheduled = streams.published("Scheduled")
    info = wait_until(lambda: [dict(labels) for (name, labels) in fleet.samples()
                               if name == "azure_scheduled_fleet_platform_event_info"
                               and dict(labels)["event_status"] == "Completed"], timeout=30, what="Completed shown")
    assert info == [{"event_id": FREEZE_ID, "event_type": "Freeze", "event_status": "Completed",
                     "event_source": "Platform", "scope_type": "scale_set", "scope_name": "web",
                     "resource_group": GROUP, "subscription_id": scheduled.subscription_id, "location": LOCATION}]
    wait_until(lambda: coverage(fleet) == EXPECTED, timeout=30, what="coverage kept once the event ended")

    def same_after(successor: FleetProcess, what: str) -> None:
        wait_until(lambda: coverage(successor) == EXPECTED, timeout=60, what=f"coverage after {what}")
        wait_until(lambda: count(successor, "azure_scheduled_fleet_vms") == 3, timeout=30, what=f"VMs after {what}")
        wait_until(lambda: [dict(labels)["event_status"] for (name, labels) in successor.samples()
                            if name == "azure_scheduled_fleet_platform_event_info"] == ["Completed"], timeout=30,
                   what=f"the event listed as Completed after {what}")
        not_twice(successor, what)

    def not_twice(successor: FleetProcess, what: str) -> None:
        for name in ("azure_scheduled_fleet_platform_events_total", "azure_scheduled_fleet_missed_events_total",
                     "azure_scheduled_fleet_impact_seconds_total", "azure_scheduled_fleet_platform_duplicates_total",
                     "azure_scheduled_fleet_unannounced_events_total",
                     "azure_scheduled_fleet_announcement_lag_seconds_count"):
            assert sum(value for (sample, _labels), value in successor.samples().items() if sample == name) == 0, \
                f"{name} counted again after {what}"

    assert fleet.stop() == 0
    successor = fleets(streams.sidecars_hub, *args, env=streams.env)
    same_after(successor, "SIGTERM and a successor")
    late = json.loads(next(stored.body for stored in streams.platform_hub.store.all()
                           if b'"EventStatus":"Started"' in stored.body))
    late[0]["id"] = "late-started"  # Event Grid's order is not the platform's: a Started after the Completed
    send(streams.platform_hub.connection_string(), [EventData(json.dumps(late))])
    wait_until(lambda: count(successor, "azure_scheduled_fleet_platform_messages_applied_total") >= 1, timeout=30,
               what="the late Started read")
    not_twice(successor, "a late Started")
    successor.kill()
    third = fleets(streams.sidecars_hub, *args, env=streams.env)
    wait_until(lambda: count(third, "azure_scheduled_fleet_owned_partitions") == 4, timeout=TAKEOVER + 30,
               what="the killed replica's partitions taken over")
    same_after(third, "kill -9 and a successor")
    reliability("Fleet", "the simulator's four VMs, three sidecars on them, and its platform copy on a second hub; a "
                "restart and a kill -9 of the replica", "every coverage state (observed, missed, imds_unreachable, "
                "no_sidecar) shown; Event Grid's duplicates, a late status out of order, a foreign Event Grid event "
                "and garbage counted and skipped; both pictures the same after SIGTERM and after kill -9, nothing "
                "counted twice")
