"""`se-exporter fleet` for real: the official SDK against the suite's AMQP server, checkpoints and state in Azurite."""

from __future__ import annotations

import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from azure.eventhub import EventData
from azure.storage.blob import ContainerClient

from tests.conftest import Reliability
from tests.eventhubs_server import EventHubsTestServer, Store
from tests.fleet_helpers import (
    EMPTY,
    Azurite,
    FleetProcess,
    envelope_for,
    event_data,
    send,
    start_producers,
    vm_identity,
)
from tests.helpers import http_get, value, wait_until

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


def container_name(replica: FleetProcess) -> str:
    return replica.process.args[replica.process.args.index("--checkpoint-container") + 1]  # type: ignore[union-attr]


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


def test_sigterm_writes_state_releases_ownership_and_a_successor_rebuilds_from_it(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess], azurite: Azurite,
        reliability: Reliability) -> None:
    """SIGTERM ends the replica with exit 0 within 10 s after writing each partition's state and checkpoint and
    releasing it; a successor owns every partition long before the ownership expiry and shows the same VMs
    without reading a single event again: the picture comes from the state kept beside the checkpoints."""
    hub = hubs(Store(partition_count=4))
    for producer in start_producers(hub, 40, shares=1):
        assert producer.wait(60) == 0
    first = fleets(hub, "--ownership-expiry", "120")
    wait_until(lambda: first.value("azure_scheduled_fleet_vms") == 40, timeout=30, what="40 VMs")
    before = picture([first])
    first.process.terminate()
    stopped_at = time.monotonic()
    code = first.process.wait(10)
    assert (code, time.monotonic() - stopped_at < 10) == (0, True)
    assert "released (shutdown)" in first.log()
    container = ContainerClient.from_connection_string(azurite.connection_string, container_name(first))
    blobs = {blob.name.split("/", 3)[-1]: blob.metadata for blob in container.list_blobs(include=["metadata"])}
    assert {name for name in blobs if name.startswith("fleet-state/")} == {f"fleet-state/{p}" for p in "0123"}
    for partition_id in "0123":
        assert not blobs[f"ownership/{partition_id}"].get("ownerid")  # released, not left to expire
        assert blobs[f"checkpoint/{partition_id}"]["sequencenumber"] == \
            blobs[f"fleet-state/{partition_id}"]["sequencenumber"]  # the state covers the checkpoint exactly

    successor = fleets(hub, "--ownership-expiry", "120")
    wait_until(lambda: successor.value("azure_scheduled_fleet_owned_partitions") == 4, timeout=30,
               what="the successor to own every partition")
    wait_until(lambda: picture([successor]) == before, timeout=15, what="the same picture")
    assert successor.value("azure_scheduled_fleet_documents_consumed_total") == 0
    reliability("Fleet", "SIGTERM of a replica, then a successor (ownership expiry 120 s)",
                "exit 0 within 10 s; state and checkpoint written, ownership released; the successor owned every "
                "partition at once and showed the same VMs from the stored state, reading no event again")


def test_bad_messages_are_counted_and_logged_and_the_consumer_goes_on(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess],
        reliability: Reliability) -> None:
    """Not JSON, JSON that is no document, not our envelope, a body past --max-message-bytes: each is counted
    under its reason and logged, never fatal; unknown properties are counted and the document applied."""
    hub = hubs(Store(partition_count=1))
    good = envelope_for(vm_identity(1), EMPTY, 1, "inst")
    extra = envelope_for(vm_identity(2), EMPTY, 1, "inst2")
    odd = event_data(extra)
    odd.properties = {**dict(extra.properties), "shard": "7", "region_group": "emea"}
    bad_json = event_data(replace(envelope_for(vm_identity(3), EMPTY, 1, "inst3"), body=b"<html>captive</html>"))
    not_document = event_data(replace(envelope_for(vm_identity(4), EMPTY, 1, "inst4"), body=b'{"hello": 1}'))
    huge = event_data(envelope_for(vm_identity(5), b'{"Events": [], "Pad": "' + b"x" * 20_000 + b'"}', 1, "inst5"))
    stranger = EventData(b'{"DocumentIncarnation": 1, "Events": []}')  # no envelope properties, no message id
    send(hub.connection_string(), [bad_json, not_document, huge, stranger, odd, event_data(good)])
    fleet = fleets(hub, "--max-message-bytes", "8KiB")
    wait_until(lambda: fleet.value("azure_scheduled_fleet_vms") == 2, timeout=30, what="the two good documents")
    samples = fleet.samples()
    counts = {reason: value(samples, "azure_scheduled_fleet_invalid_messages_total", reason=reason)
              for reason in ("not_json", "invalid_document", "too_large", "not_envelope")}
    assert counts == {"not_json": 1, "invalid_document": 1, "too_large": 1, "not_envelope": 1}
    assert value(samples, "azure_scheduled_fleet_message_warnings_total", reason="unknown_property") == 1
    assert value(samples, "azure_scheduled_fleet_documents_consumed_total") == 6
    log = fleet.log()
    for reason in counts:
        assert f"reason={reason}" in log, reason
    assert "region_group, shard" in log
    assert http_get(fleet.base_url + "/healthz")[0] == 200
    send(hub.connection_string(), [event_data(envelope_for(vm_identity(6), EMPTY, 1, "inst6"))])
    wait_until(lambda: fleet.value("azure_scheduled_fleet_vms") == 3, timeout=15, what="a later good document")
    reliability("Fleet", "not JSON, JSON that is no document, no envelope, a body past --max-message-bytes, "
                "unknown properties", "each counted under its reason and logged; unknown properties applied and "
                "counted; the consumer went on")
