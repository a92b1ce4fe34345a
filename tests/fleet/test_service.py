"""The fleet service against the in-memory state store and the SDK's in-memory checkpoint store: claim, restore,
checkpoint after state, a state that never moves back, damaged and newer states, a partition lost and regained,
and close. No network."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any, TypeVar

from azure.eventhub import CloseReason
from azure.eventhub.aio import CheckpointStore, PartitionContext
from azure.eventhub.amqp import AmqpMessageBodyType
from prometheus_client import CollectorRegistry

from se_exporter.fleet import received
from se_exporter.fleet.collector import FleetMetrics
from se_exporter.fleet.consumer import Service
from se_exporter.fleet.message import read_message
from se_exporter.fleet.settings import FleetSettings
from se_exporter.fleet.stateformat import decode, encode_base
from se_exporter.fleet.statestore import new_block_id, state_blob_name
from se_exporter.fleet.vms import Fleet
from tests.fleet.memory_store import MemoryStateStore, Stored
from tests.fleet.test_vms import EMPTY, NOW, props

T = TypeVar("T")
NAME = state_blob_name("ns", "hub", "$default", "0")
ENQUEUED = datetime.fromtimestamp(NOW - 60, tz=timezone.utc)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


async def save(service: Service, partition_id: str) -> None:
    """Write the partition's state and checkpoint now, as the periodic write does when it is due."""
    await service.keeper.save(service.partitions[partition_id])


@dataclass
class Event:
    """What the service reads of the SDK's EventData (and what a checkpoint takes from it)."""

    sequence_number: int
    vm_id: str = "vm-a"
    sequence: int = 1
    body: bytes = EMPTY
    body_type: Any = AmqpMessageBodyType.DATA
    enqueued_time: datetime = ENQUEUED

    @property
    def offset(self) -> str:
        return str(self.sequence_number * 100)

    @property
    def properties(self) -> dict[Any, Any]:
        return props(self.sequence, vm_id=self.vm_id)

    @property
    def message_id(self) -> bytes:
        return f"inst-{self.vm_id}:{self.sequence}".encode()

    @property
    def partition_key(self) -> bytes:
        return self.vm_id.encode()

    @property
    def raw_amqp_message(self) -> SimpleNamespace:
        return raw_message(self.sequence_number, self.enqueued_time, self.body_type, self.body, self.properties,
                           self.message_id, self.partition_key)


def raw_message(sequence_number: int, enqueued: datetime, body_type: Any, body: bytes, properties: Any,
                message_id: bytes, partition_key: bytes, newest: tuple[int, datetime] | None = None,
                ) -> SimpleNamespace:
    """What the SDK's ``EventData.raw_amqp_message`` holds of an event (the fleet reads it there), with the
    partition's newest event as the receiver delivers it beside the event."""
    def ms(when: datetime) -> int:
        return round(when.timestamp() * 1000)

    return SimpleNamespace(
        annotations={received.SEQUENCE_NUMBER: sequence_number, received.ENQUEUED_TIME: ms(enqueued),
                     received.PARTITION_KEY: partition_key},
        delivery_annotations=None if newest is None else {received.NEWEST_SEQUENCE: newest[0],
                                                          received.NEWEST_TIME: ms(newest[1])},
        body_type=body_type, body=body, application_properties=properties,
        properties=SimpleNamespace(message_id=message_id))


