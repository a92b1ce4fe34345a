"""`se-exporter fleet` for real: the official SDK against the suite's AMQP server, checkpoints and state in Azurite."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
import yaml
from azure.core.exceptions import HttpResponseError
from azure.eventhub import EventData
from azure.identity.aio import ManagedIdentityCredential
from azure.storage.blob import ContainerClient
from azure.storage.blob.aio import ContainerClient as AsyncContainerClient

from se_exporter.fleet.stateformat import encode_base
from se_exporter.fleet.statestore import StateBlobs, state_blob_name
from se_exporter.simulator.identity import SYSTEM_ASSIGNED, TOKEN_PATH, USER_ASSIGNED
from tests.conftest import Reliability, SimulatorFactory
from tests.integration.test_dashboards import DASHBOARDS, dashboard_expressions, substitute
from tests.integration.test_fleet_two_streams import PLATFORM
from tests.integration.test_prometheus import Prometheus
from tests.support.certs import self_signed_certificate
from tests.support.eventhubs_server import EventHubsTestServer, Store
from tests.support.fleet_helpers import (
    DEV_KEY,
    EMPTY,
    Azurite,
    FleetProcess,
    connections,
    envelope_for,
    event_data,
    produce,
    reboot,
    send,
    start_producers,
    vm_identity,
)
from tests.support.helpers import Sidecar, free_port, http_get, value, wait_until

pytestmark = pytest.mark.integration
BALANCING = 0.5  # seconds between load-balancing rounds (the SDK's default is 30)
OWNERSHIP = 3.0  # seconds until a silent replica's partitions may be taken (the default is 180)
# Kill -9 -> the survivor owns everything: the ownership expires, then the next balancing round (the SDK adds up to
# 20% jitter) claims it; 2 s more for the claim's round trips to the storage and the test's reading them.
TAKEOVER = OWNERSHIP + BALANCING * 1.2 + 2.0
FAST = ("--load-balancing-interval", str(BALANCING), "--ownership-expiry", str(OWNERSHIP),
        "--checkpoint-interval", "0.5")
@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """One emulator for the module, over HTTPS and taking OAuth tokens as well as the account key (as a storage
    account does); every test uses its own container."""
    certificates = tmp_path_factory.mktemp("azurite-tls")
    emulator = Azurite(tmp_path_factory.mktemp("azurite"), tls=self_signed_certificate(certificates, "127.0.0.1"))
    yield emulator
    emulator.stop()


@pytest.fixture
def container(azurite: Azurite) -> str:
    return f"fleet-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def fleets(azurite: Azurite, container: str, tmp_path: Path) -> Iterator[Callable[..., FleetProcess]]:
    """Start `se-exporter fleet` replicas sharing this test's container: ``fleets(hub, *args)`` with connection
    strings, or ``fleets(None, *args, env=...)`` with the arguments naming the hub and the storage account."""
    started: list[FleetProcess] = []

    def make(hub: EventHubsTestServer | None, *args: str, env: dict[str, str] | None = None) -> FleetProcess:
        process = FleetProcess(hub.connection_string() if hub else None, azurite.connection_string if hub else None,
                               tmp_path / f"fleet{len(started)}", "--checkpoint-container", container,
                               "--checkpoint-ca-file", str(azurite.ca_file), *FAST, *args, env=env)
        started.append(process)
        return process

    yield make
    for process in started:  # all at once: each takes a second or two to release its partitions
        if process.process.poll() is None:
            process.process.terminate()
    for process in started:
        process.stop()
        assert "Unclosed" not in process.log()  # every client's HTTP session closed: checkpoint store, container


def storage(azurite: Azurite, container: str) -> ContainerClient:
    """The test's own view of a container, with the account key."""
    return ContainerClient.from_connection_string(azurite.connection_string, container,
                                                  connection_verify=str(azurite.ca_file))


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


def shown(replicas: list[FleetProcess]) -> tuple[dict[str, float], set[str]]:
    """vm_id -> last seen, over replicas, and the VMs shown by two."""
    seen: dict[str, float] = {}
    twice: set[str] = set()
    for replica in replicas:
        mine = last_seen(replica)
        twice |= mine.keys() & seen.keys()
        seen.update(mine)
    return seen, twice


