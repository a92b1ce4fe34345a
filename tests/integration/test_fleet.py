"""`se-exporter fleet` for real: the official SDK against the suite's AMQP server, checkpoints and state in Azurite."""

from __future__ import annotations

import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Reliability
from tests.eventhubs_server import EventHubsTestServer, Store
from tests.fleet_helpers import Azurite, FleetProcess, start_producers, vm_identity
from tests.helpers import wait_until

pytestmark = pytest.mark.integration
BALANCING = 0.5  # seconds between load-balancing rounds (the SDK's default is 30)
OWNERSHIP = 3.0  # seconds until a silent replica's partitions may be taken (the default is 180)
FAST = ("--load-balancing-interval", str(BALANCING), "--ownership-expiry", str(OWNERSHIP),
        "--checkpoint-interval", "0.5")
@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """One emulator for the module; every test uses its own container."""
    emulator = Azurite(tmp_path_factory.mktemp("azurite"))
    yield emulator
    emulator.stop()


@pytest.fixture
def fleets(azurite: Azurite, tmp_path: Path) -> Iterator[Callable[..., FleetProcess]]:
    """Start `se-exporter fleet` replicas sharing this test's container."""
    container = f"fleet-{uuid.uuid4().hex[:12]}"
    started: list[FleetProcess] = []

    def make(hub: EventHubsTestServer, *args: str) -> FleetProcess:
        process = FleetProcess(hub.connection_string(), azurite.connection_string, tmp_path / f"fleet{len(started)}",
                               "--checkpoint-container", container, *FAST, *args)
        started.append(process)
        return process

    yield make
    for process in started:
        process.stop()


LAST_SEEN = re.compile(rb'^azure_scheduled_fleet_vm_last_seen_timestamp_seconds\{[^}]*vm_id="([^"]+)"[^}]*\} (\S+)$',
                       re.MULTILINE)


def scrape(replica: FleetProcess) -> bytes:
    with urllib.request.urlopen(replica.metrics_url, timeout=20) as response:
        return bytes(response.read())


def last_seen(replica: FleetProcess) -> dict[str, float]:
    """vm_id -> last seen on one replica (a regular expression: the text parser takes seconds for 10,000)."""
    return {vm_id.decode(): float(value) for vm_id, value in LAST_SEEN.findall(scrape(replica))}


def picture(replicas: list[FleetProcess]) -> dict[str, float]:
    """vm_id -> last seen, over replicas; fails if a VM shows on two."""
    seen: dict[str, float] = {}
    for replica in replicas:
        mine = last_seen(replica)
        assert not mine.keys() & seen.keys(), f"shown by two replicas: {sorted(mine.keys() & seen.keys())[:5]}"
        seen.update(mine)
    return seen


def test_ten_thousand_vms_split_over_two_replicas_survive_kill_and_restart(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess],
        reliability: Reliability) -> None:
    """10,000 VMs show across two replicas, each exactly once; kill -9 of one leaves the other owning every
    partition within ownership expiry + one balancing interval with nothing missing; a restarted replica takes
    its share back and the two show the same picture as before within a minute."""
    hub = hubs(Store(partition_count=4))
    t0 = time.monotonic()
    producers = start_producers(hub, 10_000)
    first, second = fleets(hub), fleets(hub)
    assert [producer.wait(120) for producer in producers] == [0, 0]
    print("produced", time.monotonic() - t0)
    wait_until(lambda: len(picture([first, second])) == 10_000, timeout=60, interval=0.5,
               what="10,000 VMs across the replicas")
    print("visible", time.monotonic() - t0)
    assert first.value("azure_scheduled_fleet_owned_partitions") == 2
    assert second.value("azure_scheduled_fleet_owned_partitions") == 2
    before = picture([first, second])
    assert set(before) == {vm_identity(index).vm_id for index in range(10_000)}
    assert 4_000 < len(last_seen(first)) < 6_000  # a split, not one replica doing it all
    blast = sum(float(match) for replica in (first, second) for match in re.findall(
        rb'^azure_scheduled_fleet_event_vms\{event_id="REBOOT-ss0",event_type="Reboot"\} (\S+)$', scrape(replica),
        re.MULTILINE))
    assert blast == len([i for i in range(10_000) if i % 10 == 0 and i % 7 == 0])  # summed over the replicas

    first.kill()
    killed_at = time.monotonic()
    wait_until(lambda: second.value("azure_scheduled_fleet_owned_partitions") == 4,
               timeout=OWNERSHIP + BALANCING * 1.2 + 10, interval=0.2, what="the survivor to own every partition")
    took_over = time.monotonic() - killed_at
    print("took over", took_over)
    wait_until(lambda: picture([second]) == before, timeout=30, interval=0.5, what="the whole picture on the survivor")

    restarted = fleets(hub)
    started_at = time.monotonic()
    wait_until(lambda: restarted.value("azure_scheduled_fleet_owned_partitions") == 2
               and second.value("azure_scheduled_fleet_owned_partitions") == 2
               and picture([second, restarted]) == before, timeout=60, interval=0.5,
               what="the restarted replica's share, same picture")
    rebuilt = time.monotonic() - started_at
    print("rebuilt", rebuilt)
    duplicates = sum(value for replica in (second, restarted) for (name, _), value in replica.samples().items()
                     if name == "azure_scheduled_fleet_duplicate_documents_total")
    assert duplicates <= 10_000  # hand-overs may re-read a checkpoint interval; never more than was sent
    reliability("Fleet", "10,000 VMs over two replicas; kill -9 of one, then a restart",
                f"each VM shown exactly once; the survivor owned every partition {took_over:.1f} s after the kill "
                f"(ownership expiry {OWNERSHIP:g} s + balancing {BALANCING:g} s), nothing missing; the restarted "
                f"replica showed the same picture in {rebuilt:.1f} s")