class Checkpoints(CheckpointStore):  # type: ignore[misc]  # the SDK's class is untyped
    """An in-memory checkpoint store on the SDK's public interface, noting for each checkpoint the stored state's
    position at that moment."""

    def __init__(self, states: dict[str, Stored]) -> None:
        self.states = states
        self.written: list[tuple[int, int | None]] = []  # (checkpoint, the stored state's position then)
        self.checkpoints: dict[str, dict[str, Any]] = {}

    async def list_ownership(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return []

    async def claim_ownership(self, ownership_list: list[dict[str, Any]], **kwargs: Any) -> list[dict[str, Any]]:
        return list(ownership_list)

    async def update_checkpoint(self, checkpoint: dict[str, Any], **kwargs: Any) -> None:
        stored = self.states.get(NAME)
        self.written.append((int(checkpoint["sequence_number"]), stored.position if stored else None))
        self.checkpoints[checkpoint["partition_id"]] = checkpoint

    async def list_checkpoints(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return list(self.checkpoints.values())


class Context(PartitionContext):  # type: ignore[misc]  # the SDK's class is untyped
    """The SDK's partition context; the newest sequence number of the partition set by the test."""

    newest: int | None = None

    @property
    def last_enqueued_event_properties(self) -> dict[str, Any] | None:
        return None if self.newest is None else {"sequence_number": self.newest}


@dataclass
class Replica:
    """One service, its fleet and registry, on a store shared with other replicas."""

    states: dict[str, Stored] = field(default_factory=dict)
    slept: list[float] = field(default_factory=list)
    now: float = NOW  # the service's clock (its monotonic clock too)
    wall_step: float = 0.0  # how far its wall clock was stepped from ``now``

    def __post_init__(self) -> None:
        self.registry, self.fleet = CollectorRegistry(), Fleet()
        self.store = MemoryStateStore(self.states)
        self.checkpoints = Checkpoints(self.states)

        async def sleep(seconds: float) -> None:
            self.slept.append(seconds)

        self.service = Service(FleetSettings(), self.fleet, FleetMetrics(self.registry), self.store,
                               clock=lambda: self.now + self.wall_step, sleep=sleep, monotonic=lambda: self.now)
        self.context = Context("ns", "hub", "$Default", "0", self.checkpoints)

        async def newest(partition_id: str) -> int | None:  # the hub's answer: the newest event the test read
            return self.context.newest

        self.service.newest = newest

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def keys(self) -> list[str]:
        """The VMs shown (what /metrics writes)."""
        return sorted(vm.key for vm in self.fleet.vms())

    def held(self) -> list[str]:
        """The VMs held, shown or not."""
        return sorted(key for partition in self.service.partitions.values() for key in partition.state.vms)

    async def claim(self) -> None:
        await self.service.on_initialize(self.context)

    async def read(self, *events: Event) -> None:
        self.context.newest = max(event.sequence_number for event in events)
        await self.service.on_batch(self.context, list(events))  # type: ignore[arg-type]

    async def idle(self) -> None:
        """The SDK's empty batch: nothing arrived for EMPTY_BATCH_AFTER."""
        await self.service.on_batch(self.context, [])


def stored_state(position: int, *keys: str) -> Stored:
    """A state of one base block holding ``keys``, each VM last seen 100 s ago."""
    vms = [read_message(EMPTY, props(1, vm_id=key), f"inst-{key}:1".encode(), key.encode(), NOW - 100, 1024).vm
           for key in keys]
    block = new_block_id()
    data = encode_base("0", position, vms, block)
    return Stored(data, position, 1, [(block, data)])


def test_a_claim_restores_the_stored_state_before_the_partition_is_read() -> None:
    """The stored VMs are held once the partition is claimed (shown from its first batch on), and events the state
    holds count as replayed."""
    replica = Replica({NAME: stored_state(5, "vm-q", "vm-a")})
    run(replica.claim())
    assert replica.held() == ["vm-a", "vm-q"] and not replica.service.restoring
    assert replica.value("azure_scheduled_fleet_partition_claims_total") == 1
    run(replica.read(Event(5, "vm-a"), Event(6, "vm-b")))
    assert replica.keys() == ["vm-a", "vm-b", "vm-q"]
    assert replica.value("azure_scheduled_fleet_replayed_documents_total") == 1


def test_a_refusing_store_is_retried_with_backoff_until_it_answers() -> None:
    """While the store refuses, the claim waits (drawn from 1 s up to a ceiling doubling from 2 s), counting
    state_read errors; then it restores."""
    replica = Replica({NAME: stored_state(5, "vm-q")})
    replica.store.failures = [OSError("connection refused")] * 3
    run(replica.claim())
    assert len(replica.slept) == 3
    assert all(1.0 <= wait <= ceiling for wait, ceiling in zip(replica.slept, (2.0, 4.0, 8.0), strict=True))
    assert replica.value("azure_scheduled_fleet_consumer_errors_total", reason="state_read") == 3
    assert replica.held() == ["vm-q"]


def test_the_checkpoint_is_written_after_a_state_that_covers_it_and_never_moved_back() -> None:
    """Each checkpoint finds a stored state at or past it; a save with nothing new writes neither again."""
    replica = Replica()
    run(replica.claim())
    run(replica.read(Event(1, "vm-a"), Event(2, "vm-b")))
    run(save(replica.service, "0"))
    run(save(replica.service, "0"))  # nothing new
    run(replica.read(Event(3, "vm-c")))
    run(save(replica.service, "0"))
    assert replica.checkpoints.written == [(2, 2), (3, 3)]
    assert replica.value("azure_scheduled_fleet_checkpoints_total", outcome="ok") == 2
    assert replica.service.views["0"].unsaved_since is None


def test_the_stored_state_never_moves_back_when_two_owners_write() -> None:
    """During a hand-over the old owner's write of an older position gives way to the new owner's newer state, and
    it writes no checkpoint either."""
    states: dict[str, Stored] = {}
    old, new = Replica(states), Replica(states)
    run(old.claim())
    run(old.read(Event(1, "vm-a")))
    run(new.claim())
    run(new.read(Event(1, "vm-a"), Event(2, "vm-b"), Event(3, "vm-c")))
    run(save(new.service, "0"))
    run(old.read(Event(2, "vm-b")))
    run(save(old.service, "0"))
    assert states[NAME].position == 3
    assert old.value("azure_scheduled_fleet_checkpoints_total", outcome="superseded") == 1
    assert old.checkpoints.written == []


def test_a_write_whose_answer_was_lost_is_followed_by_the_checkpoint() -> None:
    """A periodic save cancelled after its state was stored but before it learnt so (a SIGTERM mid-write) leaves a
    state at the replica's own position under a revision it has not seen: the shutdown save writes it again and
    the checkpoint follows, rather than giving way to itself and leaving the checkpoint behind."""
    states: dict[str, Stored] = {}
    replica = Replica(states)
    run(replica.claim())
    run(replica.read(Event(1, "vm-a"), Event(2, "vm-b")))
    run(save(replica.service, "0"))
    run(replica.read(Event(3, "vm-c")))
    written = Replica(dict(states))  # the same events written by a save whose answer
    run(written.claim())  # never came back: the stored revision moves on without this replica's knowing
    run(written.read(Event(3, "vm-c")))
    run(save(written.service, "0"))
    states[NAME] = written.states[NAME]
    run(replica.service.on_close(replica.context, CloseReason.SHUTDOWN))
    assert replica.checkpoints.written == [(2, 2), (3, 3)]
    assert replica.value("azure_scheduled_fleet_checkpoints_total", outcome="superseded") == 0


def test_a_damaged_state_is_counted_and_replaced_by_the_next_write() -> None:
    """Bytes that are no state: counted with their reason, the partition read from its checkpoint, then replaced."""
    replica = Replica({NAME: Stored(b"not gzip", 9, 1)})
    run(replica.claim())
    assert replica.value("azure_scheduled_fleet_state_damaged_total", reason="unreadable") == 1
    run(replica.read(Event(1, "vm-a")))
    run(save(replica.service, "0"))
    assert list(decode(replica.states[NAME].data, "0", NOW).vms) == ["vm-a"]


def test_a_newer_formats_state_is_left_in_place_and_no_checkpoint_written() -> None:
    """A format this release does not know: the partition is read, but its state is never overwritten and no
    checkpoint is written, so the newer release finds its state intact."""
    newer = gzip.compress(json.dumps({"format": 4, "partition_id": "0", "sequence_number": 7}).encode())
    replica = Replica({NAME: Stored(newer, 7, 1)})
    run(replica.claim())
    run(replica.read(Event(8, "vm-a")))
    run(save(replica.service, "0"))
    assert replica.states[NAME].data == newer and replica.checkpoints.written == []
    assert replica.service.views["0"].newer_format and replica.keys() == ["vm-a"]


def test_a_lost_partition_is_dropped_whole_and_restored_when_regained() -> None:
    """Ownership lost: its VMs and bookkeeping leave at once, nothing written; claimed again: restored from what
    was stored, and its reading starts afresh (no stale last event or partition clock)."""
    replica = Replica()
    run(replica.claim())
    run(replica.read(Event(1, "vm-a")))
    run(save(replica.service, "0"))
    run(replica.read(Event(2, "vm-b")))
    run(replica.service.on_close(replica.context, CloseReason.OWNERSHIP_LOST))
    assert replica.keys() == [] and replica.service.partitions == {} and replica.service.views == {}
    assert replica.states[NAME].position == 1  # the unsaved event 2 is not written by a replica that lost it
    assert replica.value("azure_scheduled_fleet_partition_releases_total", reason="ownership_lost") == 1
    run(replica.claim())
    partition = replica.service.partitions["0"]
    assert replica.held() == ["vm-a"] and partition.last_event is None and partition.handled_at is None
    assert partition.saved == 1 and partition.checkpointed == -1


def test_shutdown_writes_the_state_and_checkpoint_before_releasing() -> None:
    """On SIGTERM's close the last state and checkpoint are written, then the partition is dropped."""
    replica = Replica()
    run(replica.claim())
    run(replica.read(Event(1, "vm-a"), Event(2, "vm-b")))
    run(replica.service.on_close(replica.context, CloseReason.SHUTDOWN))
    assert replica.checkpoints.written == [(2, 2)] and replica.keys() == []
    assert replica.value("azure_scheduled_fleet_partition_releases_total", reason="shutdown") == 1


def test_a_failed_write_keeps_the_state_in_memory_and_the_next_round_writes_it() -> None:
    """The store refusing a write: counted as an error, no checkpoint; the next save writes state then checkpoint."""
    replica = Replica()
    run(replica.claim())
    run(replica.read(Event(1, "vm-a")))
    replica.store.failures = [OSError("connection reset")]
    run(save(replica.service, "0"))
    assert replica.value("azure_scheduled_fleet_checkpoints_total", outcome="error") == 1
    assert replica.checkpoints.written == [] and NAME not in replica.states
    run(save(replica.service, "0"))
    assert replica.checkpoints.written == [(1, 1)]


def test_a_bound_is_counted_for_the_document_kept_not_for_an_older_one_dropped() -> None:
    """A document past events_per_vm counts one bound hit when applied; the same VM's older document, dropped,
    counts none."""
    many = json.dumps({"DocumentIncarnation": 1, "Events": [
        {"EventId": f"E{n}", "EventType": "Reboot", "EventStatus": "Scheduled", "Resources": [], "NotBefore": ""}
        for n in range(70)]}).encode()
    replica = Replica()
    run(replica.claim())
    run(replica.read(Event(1, "vm-a", sequence=2, body=many), Event(2, "vm-a", sequence=1, body=many)))
    assert replica.value("azure_scheduled_fleet_bound_hits_total", bound="events_per_vm") == 1


def test_liveness_is_measured_on_the_injected_monotonic_clock() -> None:
    """/healthz turns unhealthy 15 s after the watchdog last ran, on the service's own monotonic clock (a wall-clock
    step or the process's real clock does not move it)."""
    replica = Replica()
    assert replica.service.healthy
    replica.wall_step = 3600.0
    assert replica.service.healthy
    replica.now += 16.0
    assert not replica.service.healthy