def picture(replicas: list[FleetProcess]) -> dict[str, float]:
    """vm_id -> last seen, over replicas; fails if a VM shows on two."""
    seen, twice = shown(replicas)
    assert not twice, f"shown by two replicas: {sorted(twice)[:5]}"
    return seen


def settled(replicas: list[FleetProcess]) -> dict[str, float] | None:
    """The picture over replicas, or None (not yet) while a VM shows on two: in a hand-over the new owner shows a
    partition from its restore on and the old one until its link is stolen (Event Hubs has no fence between the
    two), which on a loaded machine is a scrape's worth of time. For waits; ``picture`` asserts it once settled."""
    seen, twice = shown(replicas)
    return None if twice else seen


def owners(azurite: Azurite, container: str) -> dict[str, str]:
    """partition id -> the owner id the SDK's load balancing wrote into the checkpoint store."""
    with storage(azurite, container) as blobs:
        return {blob.name.rsplit("/", 1)[-1]: (blob.metadata or {}).get("ownerid", "")
                for blob in blobs.list_blobs(include=["metadata"]) if "/ownership/" in blob.name}


@pytest.mark.long(seconds=90)
def test_ten_thousand_vms_split_over_two_replicas_survive_kill_and_restart(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess], azurite: Azurite,
        container: str, reliability: Reliability) -> None:
    """10,000 VMs show across two replicas, each exactly once; kill -9 of one leaves the other owning every
    partition within ownership expiry + one balancing interval with nothing missing; a restarted replica takes
    its share back and the two show the same picture as before within a minute."""
    hub = hubs(Store(partition_count=4))
    producers = start_producers(hub, 10_000)
    first, second = fleets(hub), fleets(hub)
    assert [producer.wait(120) for producer in producers] == [0, 0]
    wait_until(lambda: first.value("azure_scheduled_fleet_owned_partitions") == 2
               and second.value("azure_scheduled_fleet_owned_partitions") == 2
               and len(settled([first, second]) or ()) == 10_000, timeout=60, interval=0.5,
               what="10,000 VMs across the replicas, two partitions each")
    assert first.value("azure_scheduled_fleet_owned_partitions") == 2
    assert second.value("azure_scheduled_fleet_owned_partitions") == 2
    before = picture([first, second])
    assert set(before) == {vm_identity(index).vm_id for index in range(10_000)}
    assert 4_000 < len(last_seen(first)) < 6_000  # a split, not one replica doing it all
    blast = sum(float(match) for replica in (first, second) for match in re.findall(
        rb'^azure_scheduled_fleet_event_vms\{event_id="reboot-ss0",event_type="Reboot"\} (\S+)$', scrape(replica),
        re.MULTILINE))
    assert blast == len([i for i in range(10_000) if i % 10 == 0 and i % 7 == 0])  # summed over the replicas

    assert len(set(owners(azurite, container).values())) == 2
    first.kill()
    killed_at = time.monotonic()
    # Owning is claiming in the checkpoint store (the SDK's load balancing); /metrics counts a partition once its
    # state is restored too, which on a loaded machine takes its own seconds, so it is waited for apart.
    wait_until(lambda: len(set(owners(azurite, container).values())) == 1, timeout=TAKEOVER + 10, interval=0.2,
               what="the survivor to claim every partition")
    took_over = time.monotonic() - killed_at
    wait_until(lambda: second.value("azure_scheduled_fleet_owned_partitions") == 4, timeout=30,
               what="the survivor to read every partition")
    wait_until(lambda: picture([second]) == before, timeout=30, interval=0.5, what="the whole picture on the survivor")

    restarted = fleets(hub)
    started_at = time.monotonic()
    wait_until(lambda: restarted.value("azure_scheduled_fleet_owned_partitions") == 2
               and second.value("azure_scheduled_fleet_owned_partitions") == 2
               and settled([second, restarted]) == before, timeout=60, interval=0.5,
               what="the restarted replica's share, same picture")
    rebuilt = time.monotonic() - started_at
    duplicates = sum(value for replica in (second, restarted) for (name, _), value in replica.samples().items()
                     if name == "azure_scheduled_fleet_duplicate_documents_total")
    assert duplicates <= 10_000  # hand-overs may re-read a checkpoint interval; never more than was sent
    assert took_over < TAKEOVER, f"took over after {took_over:.1f} s"
    assert rebuilt < 60, f"rebuilt in {rebuilt:.1f} s"
    reliability("Fleet", f"10,000 VMs over two replicas; kill -9 of one, then a restart (ownership expiry "
                f"{OWNERSHIP:g} s, balancing every {BALANCING:g} s)",
                "each VM shown by exactly one replica; the survivor owned every partition within ownership expiry "
                "+ one balancing interval (+ 2 s to claim), nothing missing; the restarted replica took its share "
                "back and the two showed the same picture as before within a minute")


