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
from se_exporter.fleet.persistence import Partition
from se_exporter.fleet.settings import FleetSettings
from se_exporter.fleet.vms import Fleet, PartitionState
from tests.fleet.memory_store import MemoryStateStore
from tests.fleet.test_service import raw_message
from tests.fleet.test_vms import EMPTY, VM_ID, props


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
    newest: tuple[int, datetime] | None = None  # the partition's newest event, as delivered beside this one

    @property
    def raw_amqp_message(self) -> Any:
        return raw_message(self.sequence_number, self.enqueued_time, self.body_type, self.body, self.properties,
                           self.message_id, self.partition_key, self.newest)


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
    with it: after events 1 and 2 with 7 the newest (enqueued 30 s after 2), 5 events and 30 s behind; after an
    empty batch nothing waits."""
    run, _fleet, _registry = service()
    enqueued = datetime(2026, 11, 22, tzinfo=timezone.utc)
    newest = (7, enqueued + timedelta(seconds=30))
    events = [Event(1, props(1), enqueued_time=enqueued - timedelta(seconds=5)),
              Event(2, props(2), message_id=b"inst:2", enqueued_time=enqueued, newest=newest)]
    asyncio.run(run.on_batch(Context(), events))  # type: ignore[arg-type]
    assert (run.views["0"].lag_events, run.views["0"].lag_seconds) == (5.0, 30.0)
    asyncio.run(run.on_batch(Context(), []))  # type: ignore[arg-type]
    assert (run.views["0"].lag_events, run.views["0"].lag_seconds) == (0.0, 0.0)


def newest_of(hub: dict[str, int | None]) -> Any:
    """The hub's answer to ``get_partition_properties`` as ``Service.newest`` takes it (None: no answer)."""
    async def newest(partition_id: str) -> int | None:
        return hub.get(partition_id)

    return newest


def test_silence_is_measured_on_the_clock_only_up_to_when_the_hub_said_nothing_waits() -> None:
    """Long after its last event was read, a VM expires only once the hub says the partition's newest event is one
    already handled: not while the hub does not answer (this replica's own connection lost, the SDK meanwhile
    handing over empty batches), nor while events wait unread (a reconnect whose backlog is not read yet)."""
    run, fleet, _registry = service()  # its clock: long after the events' enqueue time
    asyncio.run(run.on_batch(Context(), [Event(1, props())]))  # type: ignore[arg-type,list-item]
    hub: dict[str, int | None] = {"0": None}
    run.newest = newest_of(hub)
    asyncio.run(run.on_batch(Context(), []))  # type: ignore[arg-type]  # an empty batch during the outage
    assert asyncio.run(run.expire_now()) == [] and [vm.key for vm in fleet.vms()] == [VM_ID]
    hub["0"] = 5  # back, with events 2 to 5 enqueued meanwhile and not read yet
    assert asyncio.run(run.expire_now()) == [] and [vm.key for vm in fleet.vms()] == [VM_ID]
    hub["0"] = 1  # nothing waits: the VM was silent on the hub too
    assert [vm.key for vm in asyncio.run(run.expire_now())] == [VM_ID] and fleet.vms() == []


def test_silence_on_the_partitions_own_timeline_needs_no_answer_from_the_hub() -> None:
    """A VM silent for --vm-expiry before the last event read expires though the hub never answers."""
    run, fleet, _registry = service()
    start = datetime(2026, 11, 22, tzinfo=timezone.utc)
    other = {**props(), b"vm_id": b"other", b"vm_name": b"other"}
    events = [Event(1, props(), enqueued_time=start),
              Event(2, other, partition_key=b"other", message_id=b"other:1",
                    enqueued_time=start + timedelta(seconds=FleetSettings().vm_expiry + 1))]
    asyncio.run(run.on_batch(Context(), events))  # type: ignore[arg-type]
    assert [vm.key for vm in asyncio.run(run.expire_now())] == [VM_ID]
    assert [vm.key for vm in fleet.vms()] == ["other"]


def test_a_message_retiring_a_name_is_counted_as_retired_and_leaves_no_vm() -> None:
    """A document by name, then its sidecar's message under the name retiring it: applied{kind="retired"}; the same
    again retires nothing and counts as older."""
    run, fleet, registry = service()
    name = b"WestNO_0"
    events = [Event(1, props(1, vm_id=""), b"inst:1", name),
              Event(2, props(2, retires_name=True), b"inst:2", name),
              Event(3, props(2, retires_name=True), b"inst:2", name)]
    asyncio.run(run.on_batch(Context(), events))  # type: ignore[arg-type]
    get = registry.get_sample_value
    assert get("azure_scheduled_fleet_documents_applied_total", {"kind": "change"}) == 1
    assert get("azure_scheduled_fleet_documents_applied_total", {"kind": "retired"}) == 1
    assert get("azure_scheduled_fleet_duplicate_documents_total", {"reason": "older"}) == 1
    assert fleet.vms() == [] and fleet.position("0") == 3
