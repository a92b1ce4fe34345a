"""Counting an EventId once, whatever the order and lateness of its messages: the late end, the Scheduled that
names more VMs after the end, two ends at one eventTime, Event Grid's copy on another partition. Through the
fleet service and its blobs (in memory), as ``test_platform_service.py`` drives it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fleet.platform_helpers import T0, body, grid
from tests.fleet.test_platform_service import Replica, homed
from tests.fleet.test_service import Event, run

IMPACT = "azure_scheduled_fleet_impact_seconds_total"
EVENTS = "azure_scheduled_fleet_platform_events_total"
DUPLICATES = "azure_scheduled_fleet_platform_duplicates_total"
LABELS = {"event_type": "Reboot", "scope_name": "web", "location": "westeurope"}


def message(status: str, sequence_number: int, at: float, resources: list[str], **kwargs: Any) -> Event:
    return Event(sequence_number, body=body([grid(status, at=at, resources=resources, **kwargs)]))


def events_total(replica: Replica) -> float:
    return sum(replica.value(EVENTS, event_type="Reboot", event_status=status)
               for status in ("Scheduled", "Started", "Completed", "Canceled"))


def test_an_event_whose_end_is_read_past_the_retention_after_its_event_time_is_counted() -> None:
    """A fleet replaying the hub (or Event Grid retrying) two hours late: Scheduled, Started and Completed dated
    2 h ago add their 600 s and their 3 statuses; the event is listed for --platform-retention from when its end
    was read."""
    replica = Replica(now=[T0 + 7200])
    run(replica.claim())
    run(replica.read(message("Scheduled", 1, T0 - 600, ["web_3"]), message("Started", 2, T0, ["web_3"]),
                     message("Completed", 3, T0 + 600, ["web_3"])))
    gauges = replica.gauges()
    assert replica.value(IMPACT, **LABELS) == 600.0
    assert events_total(replica) == 3
    assert [dict(labels)["event_status"] for (name, labels) in gauges if name.endswith("event_info")] == ["Completed"]
    replica.now[0] = T0 + 7200 + 3601
    assert [name for name in replica.gauges() if name[0].endswith("event_info")] == []


@pytest.mark.parametrize("scheduled_first", [True, False])
def test_the_impact_counts_every_vm_any_message_named_whichever_round_it_arrives_in(scheduled_first: bool) -> None:
    """A Scheduled naming three VMs, a Started and Completed naming one, 600 s apart: 1,800 s whether the Scheduled
    comes a round before or a round after the end (the impact counted at the end is topped up, never taken once)."""
    replica = Replica(now=[T0 + 700])
    run(replica.claim())
    scheduled = message("Scheduled", 1, T0 - 60, ["web_3", "web_7", "web_9"])
    ends = (message("Started", 2, T0, ["web_3"]), message("Completed", 3, T0 + 600, ["web_3"]))
    for batch in ((scheduled,), ends) if scheduled_first else (ends, (scheduled,)):
        run(replica.read(*batch))
        replica.gauges()
    assert replica.value(IMPACT, **LABELS) == 1800.0
    assert events_total(replica) == 3


@pytest.mark.parametrize("completed_first", [True, False])
def test_a_completed_and_a_canceled_at_one_event_time_end_as_completed_whichever_comes_first(
        completed_first: bool) -> None:
    """Two ends with one eventTime: Completed (the maintenance happened), whatever the arrival order; both counted."""
    replica = Replica(now=[T0 + 700])
    run(replica.claim())
    completed = message("Completed", 2, T0 + 600, ["web_3"])
    canceled = message("Canceled", 3, T0 + 600, ["web_3"])
    for ended in (completed, canceled) if completed_first else (canceled, completed):
        run(replica.read(ended))
        gauges = replica.gauges()
    [status] = [dict(labels)["event_status"] for (name, labels) in gauges if name.endswith("event_info")]
    assert status == "Completed"
    assert replica.value(EVENTS, event_type="Reboot", event_status="Canceled") == 1
    assert replica.value(EVENTS, event_type="Reboot", event_status="Completed") == 1


def test_event_grids_copy_delivered_to_another_partition_is_counted_as_a_duplicate_once() -> None:
    """The same Event Grid message on partition 0 and partition 1 (two replicas): applied once, and counted once in
    platform_duplicates_total over the two replicas, by the EventId's home, once it read the other's picture."""
    states: dict[str, Any] = {}
    event_id = homed("0", 2)
    home_replica, other = Replica(states, partitions=2), Replica(states, partitions=2, partition_id="1")
    for replica in (home_replica, other):
        run(replica.claim())
    copy = dict(grid_id="the-same-id", event_id=event_id)
    run(home_replica.read(message("Started", 1, T0, ["web_3"], **copy)))
    run(other.read(message("Started", 1, T0, ["web_3"], **copy)))
    other.gauges()
    run(other.service.save("1"))
    run(home_replica.platform.read_peers())
    home_replica.gauges()
    assert home_replica.value(DUPLICATES) + other.value(DUPLICATES) == 1
    assert home_replica.value(EVENTS, event_type="Reboot", event_status="Started") == 1
    assert other.value(EVENTS, event_type="Reboot", event_status="Started") == 0