def test_sigterm_writes_state_releases_ownership_and_a_successor_rebuilds_from_it(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess], azurite: Azurite,
        reliability: Reliability) -> None:
    """SIGTERM ends the replica with exit 0 within 10 s after writing each partition's state and checkpoint and
    releasing it; a successor owns every partition long before the ownership expiry and shows the same VMs
    without reading a single event again: the picture comes from the state kept beside the checkpoints."""
    hub = hubs(Store(partition_count=4))
    produce(hub.connection_string(), hub.store.partition_count, 40, 0, 1, "installation")
    first = fleets(hub, "--ownership-expiry", "120")
    wait_until(lambda: first.value("azure_scheduled_fleet_vms") == 40, timeout=30, what="40 VMs")
    before = picture([first])
    first.process.terminate()
    stopped_at = time.monotonic()
    code = first.process.wait(10)
    assert (code, time.monotonic() - stopped_at < 10) == (0, True)
    assert "released (shutdown)" in first.log()
    with storage(azurite, container_name(first)) as container:
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
    under its reason and logged, never fatal; unknown properties are counted and the document applied. Neither
    key reaches the debug log or /metrics."""
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
    fleet = fleets(hub, "--max-message-bytes", "8KiB", "--log-level", "debug")
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
    metrics = http_get(fleet.metrics_url)[1]
    for secret in (DEV_KEY, "c2VjcmV0a2V5"):  # the storage account key and the hub's SharedAccessKey
        assert secret not in log and secret not in metrics
    send(hub.connection_string(), [event_data(envelope_for(vm_identity(6), EMPTY, 1, "inst6"))])
    wait_until(lambda: fleet.value("azure_scheduled_fleet_vms") == 3, timeout=15, what="a later good document")
    reliability("Fleet", "not JSON, JSON that is no document, no envelope, a body past --max-message-bytes, "
                "unknown properties", "each counted under its reason and logged; unknown properties applied and "
                "counted; the consumer went on")


SIDECAR_FAST = ("--poll-interval", "0.05", "--max-backoff", "0.2", "--eventhub-send-timeout", "1",
                "--eventhub-retry-max", "0.3")
# Fleet rule expressions that cannot light up within a test's seconds, and why; promtool's unit tests cover them.
NEEDS_MINUTES = {"SeExporterFleetConsumerLagging": "needs a backlog five minutes deep",
                 "SeExporterFleetPartitionsUnowned": "needs a partition no replica reads",
                 "SeExporterFleetCheckpointsStale": "needs five minutes of failing checkpoint writes",
                 "SeExporterFleetBlind": "needs every replica down, or none owning a partition, for five minutes"}


def platform_expressions() -> set[str]:
    """The dashboard queries and rules on the platform stream: this test's fleet reads only the sidecars' stream;
    tests/integration/test_fleet_two_streams.py lights them up on two replicas' platform series."""
    return {name for name, expr in dashboard_expressions(fleet_consumer=True) + fleet_rule_expressions()
            if PLATFORM.search(expr)}


def fleet_rule_expressions() -> list[tuple[str, str]]:
    data = yaml.safe_load((DASHBOARDS / "fleet-alerts.yaml").read_text())
    return [(rule["alert"], rule["expr"]) for group in data["groups"] for rule in group["rules"]]


def event_series(process: FleetProcess | Sidecar, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (sample, labels) in process.samples() if sample == name]


