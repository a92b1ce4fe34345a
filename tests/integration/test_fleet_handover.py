"""Hand-overs between real `se-exporter fleet` replicas (the official SDK against the suite's AMQP server, Azurite),
watched as a user's Prometheus sees them: every replica's /metrics scraped at once every 0.25 s."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from tests.integration.test_fleet import azurite, container, fleets  # noqa: F401 - the module's fixtures, shared
from tests.support.eventhubs_server import EventHubsTestServer, Store
from tests.support.fleet_handover import Round, Watch, summary
from tests.support.fleet_helpers import FleetProcess, envelope_for, fleet_vm, produce, vm_identity
from tests.support.helpers import wait_until

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


class Scene:
    """One hub holding COUNT VMs, replicas started on it one by one, and the watch over them."""

    def __init__(self, hub: EventHubsTestServer, start: Callable[..., FleetProcess]) -> None:
        self.hub, self._fleets = hub, start
        produce(hub.connection_string(), 4, COUNT, 0, 1, str(uuid.uuid4()))
        self.fleet = frozenset(vm_identity(index).vm_id for index in range(COUNT))
        self.partition_of = partitions_of(hub.store, COUNT)
        self.members: dict[str, set[str]] = {}
        for vm_id, partition_id in self.partition_of.items():
            self.members.setdefault(partition_id, set()).add(vm_id)
        self.started: list[float] = []
        self.replicas: list[FleetProcess] = []
        self.watch: Watch | None = None

    def start(self, *args: str) -> FleetProcess:
        """A replica more; the first is waited for until it shows and has written the whole fleet, then watched."""
        self.started.append(time.monotonic())
        self.replicas.append(replica := self._fleets(self.hub, *args))
        if self.watch is None:
            wait_until(lambda: replica.value("azure_scheduled_fleet_vms") == COUNT
                       and all(replica.value("azure_scheduled_fleet_partition_checkpoint_age_seconds",
                                             partition_id=str(p)) == 0 for p in range(4)),
                       timeout=60, interval=0.2, what="the first replica to show and write the whole fleet")
            self.watch = Watch(self.replicas, context=lambda: dict(self.hub.stolen_at))
            self.settle({0: 4}, "a full round")
        return replica

    def settle(self, shares: dict[int, int], what: str) -> None:
        assert self.watch is not None
        watch = self.watch
        wait_until(lambda: settled(watch, shares, self.fleet, self.partition_of), timeout=60, interval=0.2, what=what)

    def check(self, name: str) -> None:
        """Every round after the first full one, as the tests' docstrings say; the overlap printed."""
        assert self.watch is not None
        rounds = self.watch.stop()
        full = next(index for index, one in enumerate(rounds) if one.union == self.fleet)
        print(f"\n{name}, {COUNT} VMs over 4 partitions: {summary(rounds[full:], len(self.fleet))}")
        for one in rounds[full:]:
            check_round(one, self.fleet, self.members, self.partition_of, self.started)


def test_a_hand_over_shows_each_partition_on_one_replica_and_loses_no_vm(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess]) -> None:  # noqa: F811
    """Through a rebalance to a new replica, a SIGTERM of it, a rebalance to another and a kill -9 of that one,
    scraped every 0.25 s: every round shows only the fleet's VMs, all of them but whole partitions between owners;
    a VM shown by two replicas for a moment is counted once by every shipped query (distinct vm_id), and the overlap
    is printed."""
    scene = Scene(hubs(Store(partition_count=4)), fleets)
    try:
        first = scene.start()
        second = scene.start()  # a rebalance: it steals two partitions
        scene.settle({0: 2, 1: 2}, "the second replica's share shown")
        second.stop()  # SIGTERM: state written, ownership released, the first takes it back
        scene.settle({0: 4, 1: 0}, "the first replica to show every partition again")
        third = scene.start()
        scene.settle({0: 2, 2: 2}, "the third replica's share shown")
        third.kill()  # kill -9: its partitions move once its ownership expires
        scene.settle({0: 4, 2: 0}, "the first replica to show every partition after the kill")
        assert first.process.poll() is None
    finally:
        scene.check("hand-overs")


def test_with_the_sdks_default_balancing_the_stolen_link_hides_the_partition_in_time(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess]) -> None:  # noqa: F811
    """The previous owner balancing every 30 s (the SDK's default) runs no round during the hand-over: the stolen
    link, as the SDK reports it, is its only sign. Scraped every 0.25 s through a rebalance to a new replica, the
    rounds hold as in the test above."""
    scene = Scene(hubs(Store(partition_count=4)), fleets)
    try:
        scene.start("--load-balancing-interval", "30", "--ownership-expiry", "180")
        scene.start("--ownership-expiry", "180")  # rounds every 0.5 s: steals one partition each, up to two
        scene.settle({0: 2, 1: 2}, "the second replica's share shown")
    finally:
        scene.check("a rebalance from a replica balancing every 30 s")


def check_round(one: Round, fleet: frozenset[str], members: dict[str, set[str]], partition_of: dict[str, str],
                started: list[float]) -> None:
    """What every round after the first full one must show (see the test's docstring)."""
    assert one.union <= fleet, f"VMs not in the fleet: {sorted(one.union - fleet)[:5]}"
    missing = fleet - one.union
    for partition_id in {partition_of[vm_id] for vm_id in missing}:
        assert members[partition_id] <= missing, f"partition {partition_id} shown in part"
    for vm_id in one.overlap:  # on two replicas for a moment: whole partitions, counted once by distinct vm_id
        partition_id = partition_of[vm_id]
        assert members[partition_id] <= one.overlap | missing, f"partition {partition_id} on two replicas in part"
