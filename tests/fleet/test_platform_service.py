"""The platform stream wired into the fleet service, against the in-memory state store: platform messages read first
on any hub, the picture stored beside the VM state and restored on claim, reconciliation and its counters counted
once over restarts, and a replica that shows part of the fleet. No network."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from azure.eventhub import CloseReason
from prometheus_client import CollectorRegistry

from se_exporter.fleet.collector import FleetMetrics
from se_exporter.fleet.consumer import Service
from se_exporter.fleet.main import partition_vms
from se_exporter.fleet.platform.coverage import Reconciler, ReconcileSettings
from se_exporter.fleet.platform.exposition import PlatformCollector
from se_exporter.fleet.platform.hubs import home
from se_exporter.fleet.platform.records import PlatformLimits
from se_exporter.fleet.platform.saving import decode_platform, platform_blob_name
from se_exporter.fleet.platform.service import BURST_MESSAGES, Platform
from se_exporter.fleet.report import Report
from se_exporter.fleet.settings import FleetSettings
from se_exporter.fleet.vms import Fleet
from tests.fleet.memory_store import MemoryStateStore, Stored
from tests.fleet.platform_helpers import EVENT_ID, KEY, SUB, T0, body, grid
from tests.fleet.test_service import NAME, Checkpoints, Context, Event, run, save

PLATFORM_NAME = platform_blob_name("ns", "hub", "$Default", "0")
MISSED = "azure_scheduled_fleet_missed_events_total"
GRACE = 60.0
OTHER_ID = "9A8B7C6D-5E4F-4A3B-8C2D-1E0F9A8B7C6D"


def platform(status: str, sequence_number: int, **kwargs: Any) -> Event:
    """A platform message (Event Grid's array of one) as the SDK hands it over, on any hub."""
    return Event(sequence_number, body=body([grid(status, at=T0 + 10 * ["Scheduled", "Started", "Completed"].index(
        status) if status != "Canceled" else T0 + 30, **kwargs)]))


def sidecar(sequence_number: int, vm_name: str, listed: tuple[str, ...] = (), sequence: int = 1,
            subscription: str = SUB, group: str = "rg") -> Event:
    """A sidecar's document of VM ``vm_name`` of scale set web, listing ``listed``."""
    document = {"DocumentIncarnation": sequence, "Events": [
        {"EventId": event_id, "EventType": "Reboot", "ResourceType": "VirtualMachine", "Resources": [vm_name],
         "EventStatus": "Scheduled", "NotBefore": "", "EventSource": "Platform"} for event_id in listed]}
    return Sidecar(sequence_number, vm_id=f"id-{vm_name}", sequence=sequence, body=json.dumps(document).encode(),
                   vm_name=vm_name, subscription=subscription, group=group)


@dataclass
class Sidecar(Event):
    vm_name: str = ""
    subscription: str = ""
    group: str = ""

    @property
    def properties(self) -> dict[Any, Any]:
        extra = {"vm_name": self.vm_name, "vmss_name": "web", "location": "westeurope",
                 "subscription_id": self.subscription, "resource_group": self.group}
        return {**super().properties, **{key.encode(): value.encode() for key, value in extra.items()}}


@dataclass
class Replica:
    """One replica reading one hub of ``partitions`` partitions (it claims "0"), on states shared with others."""

    states: dict[str, Stored] = field(default_factory=dict)
    partitions: int = 1
    now: list[float] = field(default_factory=lambda: [T0 + 1])
    partition_id: str = "0"

    def __post_init__(self) -> None:
        self.registry, self.fleet = CollectorRegistry(), Fleet()
        metrics = FleetMetrics(self.registry)

        async def sleep(seconds: float) -> None:
            return None

        def clock() -> float:
            return self.now[0]

        self.service = Service(FleetSettings(), self.fleet, metrics, MemoryStateStore(self.states), clock=clock,
                               sleep=sleep, monotonic=clock)
        self.platform = Platform(metrics, Report(metrics), 3600.0, GRACE, 900.0, 1024 * 1024, clock, sleep)
        self.service.hub_partitions = self.partitions
        reader = self.platform.reader("platform", self.fleet, MemoryStateStore(self.states),
                                      lambda: self.service.hub_partitions, MemoryStateStore(self.states),
                                      partition_vms(self.service, self.fleet))
        self.service.first_reader, self.service.keeper.beside = reader, reader
        self.checkpoints = Checkpoints(self.states)
        self.context = Context("ns", "hub", "$Default", self.partition_id, self.checkpoints)

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    async def claim(self) -> None:
        await self.service.on_initialize(self.context)

    async def read(self, *events: Event) -> None:
        self.context.newest = max(event.sequence_number for event in events)
        await self.service.on_batch(self.context, list(events))  # type: ignore[arg-type]

    def gauges(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Reconciled, and saved: a count is applied once the blob that remembers it is written."""
        self.platform.reconcile()
        run(save(self.service, self.partition_id))
        return {(sample.name, frozenset(sample.labels.items())): sample.value
                for family in PlatformCollector(lambda: self.platform.view).collect() for sample in family.samples}

    def coverage(self) -> dict[str, float]:
        return {dict(labels)["coverage"]: value for (name, labels), value in self.gauges().items()
                if name == "azure_scheduled_fleet_platform_event_vms"}


def test_platform_messages_on_a_hub_are_read_first_and_a_sidecars_document_is_read_as_before() -> None:
    """A platform message goes to the partition's picture (its info series and VM coverage), a sidecar's document
    beside it to the VMs; a duplicate and another Event Grid event type are counted and skipped."""
    replica = Replica()
    run(replica.claim())
    foreign = Event(4, body=body([{**grid(), "eventType": "Microsoft.Storage.BlobCreated"}]))
    run(replica.read(platform("Scheduled", 1, resources=["web_3", "web_7"]), sidecar(2, "web_3", (EVENT_ID,)),
                     platform("Scheduled", 3, resources=["web_3", "web_7"]), foreign, Event(5, body=b"[garbage")))
    assert [vm.vm_name for vm in replica.fleet.vms()] == ["web_3"]
    gauges = replica.gauges()
    [info] = [dict(labels) for (name, labels), _ in gauges.items() if name.endswith("platform_event_info")]
    assert (info["event_id"], info["event_status"], info["scope_name"], info["subscription_id"]) == (
        EVENT_ID, "Scheduled", "web", SUB)
    assert replica.coverage() == {"observed": 1.0, "missed": 0.0, "imds_unreachable": 0.0, "no_sidecar": 1.0}
    assert replica.value("azure_scheduled_fleet_platform_duplicates_total") == 1
    assert replica.value("azure_scheduled_fleet_invalid_messages_total", reason="other_event_type") == 1
    assert replica.value("azure_scheduled_fleet_invalid_messages_total", reason="not_json") == 1
    assert replica.value("azure_scheduled_fleet_platform_events_total", event_type="Reboot",
                         event_status="Scheduled") == 1
    assert replica.value("azure_scheduled_fleet_missed_events_total", event_type="Reboot", reason="no_sidecar") == 1
    assert replica.value("azure_scheduled_fleet_announcement_lag_seconds_count") == 1


def test_statuses_in_any_order_and_the_impact_are_counted_once() -> None:
    """Completed before Started before Scheduled: each status counted once, the impact once both ends are known
    (10 s on two VMs), ended events listed with their real end."""
    replica = Replica()
    run(replica.claim())
    run(replica.read(platform("Completed", 1, resources=["web_3", "web_7"]),
                     platform("Started", 2, resources=["web_3", "web_7"])))
    replica.gauges()
    run(replica.read(platform("Scheduled", 3, resources=["web_3", "web_7"])))
    replica.gauges()
    for status in ("Scheduled", "Started", "Completed"):
        assert replica.value("azure_scheduled_fleet_platform_events_total", event_type="Reboot",
                             event_status=status) == 1, status
    assert replica.value("azure_scheduled_fleet_impact_seconds_total", event_type="Reboot", scope_name="web",
                         location="westeurope") == 20.0


def test_the_picture_is_written_before_the_checkpoint_and_a_restart_continues_it_without_counting_again() -> None:
    """The platform blob is at the checkpoint's position when it is written; a successor restores the picture and
    what was counted: replayed messages are skipped, and nothing is counted a second time."""
    states: dict[str, Stored] = {}
    first = Replica(states)
    run(first.claim())
    run(first.read(platform("Scheduled", 1, resources=["web_3"]), sidecar(2, "web_9")))
    first.now[0] = T0 + GRACE + 1
    first.gauges()
    run(save(first.service, "0"))
    assert first.checkpoints.written == [(2, 2)] and states[PLATFORM_NAME].position == 2
    assert first.value("azure_scheduled_fleet_missed_events_total", event_type="Reboot", reason="no_sidecar") == 1
    loaded = decode_platform(states[PLATFORM_NAME].data, "0")
    assert [record.key for record in loaded.state.records] == [KEY] if loaded.state else False
    assert loaded.memory[KEY].statuses == {"Scheduled"} and loaded.memory[KEY].missed == {"web_3": "no_sidecar"}

    second = Replica(states, now=[T0 + GRACE + 2])
    run(second.claim())
    run(second.read(platform("Scheduled", 1, resources=["web_3"]), sidecar(2, "web_9"),
                    platform("Started", 3, resources=["web_3"])))
    assert second.coverage()["no_sidecar"] == 1.0
    assert second.value("azure_scheduled_fleet_replayed_documents_total") == 2
    assert second.value("azure_scheduled_fleet_platform_duplicates_total") == 0
    assert second.value("azure_scheduled_fleet_platform_events_total", event_type="Reboot",
                        event_status="Scheduled") == 0
    assert second.value("azure_scheduled_fleet_platform_events_total", event_type="Reboot", event_status="Started") == 1
    assert second.value("azure_scheduled_fleet_missed_events_total", event_type="Reboot", reason="no_sidecar") == 0


def test_a_picture_stored_past_the_vm_state_is_not_applied_twice() -> None:
    """kill -9 between the two writes: the platform blob at 3, the VM state at 1, the checkpoint at 1. The successor
    replays 2 and 3: the sidecar's document is applied, the platform message is not applied again."""
    states: dict[str, Stored] = {}
    first = Replica(states)
    run(first.claim())
    run(first.read(platform("Scheduled", 1, resources=["web_3"])))
    run(save(first.service, "0"))
    run(first.read(sidecar(2, "web_3"), platform("Started", 3, resources=["web_3"])))
    write = first.service.keeper.beside.prepare("0", 3) if first.service.keeper.beside else None
    assert write is not None
    run(write())  # the platform blob written, then killed before the VM state
    assert (states[PLATFORM_NAME].position, states[NAME].position) == (3, 1)
    second = Replica(states)
    run(second.claim())
    run(second.read(sidecar(2, "web_3"), platform("Started", 3, resources=["web_3"])))
    assert [vm.vm_name for vm in second.fleet.vms()] == ["web_3"]
    [record] = second.platform.reconcile().records
    assert record.status == "Started" and dict(record.times).keys() == {"Scheduled", "Started"}
    assert second.value("azure_scheduled_fleet_platform_duplicates_total") == 0


def test_a_hub_recreated_under_the_same_name_has_its_platform_messages_applied_not_replayed() -> None:
    """The stored platform picture claims sequence number 5, past the recreated hub's newest event 2: that position
    is damage (counted, as the VM state's is) and forgotten, so the new hub's platform messages are applied."""
    states: dict[str, Stored] = {}
    first = Replica(states)
    run(first.claim())
    run(first.read(*(sidecar(number, f"web_{number}") for number in range(1, 5)),
                   platform("Scheduled", 5, resources=["web_3"])))
    first.gauges()  # counted, and saved
    assert (states[PLATFORM_NAME].position, states[NAME].position) == (5, 5)
    second = Replica(states)
    run(second.claim())
    run(second.read(platform("Scheduled", 1, event_id=OTHER_ID, resources=["web_7"]), sidecar(2, "web_7")))
    second.gauges()
    assert {record.key for record in second.platform.reconcile().records} == {KEY, OTHER_ID.lower()}
    assert second.value("azure_scheduled_fleet_platform_events_total", event_type="Reboot",
                        event_status="Scheduled") == 1
    assert second.value("azure_scheduled_fleet_replayed_documents_total") == 0
    assert second.value("azure_scheduled_fleet_state_damaged_total", reason="position") == 2  # each stored state


def test_a_replica_showing_part_of_the_fleet_claims_no_blind_spot_and_counts_its_vms_and_its_homes() -> None:
    """With four partitions and one shown here, a VM not shown is not no_sidecar; the VMs shown here are judged
    here whatever the EventId; an EventId homed elsewhere is neither listed nor counted here (its home replica does
    both, from this partition's judgement), one homed here is."""
    assert home(KEY, 4) != "0"
    here = next(f"{index:08x}-0000-0000-0000-000000000000" for index in range(100)
                if home(f"{index:08x}-0000-0000-0000-000000000000", 4) == "0")
    replica = Replica(partitions=4)
    run(replica.claim())
    run(replica.read(platform("Scheduled", 1, resources=["web_3", "web_7"]),
                     platform("Scheduled", 2, resources=["web_3", "web_7"], event_id=here), sidecar(3, "web_3")))
    replica.now[0] = T0 + GRACE + 1
    gauges = replica.gauges()
    infos = {dict(labels)["event_id"] for (name, labels), _ in gauges.items() if name.endswith("event_info")}
    assert infos == {here}
    missed = {dict(labels)["event_id"]: value for (name, labels), value in gauges.items()
              if name.endswith("event_vms") and dict(labels)["coverage"] == "missed"}
    no_sidecar = sum(value for (name, labels), value in gauges.items()
                     if name.endswith("event_vms") and dict(labels)["coverage"] == "no_sidecar")
    assert missed == {EVENT_ID: 1.0, here: 1.0} and no_sidecar == 0
    assert replica.value("azure_scheduled_fleet_missed_events_total", event_type="Reboot", reason="missed") == 1
    assert replica.value("azure_scheduled_fleet_platform_events_total", event_type="Reboot",
                         event_status="Scheduled") == 1


def test_a_vms_miss_is_judged_where_it_is_shown_counted_by_the_home_and_not_again_after_a_hand_over() -> None:
    """The miss of a VM on partition 1 is judged by the replica showing partition 1 and kept in its blob; the
    EventId's home (partition 0, another replica) counts it once from that blob; partition 1's next owner shows the
    same coverage, and nothing is counted again."""
    states: dict[str, Stored] = {}
    event_id = homed("0", 2)
    home_replica = Replica(states, partitions=2)
    first = Replica(states, partitions=2, partition_id="1")
    for replica in (home_replica, first):
        run(replica.claim())
    run(home_replica.read(sidecar(1, "web_9")))
    run(first.read(platform("Scheduled", 1, resources=["web_3"], event_id=event_id), sidecar(2, "web_3")))
    first.now[0] = home_replica.now[0] = T0 + GRACE + 1
    assert first.coverage()["missed"] == 1.0  # judged, and saved
    assert first.value(MISSED, event_type="Reboot", reason="missed") == 0
    run(home_replica.platform.read_peers())
    home_replica.gauges()
    assert home_replica.value(MISSED, event_type="Reboot", reason="missed") == 1
    successor = Replica(states, partitions=2, partition_id="1", now=[T0 + GRACE + 2])
    run(successor.claim())
    run(successor.read(platform("Scheduled", 1, resources=["web_3"], event_id=event_id), sidecar(2, "web_3"),
                       sidecar(3, "web_3", sequence=2)))
    assert successor.coverage()["missed"] == 1.0
    run(home_replica.platform.read_peers())
    home_replica.gauges()
    assert successor.value(MISSED, event_type="Reboot", reason="missed") == 0
    assert home_replica.value(MISSED, event_type="Reboot", reason="missed") == 1


def test_a_fleet_without_platform_messages_reconciles_nothing() -> None:
    """No platform message, no platform series but the empty families, no reconciliation memory."""
    replica = Replica()
    run(replica.claim())
    run(replica.read(sidecar(1, "web_3", (EVENT_ID,))))
    assert replica.coverage() == {}
    assert replica.platform.reconciler.sizes()["pairs"] == 0
    assert asyncio.iscoroutinefunction(replica.platform.run)


def test_platform_messages_applied_are_counted_with_the_time_of_the_last() -> None:
    """Each platform message folded in counts once per batch, and the time of the last is kept (the benchmark's
    applied figure); a sidecar's document does not count there."""
    replica = Replica()
    run(replica.claim())
    run(replica.read(platform("Scheduled", 1), platform("Started", 2), sidecar(3, "web_3")))
    assert replica.value("azure_scheduled_fleet_platform_messages_applied_total") == 2
    assert replica.value("azure_scheduled_fleet_platform_last_applied_timestamp_seconds") == T0 + 1


def homed(partition_id: str, partitions: int) -> str:
    """An EventId whose home is ``partition_id``."""
    return next(f"{index:08x}-0000-0000-0000-000000000000" for index in range(1000)
                if home(f"{index:08x}-0000-0000-0000-000000000000", partitions) == partition_id)


def test_every_replica_knows_every_event_and_its_home_lists_and_counts_it_wherever_it_landed() -> None:
    """An EventId homed at partition 0 whose messages landed on partition 1 (another replica's): once that replica
    stored its picture, the home replica reads it, lists the event and counts its statuses; the other replica does
    neither, and judges the VMs it shows."""
    states: dict[str, Stored] = {}
    home_replica, other = Replica(states, partitions=2), Replica(states, partitions=2, partition_id="1")
    event_id = homed("0", 2)
    for replica in (home_replica, other):
        run(replica.claim())
    run(home_replica.read(sidecar(1, "web_9")))
    run(other.read(platform("Scheduled", 1, resources=["web_3"], event_id=event_id),
                   sidecar(2, "web_3", (event_id,))))
    assert [name for (name, _labels) in other.gauges() if name.endswith("event_info")] == []
    assert other.coverage() == {"observed": 1.0, "missed": 0.0, "imds_unreachable": 0.0, "no_sidecar": 0.0}
    run(save(other.service, "1"))
    run(home_replica.platform.read_peers())
    gauges = home_replica.gauges()
    assert [dict(labels)["event_id"] for (name, labels) in gauges if name.endswith("event_info")] == [event_id]
    assert home_replica.coverage() == {"observed": 0.0, "missed": 0.0, "imds_unreachable": 0.0, "no_sidecar": 0.0}
    assert home_replica.value("azure_scheduled_fleet_platform_events_total", event_type="Reboot",
                              event_status="Scheduled") == 1
    assert other.value("azure_scheduled_fleet_platform_events_total", event_type="Reboot",
                       event_status="Scheduled") == 0


def test_with_several_replicas_the_home_says_no_sidecar_once_every_partition_has_judged_the_event() -> None:
    """web_3's sidecar is on the other replica's partition, web_7 has none: the EventId's home says no_sidecar for
    web_7 (counted once) only once the other partition's blob says which named VMs are alive there, and never for
    web_3."""
    states: dict[str, Stored] = {}
    event_id = homed("0", 2)
    home_replica, other = Replica(states, partitions=2), Replica(states, partitions=2, partition_id="1")
    for replica in (home_replica, other):
        run(replica.claim())
    run(home_replica.read(platform("Scheduled", 1, resources=["web_3", "web_7"], event_id=event_id)))
    run(other.read(sidecar(1, "web_3")))
    home_replica.gauges()
    run(save(home_replica.service, "0"))
    assert home_replica.coverage()["no_sidecar"] == 0.0  # partition 1 has not judged the event yet
    run(other.platform.read_peers())
    assert other.coverage() == {"observed": 0.0, "missed": 0.0, "imds_unreachable": 0.0, "no_sidecar": 0.0}
    run(save(other.service, "1"))
    run(home_replica.platform.read_peers())
    assert home_replica.coverage() == {"observed": 0.0, "missed": 0.0, "imds_unreachable": 0.0, "no_sidecar": 1.0}
    home_replica.gauges()
    assert home_replica.value("azure_scheduled_fleet_missed_events_total", event_type="Reboot",
                              reason="no_sidecar") == 1
    other.now[0] = home_replica.now[0] = T0 + GRACE + 1
    assert other.coverage()["missed"] == 1.0 and home_replica.coverage()["no_sidecar"] == 1.0


def test_a_count_is_applied_once_remembered_so_a_partition_lost_before_its_write_is_counted_by_the_next_owner() -> None:
    """A status counted but not yet written is not applied; the partition lost before its write (no SIGTERM: its
    link stolen), the next owner counts it, and over both replicas it is counted once."""
    states: dict[str, Stored] = {}
    first = Replica(states)
    run(first.claim())
    run(first.read(platform("Scheduled", 1)))
    first.platform.reconcile()
    assert first.value("azure_scheduled_fleet_platform_events_total", event_type="Reboot",
                       event_status="Scheduled") == 0
    run(first.service.on_close(first.context, CloseReason.OWNERSHIP_LOST))
    successor = Replica(states)
    run(successor.claim())
    run(successor.read(platform("Scheduled", 1)))
    successor.gauges()
    assert successor.value("azure_scheduled_fleet_platform_events_total", event_type="Reboot",
                           event_status="Scheduled") == 1
    assert first.value("azure_scheduled_fleet_platform_events_total", event_type="Reboot",
                       event_status="Scheduled") == 0


def test_what_was_counted_of_an_event_goes_when_the_event_is_forgotten() -> None:
    """Past --platform-retention after its end the event leaves the picture, and its VMs' partitions' judgement of
    it with it; its home's memory of its counts stays as long as a forgotten EventId is remembered (a late copy
    on another partition then adds only what is new), then goes: memory stays bounded."""
    replica = Replica()
    run(replica.claim())
    run(replica.read(platform("Scheduled", 1, resources=["web_3", "web_7"]), sidecar(2, "web_3")))
    replica.now[0] = T0 + GRACE + 1
    replica.gauges()
    [held] = replica.platform.hubs["platform"].held.values()
    counted = held.counted  # the EventId's home is this partition
    assert held.judged.vms == {KEY: {"web_3": ("missed", None)}}
    assert counted[KEY].missed == {"web_3": "missed", "web_7": "no_sidecar"}
    run(replica.read(platform("Completed", 3, resources=["web_3", "web_7"])))
    replica.now[0] = T0 + GRACE + 1 + 3600 + 1
    replica.gauges()
    assert replica.coverage() == {} and held.judged.vms == {} and counted[KEY].gone_at == replica.now[0]
    replica.now[0] += replica.platform.limits.open_expiry
    replica.gauges()
    assert KEY not in counted


def test_the_events_listed_stay_within_one_pictures_bound_whatever_the_partitions_hold() -> None:
    """Pictures of several partitions merged list at most PlatformLimits.events EventIds (open ones first), so the
    series stay bounded per replica; the bound hit is counted once per EventId left out, not at every round."""
    states: dict[str, Stored] = {}
    replica, other = Replica(states, partitions=2), Replica(states, partitions=2, partition_id="1")
    replica.platform.limits = other.platform.limits = PlatformLimits(events=2)
    for each in (replica, other):
        run(each.claim())
    run(other.read(platform("Scheduled", 1, event_id=homed("0", 2)), platform("Completed", 2, event_id=homed("1", 2))))
    run(save(other.service, "1"))
    run(replica.read(platform("Scheduled", 1)))
    run(replica.platform.read_peers())
    assert len(replica.platform.reconcile().records) == 2
    assert replica.value("azure_scheduled_fleet_bound_hits_total", bound="platform_events") == 1
    for _round in range(3):  # the same EventId left out again: not a new hit (a rate on the counter says so)
        assert len(replica.platform.reconcile().records) == 2
    assert replica.value("azure_scheduled_fleet_bound_hits_total", bound="platform_events") == 1


def test_a_vm_counted_without_a_sidecar_is_not_counted_again_when_its_sidecar_appears_after_a_restart() -> None:
    """Each VM and EventId once, whatever the reason: web_3 counted as no_sidecar, then (after a restart) its sidecar
    appears without the event: it shows as missed, and is not counted a second time."""
    states: dict[str, Stored] = {}
    first = Replica(states)
    run(first.claim())
    run(first.read(platform("Scheduled", 1, resources=["web_3"]), sidecar(2, "web_9")))
    assert first.coverage()["no_sidecar"] == 1.0
    assert first.value("azure_scheduled_fleet_missed_events_total", event_type="Reboot", reason="no_sidecar") == 1
    successor = Replica(states, now=[T0 + GRACE + 5])
    run(successor.claim())
    run(successor.read(sidecar(3, "web_3")))
    assert successor.coverage()["missed"] == 1.0
    assert successor.value("azure_scheduled_fleet_missed_events_total", event_type="Reboot", reason="missed") == 0


def test_an_ended_events_observed_vms_stay_observed_after_a_restart() -> None:
    """web_3's sidecar listed the event, web_7's did not (missed); the event ends and leaves web_3's IMDS. A
    successor shows both as before, from the blob: web_3 observed (its lag remembered), web_7 missed."""
    states: dict[str, Stored] = {}
    first = Replica(states)
    run(first.claim())
    run(first.read(platform("Scheduled", 1, resources=["web_3", "web_7"]), sidecar(2, "web_3", (EVENT_ID,)),
                   sidecar(3, "web_7")))
    first.now[0] = T0 + GRACE + 1
    first.gauges()
    run(first.read(platform("Started", 4, resources=["web_3", "web_7"]),
                   platform("Completed", 5, resources=["web_3", "web_7"]), sidecar(6, "web_3", sequence=2)))
    expected = {"observed": 1.0, "missed": 1.0, "imds_unreachable": 0.0, "no_sidecar": 0.0}
    assert first.coverage() == expected
    successor = Replica(states, now=[T0 + GRACE + 5])
    run(successor.claim())
    run(successor.read(sidecar(7, "web_9")))
    assert successor.coverage() == expected
    assert successor.value("azure_scheduled_fleet_announcement_lag_seconds_count") == 0


def test_platform_messages_on_the_sidecars_hub_are_refused_while_the_platforms_own_hub_is_read() -> None:
    """With --platform-eventhub-* read, an Event Grid message on the sidecars' hub (where every VM may send) is
    counted invalid and applied to nothing: a sidecar cannot forge Azure's copy (end an event, or announce one)."""
    replica = Replica()
    sidecars = replica.platform.reader("sidecar", replica.fleet, MemoryStateStore(replica.states),
                                       lambda: replica.service.hub_partitions, MemoryStateStore(replica.states),
                                       partition_vms(replica.service, replica.fleet))
    replica.service.first_reader, replica.service.keeper.beside = sidecars, sidecars
    run(replica.claim())
    run(replica.read(platform("Scheduled", 1, resources=["web_3"]), sidecar(2, "web_3")))
    assert [vm.vm_name for vm in replica.fleet.vms()] == ["web_3"]
    assert not [name for (name, _labels) in replica.gauges() if name.endswith("platform_event_info")]
    assert replica.value("azure_scheduled_fleet_invalid_messages_total", reason="platform_on_sidecars_hub") == 1
    assert replica.value("azure_scheduled_fleet_platform_events_total", event_type="Reboot",
                         event_status="Scheduled") == 0


def test_an_event_id_listed_only_on_another_replica_is_counted_unannounced_once_by_its_home() -> None:
    """X, homed at partition 0, is listed only by web_3, whose sidecar is on partition 1 (the other replica), in
    scale set web, which has published a platform event: once partition 1's blob says web_3 listed X for the
    grace, X's home replica counts it unannounced, once; not again on the next round, nor after a restart."""
    states: dict[str, Stored] = {}
    unannounced = homed("0", 2)
    announced = next(f"{index:08x}-1111-0000-0000-000000000000" for index in range(1000)
                     if home(f"{index:08x}-1111-0000-0000-000000000000", 2) == "1")
    home_replica, other = Replica(states, partitions=2), Replica(states, partitions=2, partition_id="1")
    for replica in (home_replica, other):
        run(replica.claim())
    run(home_replica.read(sidecar(1, "web_9")))
    run(other.read(platform("Scheduled", 1, resources=["web_7"], event_id=announced),
                   sidecar(2, "web_3", (unannounced,))))
    other.now[0] = home_replica.now[0] = T0 + GRACE + 2
    for _round in range(2):
        other.gauges()
        run(home_replica.platform.read_peers())
        home_replica.gauges()
    assert home_replica.value("azure_scheduled_fleet_unannounced_events_total", event_type="Reboot") == 1
    assert other.value("azure_scheduled_fleet_unannounced_events_total", event_type="Reboot") == 0
    successor = Replica(states, partitions=2, now=[T0 + GRACE + 3])
    run(successor.claim())
    run(successor.read(sidecar(1, "web_9"), sidecar(2, "web_9", sequence=2)))
    run(successor.platform.read_peers())
    assert successor.platform.homes.is_here(unannounced)
    successor.gauges()
    assert successor.value("azure_scheduled_fleet_unannounced_events_total", event_type="Reboot") == 0


def test_reconciliation_is_put_off_by_a_burst_never_by_a_trickle() -> None:
    """Azure's usual trickle (a message every second or so) never puts a round off: put off, a short event could
    end unjudged and a miss never be said. A burst (BURST_MESSAGES since the last round, the last one recent) does."""
    rounds: list[int] = []
    stop = asyncio.Event()

    async def tick(_seconds: float) -> None:
        if len(ticks) == 3:
            stop.set()
        ticks.append(0)

    ticks: list[int] = []
    metrics = FleetMetrics(CollectorRegistry())
    platform = Platform(metrics, Report(metrics), 3600.0, GRACE, 900.0, 1024 * 1024, lambda: T0, tick)
    platform.reconcile = lambda: rounds.append(platform.applied_since) or platform.view  # type: ignore[method-assign]

    async def trickle() -> None:
        platform.applied_at, platform.applied_since = time.monotonic(), 3  # messages arrived just now, a few
        await platform.run(stop, 60.0)

    asyncio.run(trickle())
    assert len(rounds) == len(ticks)  # a round after every tick
    rounds.clear(), ticks.clear()
    stop.clear()

    async def burst() -> None:
        platform.applied_at, platform.applied_since = time.monotonic(), BURST_MESSAGES
        await platform.run(stop, 60.0)

    asyncio.run(burst())
    assert rounds == []  # within BURST_DEFERS_UP_TO of the start, and messages keep "arriving" (applied_at recent)


def test_a_partitions_judgement_is_bounded_and_the_hit_counted() -> None:
    """Past ``ReconcileSettings.pairs`` verdicts, a partition's judgement keeps those it had and takes no new one;
    the bound hit counts every one left out."""
    replica = Replica()
    replica.platform.reconciler = Reconciler(ReconcileSettings(900.0, GRACE, pairs=2))
    run(replica.claim())
    names = [f"web_{number}" for number in range(5)]
    run(replica.read(platform("Scheduled", 1, resources=names), *(sidecar(2 + index, name)
                                                                  for index, name in enumerate(names))))
    replica.now[0] = T0 + GRACE + 1
    replica.gauges()
    [held] = replica.platform.hubs["platform"].held.values()
    assert sum(map(len, held.judged.vms.values())) == 2
    assert replica.value("azure_scheduled_fleet_bound_hits_total", bound="platform_coverage_pairs") >= 3