def test_round_trip_from_sidecars_to_the_fleet_view_and_its_dashboard(
        simulator: SimulatorFactory, sidecar: Callable[..., Sidecar], hubs: Callable[..., EventHubsTestServer],
        fleets: Callable[..., FleetProcess], tmp_path: Path, reliability: Reliability) -> None:
    """Two sidecars polling the simulator forward through the SDK; `fleet` shows each VM's events with the labels
    and countdown the sidecar itself shows; VMs that send heartbeats stay while silent ones expire; a completed and
    a canceled event leave its /metrics. Every expression of the fleet dashboard and rules runs on a real
    Prometheus scraping the consumer and returns data."""
    hub = hubs(Store(partition_count=2))
    sim_a, server_a = simulator("live-migration")  # WestNO_0: a Freeze listing WestNO_0 and WestNO_1
    sim_b, server_b = simulator("canceled", vm_name="ss_1")  # a Reboot scheduled, then canceled
    sim_b.vm.update(vmId="5d4b3a29-1c0e-4f8a-9b7d-6e5f4a3b2c1d", vmScaleSetName="ss")
    env = {"SE_EXPORTER_EVENTHUB_CONNECTION_STRING": hub.connection_string()}
    sidecars = [sidecar("--imds-url", server.url, *SIDECAR_FAST, "--heartbeat-interval", "0.5", env=env)
                for server in (server_a, server_b)]
    fleet = fleets(hub, "--vm-expiry", "4")
    for sim in (sim_a, sim_b):
        sim.advance(3)  # both events are listed from scenario second 2

    def listed() -> dict[str, dict[str, str]]:
        return {labels["vm_name"]: labels for labels in event_series(fleet, "azure_scheduled_fleet_event_info")}

    events = wait_until(lambda: len(listed()) == 2 and listed(), timeout=30, what="both VMs' events on the fleet")
    for process, sim in zip(sidecars, (sim_a, sim_b), strict=True):
        [own] = event_series(process, "azure_scheduled_event_info")
        shown = events[sim.vm["name"]]
        assert shown == {"vm_id": sim.vm["vmId"], "vm_name": sim.vm["name"], "vmss_name": sim.vm["vmScaleSetName"],
                         "location": sim.vm["location"], "event_id": own["event_id"].lower(),  # the canonical case
                         "event_type": own["event_type"],
                         "event_status": own["event_status"], "event_source": own["event_source"],
                         "affects_this_vm": own["affects_this_vm"]}
        theirs = process.value("azure_scheduled_event_seconds_until_not_before", event_id=own["event_id"],
                               event_type=own["event_type"])
        ours = fleet.value("azure_scheduled_fleet_event_seconds_until_not_before", vm_id=sim.vm["vmId"],
                           event_id=own["event_id"].lower())
        assert theirs is not None and ours is not None and abs(theirs - ours) < 5
    assert fleet.value("azure_scheduled_fleet_event_vms", event_id=events["WestNO_0"]["event_id"],
                       event_type="Freeze") == 1

    prom = Prometheus(fleet.base_url.removeprefix("http://"), tmp_path / "prometheus",
                      extra_targets=[f"127.0.0.1:{free_port()}"], rule_file=DASHBOARDS / "fleet-alerts.yaml",
                      job_name="se-exporter-fleet")
    try:
        wait_until(lambda: prom.value("sum(azure_scheduled_fleet_vms)") == 2
                   and prom.value('count(up{job="se-exporter-fleet"} == 0)') == 1, timeout=30,
                   what="Prometheus scraping the fleet and the dead replica")
        # Six VMs of scale set ss with a Reboot, and a message that is not a document: the rules' inputs. They send
        # no heartbeats, so --vm-expiry forgets them a few seconds later, while the sidecars' VMs stay.
        # And one VM whose sidecar reports that it cannot read IMDS (the imds_* properties of newer sidecars), and a
        # pause it felt during an event since ended.
        blind = envelope_for(vm_identity(20), EMPTY, 1, "inst-blind")
        blind = replace(blind, properties={**blind.properties, "imds_failing": True,
                                           "imds_last_success": "2026-11-22T03:00:00.000Z",  # and it paused
                                           "pauses": '{"E1": {"type": "Reboot", "longest": 2.0, "total": 2.0}}'})
        send(hub.connection_string(), [event_data(envelope_for(vm_identity(index, "ss"), reboot(index, "ss"), 1,
                                                               f"inst-{index}")) for index in range(10, 16)]
             + [event_data(blind), EventData(b"not a document")])
        expressions = dashboard_expressions(fleet_consumer=True) + fleet_rule_expressions()
        lit: set[str] = set()

        def look() -> None:
            lit.update(name for name, expr in expressions if prom.query(substitute(expr)))

        wait_until(lambda: prom.value("sum(azure_scheduled_fleet_vms)") == 9
                   and prom.query("sum(increase(azure_scheduled_fleet_invalid_messages_total[1m])) > 0")
                   and prom.query("sum(rate(azure_scheduled_fleet_documents_applied_total[10s])) > 0"),
                   timeout=30, what="Prometheus to see the scale set and the invalid message")
        look()
        wait_until(lambda: prom.query("sum(increase(azure_scheduled_fleet_vm_expirations_total[1m])) > 5"),
                   timeout=30, what="the scale set's silent VMs to expire")
        look()
        dark = {name for name, _ in expressions} - lit - set(NEEDS_MINUTES) - platform_expressions()
        assert not dark, f"expressions that never returned data: {sorted(dark)}"
    finally:
        prom.stop()
    assert fleet.value("azure_scheduled_fleet_vms") == 2  # the sidecars' VMs stay: their heartbeats keep them
    assert (fleet.value("azure_scheduled_fleet_documents_applied_total", kind="heartbeat") or 0) > 0

    sim_a.advance(900 + 30 + 5)  # the Freeze starts at NotBefore, lasts its 30 s, and is gone: completed
    sim_b.advance(300)  # past cancel_at: the Reboot is gone without starting
    wait_until(lambda: not {"WestNO_0", "ss_1"} & set(listed()), timeout=30, what="both events gone from fleet")
    assert fleet.value("azure_scheduled_fleet_vms") == 2  # the VMs stay; only their events left
    reliability("Fleet", "two sidecars on the simulator forwarding through the SDK; an event completed, one canceled",
                "each VM's events on the fleet view with the sidecar's own labels and countdown; both gone from "
                "/metrics when they ended; every fleet dashboard and rule expression returned data on Prometheus")


