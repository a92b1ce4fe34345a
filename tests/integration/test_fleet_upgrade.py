"""Rolling upgrades of `se-exporter fleet`, for real: replicas of the previous release's state format
(``tests/fleet_format1.py``) and of this release share one checkpoint store (Azurite) and one hub (the suite's AMQP
server), and hand partitions back and forth in both directions."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable

import pytest

from se_exporter.fleet.blobstate import state_blob_name
from tests.conftest import Reliability
from tests.eventhubs_server import EventHubsTestServer, Store
from tests.fleet_helpers import EMPTY, Azurite, FleetProcess, envelope_for, event_data, send, vm_identity
from tests.helpers import wait_until
from tests.integration import test_fleet
from tests.integration.test_fleet import picture, settled, storage

azurite, container, fleets = test_fleet.azurite, test_fleet.container, test_fleet.fleets  # that module's fixtures

pytestmark = pytest.mark.integration
OLD = "tests.fleet_format1"  # a replica of the previous release: it reads and writes format 1 only


class Rollout:
    """The hub, the container, and what the test reads of them."""

    def __init__(self, hub: EventHubsTestServer, azurite: Azurite, container: str) -> None:
        self.hub, self.azurite, self.container = hub, azurite, container
        self.prefix = state_blob_name(f"127.0.0.1:{hub.port}", hub.store.hub, "$Default", "")
        self.sent: set[str] = set()
        self.where: dict[str, str] = {}  # vm_id -> its partition

    def send(self, indexes: range) -> None:
        envelopes = [envelope_for(vm_identity(index), EMPTY, 1, f"inst-{index}") for index in indexes]
        for envelope in envelopes:
            self.where[envelope.partition_key] = self.hub.store.partition_for(envelope.partition_key)
        send(self.hub.connection_string(), [event_data(envelope) for envelope in envelopes])
        self.sent |= {envelope.partition_key for envelope in envelopes}

    def blobs(self) -> dict[str, bytes]:
        with storage(self.azurite, self.container) as blobs:
            return {blob.name[len(self.prefix):]: blobs.download_blob(blob.name).readall()
                    for blob in blobs.list_blobs(name_starts_with=self.prefix)}

    def stored(self) -> dict[str, tuple[int, int, set[str]]]:
        """partition id -> (format, position, VMs) of its state blob."""
        states = {partition_id: json.loads(gzip.decompress(data)) for partition_id, data in self.blobs().items()}
        return {partition_id: (state["format"], state["sequence_number"],
                               {row[0] if isinstance(row, list) else row["key"] for row in state["vms"]})
                for partition_id, state in states.items()}

    def checkpointed(self) -> bool:
        """Every partition has its state and its checkpoint at its last event."""
        with storage(self.azurite, self.container) as blobs:
            marks = {blob.name.rsplit("/", 1)[-1]: int((blob.metadata or {}).get("sequencenumber", -1))
                     for blob in blobs.list_blobs(include=["metadata"]) if "/checkpoint/" in blob.name}
        stored = self.stored()
        for partition_id in ("0", "1"):
            last = self.hub.store.last(partition_id)
            if last is not None and not (marks.get(partition_id) == last.sequence_number
                                         and stored.get(partition_id, (0, -1))[1] == last.sequence_number):
                return False
        return True


def owned(replica: FleetProcess) -> float | None:
    return replica.value("azure_scheduled_fleet_owned_partitions")


def consumed(replica: FleetProcess) -> float:
    return replica.value("azure_scheduled_fleet_documents_consumed_total") or 0


def split(first: FleetProcess, second: FleetProcess, expected: set[str]) -> bool:
    """One partition each, and together every VM, each on one replica (not yet while a hand-over shows one on both:
    ``test_fleet.settled``)."""
    return owned(first) == 1 and owned(second) == 1 and set(settled([first, second]) or ()) == expected


def test_old_and_new_replicas_hand_partitions_back_and_forth_without_losing_a_vm(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess], azurite: Azurite,
        container: str, reliability: Reliability) -> None:
    """Under the default --state-format 1 a new replica restores an old one's state and the old one restores the
    new one's, nothing read again; with --state-format 2 the new replicas convert the stored states without new
    events, and an old replica that claims a format-2 partition leaves that state byte for byte and writes no
    checkpoint, so when a new replica takes it back every VM is there."""
    hub = hubs(Store(partition_count=2))
    rollout = Rollout(hub, azurite, container)
    rollout.send(range(12))
    assert set(rollout.where.values()) == {"0", "1"}

    old = fleets(hub, module=OLD)
    wait_until(lambda: set(picture([old])) == rollout.sent and rollout.checkpointed(), timeout=30,
               what="the old replica's picture, state and checkpoints")
    assert {state[0] for state in rollout.stored().values()} == {1}

    # Upgrade begins: a new replica takes a partition over from the old one's state, reading no event again.
    new = fleets(hub)
    wait_until(lambda: split(old, new, rollout.sent), timeout=30, what="one partition each, every VM")
    assert consumed(new) == 0
    old.stop()
    wait_until(lambda: owned(new) == 2 and set(picture([new])) == rollout.sent, timeout=30,
               what="the new replica owning both partitions, every VM")
    assert consumed(new) == 0  # the second partition came from the old replica's state too

    # Rollback: an old replica takes a partition over from the state the new one wrote.
    rollout.send(range(12, 24))
    wait_until(rollout.checkpointed, timeout=30, what="the new replica's states and checkpoints")
    assert {state[0] for state in rollout.stored().values()} == {1}
    old2 = fleets(hub, module=OLD)
    wait_until(lambda: split(new, old2, rollout.sent), timeout=30, what="one partition each, every VM")
    assert consumed(old2) == 0

    # Format 2, once every replica reads it: the stored states are converted within a checkpoint interval.
    new.stop()
    wait_until(lambda: owned(old2) == 2, timeout=30, what="the old replica owning both partitions")
    new2 = fleets(hub, "--state-format", "2")
    wait_until(lambda: split(old2, new2, rollout.sent), timeout=30, what="one partition each, every VM")
    old2.stop()
    wait_until(lambda: owned(new2) == 2 and {state[0] for state in rollout.stored().values()} == {2}, timeout=30,
               what="both states converted to format 2 without a new event")
    stored = rollout.stored()
    assert set().union(*(state[2] for state in stored.values())) == rollout.sent and consumed(new2) == 0

    # An old replica meeting format 2 anyway (a downgrade without setting --state-format 1 first) leaves it alone.
    before = rollout.blobs()
    old3 = fleets(hub, module=OLD)
    wait_until(lambda: owned(old3) == 1 and old3.value("azure_scheduled_fleet_state_newer_format_partitions") == 1
               and owned(new2) == 1, timeout=30, what="the old replica holding a format-2 partition")
    [(theirs, _)] = [(partition_id, state) for partition_id, state in stored.items()
                     if f"partition {partition_id} claimed" in old3.log()]
    rollout.send(range(24, 30))
    late = {vm_id for vm_id in rollout.sent if vm_id not in stored[theirs][2] | stored[str(1 - int(theirs))][2]}
    wait_until(lambda: consumed(old3) == len([v for v in late if rollout.where[v] == theirs]), timeout=30,
               what="the old replica reading its partition's new documents")
    ours = str(1 - int(theirs))
    wait_until(lambda: rollout.stored()[ours][1] == hub.store.last(ours).sequence_number,  # type: ignore[union-attr]
               timeout=30, what="the new replica's next state write")
    # Its checkpoint age grows past two checkpoint intervals (of 0.5 s): rounds in which it wrote nothing there.
    wait_until(lambda: (old3.value("azure_scheduled_fleet_partition_checkpoint_age_seconds", partition_id=theirs)
                        or 0) > 1.0, timeout=30, what="two checkpoint rounds on the old replica")
    assert rollout.blobs()[theirs] == before[theirs]
    assert set(picture([old3])) == {vm_id for vm_id in late if rollout.where[vm_id] == theirs}  # only what it read
    old3.stop()
    wait_until(lambda: owned(new2) == 2 and set(picture([new2])) == rollout.sent, timeout=30,
               what="the new replica owning both partitions again, every VM")
    reliability("Fleet", "rolling upgrade and rollback: replicas of the previous release's state format and of this "
                "release on one checkpoint store, partitions handed back and forth; then --state-format 2, and an "
                "old replica meeting it",
                "each took over from the other's state without reading an event again, no VM missing; format 2 "
                "converted the stored states without new events; the old replica left a format-2 state byte for "
                "byte and wrote no checkpoint over it, and the new replica taking it back showed every VM")
