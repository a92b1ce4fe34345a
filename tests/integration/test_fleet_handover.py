"""Hand-overs between real `se-exporter fleet` replicas (the official SDK against the suite's AMQP server, Azurite),
watched as a user's Prometheus sees them: every replica's /metrics scraped at once every 0.25 s."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from tests.eventhubs_server import EventHubsTestServer, Store
from tests.fleet_handover import Round, Watch, summary
from tests.fleet_helpers import FleetProcess, envelope_for, fleet_vm, produce, vm_identity
from tests.helpers import wait_until
from tests.integration.test_fleet import azurite, container, fleets  # noqa: F401 - the module's fixtures, shared

pytestmark = pytest.mark.integration
COUNT = 2_000  # VMs over 4 partitions


def partitions_of(store: Store, count: int) -> dict[str, str]:
    """vm_id -> the partition its documents go to (the key the sidecar sends them under)."""
    return {(identity := fleet_vm(index)[0]).vm_id: store.partition_for(
        envelope_for(identity, fleet_vm(index)[1], 1, "i").partition_key) for index in range(count)}


def settled(watch: Watch, shares: dict[int, int], fleet: frozenset[str], partition_of: dict[str, str]) -> bool:
    """The latest round showed the whole fleet, each VM once, replica ``k`` showing ``shares[k]`` partitions."""
    if not watch.rounds:
        return False
    last = watch.rounds[-1]
    return last.union == fleet and not last.overlap and all(
        len({partition_of[vm_id] for vm_id in last.shown[index]}) == count for index, count in shares.items())


def test_a_hand_over_shows_each_partition_on_one_replica_and_loses_no_vm(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess]) -> None:  # noqa: F811
    """Through a rebalance to a new replica, a SIGTERM of it, a rebalance to another and a kill -9 of that one,
    scraped every 0.25 s: every round shows only the fleet's VMs, all of them but whole partitions between owners,
    and a VM shown by two replicas is only ever of a partition whose previous receiver the hub had closed (stolen)
    after the newer of the two started: the new owner never shows a partition before it holds it (the overlap left
    is printed)."""
    hub = hubs(Store(partition_count=4))
    produce(hub.connection_string(), 4, COUNT, 0, 1, str(uuid.uuid4()))
    fleet = frozenset(vm_identity(index).vm_id for index in range(COUNT))
    partition_of = partitions_of(hub.store, COUNT)
    members: dict[str, set[str]] = {}
    for vm_id, partition_id in partition_of.items():
        members.setdefault(partition_id, set()).add(vm_id)
    started: list[float] = [time.monotonic()]
    replicas = [fleets(hub)]
    wait_until(lambda: replicas[0].value("azure_scheduled_fleet_vms") == COUNT
               and all(replicas[0].value("azure_scheduled_fleet_partition_checkpoint_age_seconds",
                                         partition_id=str(p)) == 0 for p in range(4)),
               timeout=60, interval=0.2, what="the first replica to show and write the whole fleet")
    watch = Watch(replicas, context=lambda: dict(hub.stolen_at))
    try:
        wait_until(lambda: settled(watch, {0: 4}, fleet, partition_of), timeout=30, interval=0.1, what="a full round")
        started.append(time.monotonic())
        replicas.append(fleets(hub))  # a rebalance: it steals two partitions
        wait_until(lambda: settled(watch, {0: 2, 1: 2}, fleet, partition_of), timeout=60, interval=0.2,
                   what="the second replica's share shown")
        replicas[1].stop()  # SIGTERM: state written, ownership released, the first takes it back
        wait_until(lambda: settled(watch, {0: 4, 1: 0}, fleet, partition_of), timeout=60, interval=0.2,
                   what="the first replica to show every partition again")
        started.append(time.monotonic())
        replicas.append(fleets(hub))
        wait_until(lambda: settled(watch, {0: 2, 2: 2}, fleet, partition_of), timeout=60, interval=0.2,
                   what="the third replica's share shown")
        replicas[2].kill()  # kill -9: its partitions move once its ownership expires
        wait_until(lambda: settled(watch, {0: 4, 2: 0}, fleet, partition_of), timeout=60, interval=0.2,
                   what="the first replica to show every partition after the kill")
    finally:
        rounds = watch.stop()
    full = next(index for index, one in enumerate(rounds) if one.union == fleet)
    print(f"\nhand-overs of {COUNT} VMs over 4 partitions: {summary(rounds[full:], len(fleet))}")
    for one in rounds[full:]:
        check_round(one, fleet, members, partition_of, started)


def check_round(one: Round, fleet: frozenset[str], members: dict[str, set[str]], partition_of: dict[str, str],
                started: list[float]) -> None:
    """What every round after the first full one must show (see the test's docstring)."""
    assert one.union <= fleet, f"VMs not in the fleet: {sorted(one.union - fleet)[:5]}"
    missing = fleet - one.union
    for partition_id in {partition_of[vm_id] for vm_id in missing}:
        assert members[partition_id] <= missing, f"partition {partition_id} shown in part"
    for vm_id in one.overlap:
        partition_id = partition_of[vm_id]
        newer = max(started[index] for index, ids in enumerate(one.shown) if vm_id in ids)
        stolen = one.after.get(partition_id)
        assert stolen is not None and stolen > newer, (
            f"partition {partition_id} shown by two replicas before its receiver moved to the newer one")