NOW = 1_800_000_000.0


def test_the_stored_state_only_moves_forward_between_two_owners(azurite: Azurite) -> None:
    """During a hand-over two owners may write one partition's state: a write that finds a newer state gives way,
    one that finds an older state overwrites it, so the stored position never goes back behind a checkpoint."""
    async def run() -> list[object]:
        async with AsyncContainerClient.from_connection_string(
                azurite.connection_string, f"state-{uuid.uuid4().hex[:12]}",
                connection_verify=str(azurite.ca_file)) as container:
            await container.create_container()
            old_owner, new_owner = StateBlobs(container), StateBlobs(container)
            for owner in (old_owner, new_owner):
                owner.name("0", state_blob_name("ns", "hub", "$default", "0"))
            async def save(owner: StateBlobs, position: int) -> bool:
                return await owner.save_blocks("0", position, lambda block: encode_base("0", position, [], block),
                                               None)

            outcomes: list[object] = [(await old_owner.load("0", NOW)).state, await save(old_owner, 5)]
            restored = (await new_owner.load("0", NOW)).state
            outcomes.append(restored.position if restored else None)
            outcomes += [await save(old_owner, 7),  # the old owner, still reading
                         await save(new_owner, 6),  # behind the stored 7: gives way
                         await save(new_owner, 9),  # ahead: overwrites
                         await save(old_owner, 8)]  # behind the stored 9: gives way
            reader = StateBlobs(container)
            reader.name("0", state_blob_name("ns", "hub", "$default", "0"))
            final = (await reader.load("0", NOW)).state
            outcomes.append(final.position if final else None)
            return outcomes

    assert asyncio.run(run()) == [None, True, 5, True, False, True, False, 9]


NAMESPACE = "myns.servicebus.windows.net"
STORAGE_AUDIENCE = "https://storage.azure.com"  # the storage SDK asks for https://storage.azure.com/.default
EVENTHUBS_AUDIENCE = "https://eventhubs.azure.net/"
HUB_CLIENT_ID = next(iter(USER_ASSIGNED))  # a user-assigned identity of the simulated VM
STORAGE_CLIENT_ID, STORAGE_OBJECT_ID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d", "1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e"


