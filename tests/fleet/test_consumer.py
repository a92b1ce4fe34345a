"""The fleet's batch handler without a network: whatever one event holds, the handler returns (an exception out of
it makes the SDK close the partition, which is then claimed again and fails again, for ever)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from azure.eventhub.amqp import AmqpMessageBodyType
from prometheus_client import CollectorRegistry

from se_exporter.fleet.collector import FleetMetrics, PartitionView
from se_exporter.fleet.consumer import Service
from se_exporter.fleet.partition import Partition
from se_exporter.fleet.picture import Fleet, PartitionState
from se_exporter.fleet.settings import FleetSettings
from se_exporter.fleet.statestore import MemoryStateStore
from tests.fleet.test_picture import EMPTY, VM_ID, props


class Exploding(dict[Any, Any]):
    """Properties whose reading fails in a way no check foresaw."""

    def get(self, key: Any, default: Any = None) -> Any:
        raise RuntimeError("a property that cannot be read")


@dataclass
class Event:
    """What the handler reads of the SDK's EventData."""

    sequence_number: int
    properties: Any
    message_id: bytes = b"inst:1"
    partition_key: bytes = VM_ID.encode()
    body: bytes = EMPTY
    body_type: Any = AmqpMessageBodyType.DATA
    enqueued_time: datetime = field(default_factory=lambda: datetime(2026, 11, 22, tzinfo=timezone.utc))


@dataclass
class Context:
    partition_id: str = "0"
    last_enqueued_event_properties: dict[str, Any] = field(default_factory=lambda: {"sequence_number": 3})


def service() -> tuple[Service, Fleet, CollectorRegistry]:
    registry, fleet = CollectorRegistry(), Fleet()
    run = Service(FleetSettings(), fleet, FleetMetrics(registry), MemoryStateStore(), clock=lambda: 1_800_000_000.0)
    state = fleet.claim("0", PartitionState(position=10**15, restored_position=10**15))
    run.partitions["0"] = Partition(Context(), state, PartitionView())  # type: ignore[arg-type]
    return run, fleet, registry


def test_an_unforeseen_error_in_one_event_is_counted_and_the_batch_goes_on() -> None:
    """An event the handler fails on is counted as internal_error and skipped; the next one is applied."""
    run, fleet, registry = service()
    events = [Event(1, Exploding({b"vm_id": b"x"})), Event(2, props(sequence="9" * 5000)), Event(3, props())]
    asyncio.run(run.on_batch(Context(), events))  # type: ignore[arg-type]
    get = registry.get_sample_value
    assert get("azure_scheduled_fleet_invalid_messages_total", {"reason": "internal_error"}) == 1
    assert get("azure_scheduled_fleet_invalid_messages_total", {"reason": "bad_property"}) == 1
    assert [vm.key for vm in fleet.vms()] == [VM_ID]
    assert fleet.position("0") == 3


def test_a_restored_position_past_the_partitions_newest_event_is_counted_and_forgotten() -> None:
    """The state said 10**15, the partition's newest event is 3: counted as damage, and its events applied."""
    run, fleet, registry = service()
    asyncio.run(run.on_batch(Context(), [Event(3, props())]))  # type: ignore[arg-type,list-item]
    assert registry.get_sample_value("azure_scheduled_fleet_state_damaged_total", {"reason": "position"}) == 1
    assert registry.get_sample_value("azure_scheduled_fleet_replayed_documents_total") == 0
    assert len(fleet.vms()) == 1


def test_the_lag_shown_is_the_last_batchs_and_an_empty_batch_shows_none_waiting() -> None:
    """The lag a scrape shows is worked out from the last event handled and the newest event the SDK delivered
    with it: after events 1 and 2 with 7 the newest (enqueued 30 s after 2), 5 events and 30 s behind, and the
    expiry measures silence on the partition's own timeline; after an empty batch nothing waits."""
    run, _fleet, _registry = service()
    enqueued = datetime(2026, 11, 22, tzinfo=timezone.utc)
    newest = {"sequence_number": 7, "enqueued_time": enqueued + timedelta(seconds=30)}
    events = [Event(1, props(1), enqueued_time=enqueued - timedelta(seconds=5)),
              Event(2, props(2), message_id=b"inst:2", enqueued_time=enqueued)]
    asyncio.run(run.on_batch(Context(last_enqueued_event_properties=newest), events))  # type: ignore[arg-type]
    partition = run.partitions["0"]
    partition.context = Context(last_enqueued_event_properties=newest)  # type: ignore[assignment]
    assert (run.views["0"].lag_events, run.views["0"].lag_seconds) == (5.0, 30.0)
    assert not run.caught_up(partition)  # VMs' silence is measured from event 2's enqueue time, not the clock
    asyncio.run(run.on_batch(Context(), []))  # type: ignore[arg-type]
    assert (run.views["0"].lag_events, run.views["0"].lag_seconds) == (0.0, 0.0) and run.caught_up(partition)


def test_an_empty_batch_while_the_link_is_down_keeps_silence_on_the_partitions_timeline() -> None:
    """The SDK hands empty batches over while a partition has no link (this replica's own connection lost): nothing
    was read, which is not nothing waiting, so no VM expires on the wall clock however long that lasts; once the
    link is attached again, an empty batch means the partition is caught up, and silence is the clock's again."""
    run, fleet, _registry = service()  # its clock: long after the events' enqueue time
    asyncio.run(run.on_batch(Context(), [Event(1, props())]))  # type: ignore[arg-type,list-item]
    partition = run.partitions["0"]
    links = {"0": False}
    run.attached = links.get
    asyncio.run(run.on_batch(Context(), []))  # type: ignore[arg-type]
    assert not run.caught_up(partition)
    assert run.expire_now() == [] and [vm.key for vm in fleet.vms()] == [VM_ID]
    links["0"] = True
    asyncio.run(run.on_batch(Context(), []))  # type: ignore[arg-type]
    assert run.caught_up(partition)
    assert [vm.key for vm in run.expire_now()] == [VM_ID] and fleet.vms() == []