def test_azurite_takes_a_storage_token_and_refuses_no_token_or_another_audience(
        simulator: SimulatorFactory, azurite: Azurite) -> None:
    """The emulator the managed-identity test relies on checks bearer tokens: a token from the simulator's IMDS for
    the storage audience is taken, a request without credentials and one with an Event Hubs token are refused."""
    _sim, imds = simulator("live-migration")

    class ForResource:
        """A managed-identity token for ``resource``, whatever scope the storage SDK asks for."""

        def __init__(self, resource: str) -> None:
            self.resource, self.inner = resource, ManagedIdentityCredential()

        async def get_token(self, *scopes: str, **kwargs: Any) -> Any:
            return await self.inner.get_token(self.resource + "/.default")

        async def close(self) -> None:
            await self.inner.close()

    async def create(name: str, resource: str | None) -> str:
        credential = ForResource(resource) if resource else None
        try:
            async with AsyncContainerClient(azurite.account_url, name, credential=credential,
                                            connection_verify=str(azurite.ca_file)) as client:
                await client.create_container()
            return "created"
        except HttpResponseError as error:
            detail = re.search(r"<AuthenticationErrorDetail>(.*)</AuthenticationErrorDetail>", error.response.text())
            code = getattr(error.error_code, "value", error.error_code)  # a StorageErrorCode: a str enum
            return f"refused {error.status_code} {code}" + (f": {detail.group(1)}" if detail else "")
        finally:
            if credential:
                await credential.close()

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", imds.url)
        outcomes = [asyncio.run(create(f"{name}-{uuid.uuid4().hex[:8]}", resource)) for name, resource in
                    (("storage", STORAGE_AUDIENCE), ("anonymous", None), ("eventhubs", EVENTHUBS_AUDIENCE))]
    assert outcomes == ["created", "refused 403 AuthorizationFailure",
                        "refused 403 AuthenticationFailed: Invalid token audience."]


def test_managed_identity_end_to_end_without_a_key_resuming_from_its_checkpoint(
        simulator: SimulatorFactory, sidecar: Callable[..., Sidecar], fleets: Callable[..., FleetProcess],
        azurite: Azurite, container: str, tmp_path: Path, reliability: Reliability) -> None:
    """`fleet --eventhub-namespace --checkpoint-account-url`, given no connection string and no key: its tokens come
    from the simulator's IMDS (for Event Hubs as --eventhub-client-id, for storage as --checkpoint-client-id), the
    hub's CBS takes them over TLS and Azurite takes them over HTTPS; it shows the
    document a sidecar forwarded with its own managed identity, checkpoints into Azurite, and after SIGTERM a new
    replica resumes from that checkpoint (reading only the events after it, the VM's picture rebuilt from the
    stored state); its storage connections (trusting --checkpoint-ca-file) are reused; no token appears in its
    debug logs or /metrics."""
    sim, imds = simulator("live-migration")  # WestNO_0: a Freeze listed from scenario second 2, done 900 + 30 s on
    sim.identity.user_assigned[STORAGE_CLIENT_ID] = STORAGE_OBJECT_ID  # a second identity attached to the VM
    cert, key = self_signed_certificate(tmp_path)
    hub = EventHubsTestServer(Store(partition_count=2), token_key=sim.identity.key, tls=(cert, key)).start()
    identity = {"AZURE_POD_IDENTITY_AUTHORITY_HOST": imds.url}  # azure-identity's documented IMDS override
    endpoint = ("--eventhub-namespace", NAMESPACE, "--eventhub-name", hub.store.hub,
                "--eventhub-endpoint", f"sb://localhost:{hub.port}", "--eventhub-ca-file", str(cert))
    keyless = (*endpoint, "--eventhub-client-id", HUB_CLIENT_ID, "--checkpoint-account-url", azurite.account_url,
               "--checkpoint-client-id", STORAGE_CLIENT_ID, "--log-level", "debug", "--log-format", "json")
    try:
        forwarder = sidecar("--imds-url", imds.url, *SIDECAR_FAST, *endpoint, env=identity)
        first = fleets(None, *keyless, env=identity)
        sim.advance(3)
        wait_until(lambda: [labels["event_type"] for labels in event_series(first, "azure_scheduled_fleet_event_info")]
                   == ["Freeze"], timeout=30, what="the sidecar's Freeze on the fleet")
        wait_until(lambda: (first.value("azure_scheduled_fleet_checkpoints_total", outcome="ok") or 0) >= 1,
                   what="a checkpoint")
        # Storage connections are reused: one per request in flight (two clients, a request per partition at most
        # each, and one more), where a new TLS context per request opened a connection per request (16 by now).
        assert connections(first.process.pid, azurite.port) <= 2 * (hub.store.partition_count + 1)
        first.process.terminate()
        assert first.process.wait(10) == 0
        with storage(azurite, container) as blobs:
            checkpoints = {blob.name.rsplit("/", 1)[-1]: int(blob.metadata["sequencenumber"]) for blob in
                           blobs.list_blobs(name_starts_with=f"{NAMESPACE}/{hub.store.hub}/$default/checkpoint/",
                                            include=["metadata"])}
        [(partition_id, checkpoint)] = checkpoints.items()  # the one VM's partition; the other stayed empty
        last = hub.store.last(partition_id)
        assert last is not None and checkpoint == last.sequence_number  # everything read was checkpointed

        sim.advance(900 + 30 + 5)  # the Freeze has run and is gone: the sidecar forwards an empty document
        wait_until(lambda: (hub.store.last(partition_id) or last).sequence_number > checkpoint,
                   timeout=30, what="the sidecar's next document")
        # The hub holds the document before the sidecar has read the acknowledgement and counted it.
        forwarded = wait_until(lambda: (n := forwarder.value("azure_scheduled_events_forwarded_documents_total",
                                                            sink="eventhubs")) is not None and n >= 2 and n,
                               timeout=30, what="the sidecar to count its second acknowledged document")
        second = fleets(None, *keyless, env=identity)
        wait_until(lambda: second.value("azure_scheduled_fleet_vms") == 1
                   and not event_series(second, "azure_scheduled_fleet_event_info"), timeout=30,
                   what="the resumed replica to show the VM without its finished event")
        after = [event for event in hub.store.all() if event.partition_id == partition_id
                 and event.sequence_number > checkpoint]
        assert second.value("azure_scheduled_fleet_documents_consumed_total") == len(after) >= 1
        assert second.value("azure_scheduled_fleet_replayed_documents_total") == 0
        assert f"partition {partition_id} claimed: 1 VMs restored" in second.log()  # from the state blob
        assert forwarded is not None and forwarded >= 2
    finally:
        hub.stop()

    assert all(token.accepted and token.token_type == "jwt" for token in hub.cbs_tokens)  # noqa: S105 - a type name
    assert {token.claims["appid"] for token in hub.cbs_tokens if token.claims} == {SYSTEM_ASSIGNED[0], HUB_CLIENT_ID}
    requested = {(query["resource"][0], query.get("client_id", [None])[0]) for query in
                 (parse_qs(r.query) for r in sim.requests if r.path == TOKEN_PATH)}
    assert requested == {(EVENTHUBS_AUDIENCE, None),  # the sidecar's own, system-assigned
                         (EVENTHUBS_AUDIENCE, HUB_CLIENT_ID), (STORAGE_AUDIENCE, STORAGE_CLIENT_ID)}  # the fleet's
    logs, metrics = [], []
    for replica in (first, second):
        if replica.process.poll() is None:
            metrics.append(http_get(replica.metrics_url)[1])
        replica.stop()
        logs.append(replica.log())
        assert "Unclosed" not in logs[-1]  # the credentials', the checkpoint store's and the container's sessions
        command = " ".join(replica.process.args)  # type: ignore[arg-type]
        assert "AccountKey" not in command and "SharedAccess" not in command
    assert metrics and all('"level": "debug"' in log or '"level":"debug"' in log for log in logs), logs[0][:500]
    for token in sim.identity.issued:
        signature = token.rsplit(".", 1)[1]
        assert not any(signature in text for text in logs + metrics), "a token leaked"
    reliability("Fleet", "managed identity for Event Hubs (TLS, CBS) and the checkpoint store (Azurite over HTTPS "
                "with OAuth), no key anywhere; SIGTERM, then a new replica",
                "tokens from IMDS for each audience and identity; checkpointed into Azurite; the new replica read "
                "only the events after the checkpoint; no token in debug logs or /metrics")
