"""`se-exporter fleet` against hostile producers, for real: the official SDK against the suite's AMQP server,
state in Azurite. What one VM (or anyone with Send rights) puts on the hub never stops a partition, never breaks
/metrics and never changes another VM's picture."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import pytest
from proton import Message, char, decimal32, decimal64

from se_exporter.fleet.statestore import state_blob_name
from tests.conftest import Reliability
from tests.integration import test_fleet
from tests.integration.test_fleet import storage
from tests.support.eventhubs_server import EventHubsTestServer, Store
from tests.support.fleet_helpers import EMPTY, FleetProcess, envelope_for, event_data, send, vm_identity
from tests.support.helpers import http_get, wait_until

azurite, container, fleets = test_fleet.azurite, test_fleet.container, test_fleet.fleets  # that module's fixtures

pytestmark = pytest.mark.integration
SURROGATE = (b'{"DocumentIncarnation": 2, "Events": [{"EventId": "\\ud800", "EventType": "Reboot", "Resources": '
             b'["vm-1"], "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT"}]}')
FORGED = (b'{"DocumentIncarnation": 9, "Events": [{"EventId": "FORGED", "EventType": "Redeploy", "Resources": '
          b'["vm-1"], "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2050 18:29:47 GMT"}]}')


def proton_message(envelope_properties: dict[str, object], message_id: str, key: str) -> Message:
    """A message as any AMQP client may send it, with property types the SDK's producer never writes."""
    message = Message(body=EMPTY, id=message_id, properties=envelope_properties)
    message.annotations = {"x-opt-partition-key": key}
    return message


def test_hostile_messages_are_skipped_and_the_partition_goes_on(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess],
        reliability: Reliability) -> None:
    """A surrogate EventId (shown escaped, /metrics 200), a 5,000-digit sequence, AMQP char, decimal32 and decimal64
    property values (which azure-eventhub cannot decode by itself) and a forged vm_id under another partition key:
    each is skipped or applied as it should be, and the documents after them in the same partition are applied,
    with the partition claimed once and no client error."""
    hub = hubs(Store(partition_count=1))
    victim = envelope_for(vm_identity(1), SURROGATE, 1, "victim")
    digits = envelope_for(vm_identity(2), EMPTY, 1, "digits")
    digits = replace(digits, properties={**digits.properties, "sequence": "9" * 5000})
    forged = envelope_for(vm_identity(1), FORGED, 2, "forger")
    forged_event = event_data(forged)
    forged_event.raw_amqp_message.annotations[b"x-opt-partition-key"] = "the-forgers-own-key"
    send(hub.connection_string(), [event_data(victim), event_data(digits), forged_event])
    third, fifth = envelope_for(vm_identity(3), EMPTY, 1, "amqp"), envelope_for(vm_identity(5), EMPTY, 1, "char")
    hub.store.append("0", proton_message({**third.properties, "sequence": decimal64(0x31C000000000007B)},
                                         third.message_id, third.partition_key), third.partition_key)
    odd = {**fifth.properties, "shard": char("a"), "weight": decimal32(0x3280007B)}
    hub.store.append("0", proton_message(odd, fifth.message_id, fifth.partition_key), fifth.partition_key)
    send(hub.connection_string(), [event_data(envelope_for(vm_identity(4), EMPTY, 1, "after"))])

    fleet = fleets(hub)
    wait_until(lambda: fleet.value("azure_scheduled_fleet_vms") == 3, timeout=30,
               what="the victim, the char VM and the VM after the bad messages")
    status, _text = http_get(fleet.metrics_url)
    assert status == 200
    samples = fleet.samples()
    invalid = {reason: samples.get(("azure_scheduled_fleet_invalid_messages_total",
                                    frozenset({("reason", reason)})))
               for reason in ("bad_property", "wrong_partition_key")}
    assert invalid == {"bad_property": 2, "wrong_partition_key": 1}
    assert fleet.value("azure_scheduled_fleet_message_warnings_total", reason="unknown_property") == 1
    events = [dict(labels) for (name, labels) in samples if name == "azure_scheduled_fleet_event_info"]
    assert [(e["vm_id"], e["event_id"], e["affects_this_vm"]) for e in events] == [
        (str(vm_identity(1).vm_id), "\\ud800", "true")]  # the forger's Redeploy never shows for the victim
    assert fleet.value("azure_scheduled_fleet_partition_claims_total") == 1
    assert fleet.value("azure_scheduled_fleet_consumer_errors_total", reason="service") == 0
    assert "bad_property" in fleet.log() and "wrong_partition_key" in fleet.log()
    reliability("Fleet", "hostile documents: a lone-surrogate EventId, a 5,000-digit sequence, AMQP char, "
                "decimal32 and decimal64 property values, a forged vm_id under another partition key",
                "/metrics answered 200 with the EventId spelt out; each bad one counted (bad_property, "
                "wrong_partition_key) and skipped; the documents after them applied; the partition claimed once, "
                "no client error; the forger's event never shown for the victim")


def test_damaged_and_newer_state_blobs_neither_stall_nor_get_overwritten(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess], azurite: object,
        container: str, reliability: Reliability) -> None:
    """Partition 0's state blob is valid gzip'd JSON of the wrong shape: counted as damaged and the partition read
    from the hub anyway. Partition 1's is a newer format: left exactly as it was, the partition read, and neither
    its state nor its checkpoint written by this older replica."""
    hub = hubs(Store(partition_count=2))
    by_partition: dict[str, list[str]] = {"0": [], "1": []}
    envelopes = []
    for index in range(12):
        envelope = envelope_for(vm_identity(index), EMPTY, 1, f"inst-{index}")
        by_partition[hub.store.partition_for(envelope.partition_key)].append(envelope.partition_key)
        envelopes.append(envelope)
    assert by_partition["0"] and by_partition["1"]
    send(hub.connection_string(), [event_data(envelope) for envelope in envelopes])
    newer = gzip.compress(json.dumps({"format": 4, "partition_id": "1", "whatever": "a newer release"}).encode())
    prefix = state_blob_name(f"127.0.0.1:{hub.port}", hub.store.hub, "$Default", "")  # the SDK's namespace: host:port
    with storage(azurite, container) as blobs:  # type: ignore[arg-type]
        blobs.create_container()
        blobs.upload_blob(prefix + "0", gzip.compress(b"[]"))
        blobs.upload_blob(prefix + "1", newer, metadata={"sequencenumber": "3"})
    fleet = fleets(hub)
    wait_until(lambda: fleet.value("azure_scheduled_fleet_vms") == 12, timeout=30, what="every VM, both partitions")
    assert fleet.value("azure_scheduled_fleet_state_damaged_total", reason="wrong_shape") == 1
    assert fleet.value("azure_scheduled_fleet_state_newer_format_partitions") == 1

    def zero_written() -> bool:
        """Partition 0's state, with its every VM, and then its checkpoint stored (a write may have come before
        its last VMs were applied, and the checkpoint follows the state)."""
        with storage(azurite, container) as blobs:  # type: ignore[arg-type]
            zero = json.loads(gzip.decompress(blobs.download_blob(prefix + "0").readall()))
            names = {blob.name.split("/", 3)[-1] for blob in blobs.list_blobs()}
        complete = isinstance(zero, dict) and zero["format"] == 3 and len(zero["vms"]) == len(by_partition["0"])
        return bool(complete and "checkpoint/0" in names)

    wait_until(zero_written, timeout=30, what="partition 0's state written anew with its every VM, then checkpointed")
    with storage(azurite, container) as blobs:  # type: ignore[arg-type]
        assert blobs.download_blob(prefix + "1").readall() == newer
        assert "checkpoint/1" not in {blob.name.split("/", 3)[-1] for blob in blobs.list_blobs()}
    log = fleet.log()
    assert "damaged" in log and "newer" in log and "retrying" not in log
    reliability("Fleet", "a state blob of valid gzip'd JSON in the wrong shape; one of a newer format",
                "the damaged one counted (state_damaged_total), its partition read from the hub at once and its "
                "state written anew; the newer one left byte for byte, its partition read, neither state nor "
                "checkpoint written over it")


def test_a_state_blob_with_bad_rows_and_an_impossible_position_is_repaired(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess], azurite: object,
        container: str) -> None:
    """A state blob claiming sequence number 10**15, with rows whose vm_id is a number or whose seen_at is NaN
    beside a good one: the good row is restored, the bad rows are dropped and never written back, and the
    partition's events are applied rather than taken for replays."""
    hub = hubs(Store(partition_count=1))
    send(hub.connection_string(), [event_data(envelope_for(vm_identity(index), EMPTY, 1, f"inst-{index}"))
                                   for index in range(5)])
    quiet = vm_identity(50)
    good = {"key": quiet.vm_id, "vm_id": quiet.vm_id, "vm_name": quiet.name, "vmss_name": "", "location": "westeurope",
            "installation": "inst-q", "sequence": 3, "seen_at": time.time() - 10, "body": EMPTY.decode()}
    rows = [good, {**good, "key": 5, "vm_id": 5, "vm_name": "vm-5", "installation": "inst-5"},
            {**good, "key": "nan-vm", "vm_id": "nan-vm", "vm_name": "nan", "installation": "inst-n",
             "seen_at": float("nan")}]
    blob = gzip.compress(json.dumps({"format": 3, "block": "b1", "partition_id": "0", "sequence_number": 10**15,
                                     "vms": rows}).encode())
    name = state_blob_name(f"127.0.0.1:{hub.port}", hub.store.hub, "$Default", "0")
    with storage(azurite, container) as blobs:  # type: ignore[arg-type]
        blobs.create_container()
        blobs.upload_blob(name, blob, metadata={"sequencenumber": str(10**15)})
    fleet = fleets(hub)
    wait_until(lambda: fleet.value("azure_scheduled_fleet_vms") == 6, timeout=30,
               what="the five VMs of the partition and the quiet one restored")
    assert fleet.value("azure_scheduled_fleet_replayed_documents_total") == 0
    assert fleet.value("azure_scheduled_fleet_state_damaged_total", reason="row") == 2
    assert fleet.value("azure_scheduled_fleet_state_damaged_total", reason="position") == 1

    def stored() -> dict[str, object]:
        with storage(azurite, container) as blobs:  # type: ignore[arg-type]
            data: dict[str, object] = json.loads(gzip.decompress(blobs.download_blob(name).readall()))
            return data

    saved = wait_until(lambda: (state := stored())["sequence_number"] == 4 and state, timeout=30,
                       what="the repaired state written")
    assert sorted(row["key"] for row in saved["vms"]) == sorted(  # type: ignore[attr-defined]
        [quiet.vm_id] + [vm_identity(index).vm_id for index in range(5)])


def test_an_outage_of_the_fleets_own_connection_expires_no_vm(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess]) -> None:
    """The fleet loses its hub while the sidecars go on sending (their heartbeats enqueued all along): no VM is
    silent on its partition's timeline, so none expires however long the fleet is without a link (here three
    times --vm-expiry); once the hub is back the fleet reads what was enqueued meanwhile. The last batch before
    the outage said "caught up", and silence measured on the clock expired every VM."""
    store = Store(partition_count=2)
    hub = hubs(store)
    port, expiry, vms = hub.port, 4.0, 20
    beating, sent = threading.Event(), [0]

    def heartbeats() -> None:  # each VM every 0.5 s, into the hub's store: enqueued whether the hub serves or not
        sequence = 0
        while not beating.wait(0.5):
            sequence += 1
            for n in range(vms):
                envelope = envelope_for(vm_identity(n), EMPTY, sequence, f"inst{n}")
                store.append(None, proton_message(dict(envelope.properties), envelope.message_id,
                                                  envelope.partition_key), envelope.partition_key)
            sent[0] = sequence

    producer = threading.Thread(target=heartbeats, daemon=True)
    producer.start()
    try:
        fleet = fleets(hub, "--vm-expiry", f"{expiry:g}")
        wait_until(lambda: fleet.value("azure_scheduled_fleet_vms") == vms, timeout=30, what="every VM")
        hub.stop()
        outage_ends = time.monotonic() + 3 * expiry
        while time.monotonic() < outage_ends:  # the outage lasting is what is tested: polled, each poll must hold
            assert fleet.value("azure_scheduled_fleet_vms") == vms
            assert fleet.value("azure_scheduled_fleet_vm_expirations_total") == 0
            time.sleep(0.5)
        hubs(store, port=port)
        after = sent[0]
        wait_until(lambda: fleet.value("azure_scheduled_fleet_documents_applied_total", kind="change")
                   >= vms * after, timeout=60, what="what was enqueued during the outage, read")
        assert fleet.value("azure_scheduled_fleet_vms") == vms
        assert fleet.value("azure_scheduled_fleet_vm_expirations_total") == 0
    finally:
        beating.set()
        producer.join()


def test_one_vm_is_one_identity_and_one_event_id_is_one_series(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess]) -> None:
    """A VM heard first by name (its sidecar did not know its vm_id yet) and then by vm_id, the two on different
    partitions, is one VM; with a second VM listing the same EventId in the other letter case, the fleet shows 2
    VMs and one event_vms series of 2, labelled in lower case."""
    store = Store(partition_count=4)
    hub = hubs(store)
    index = next(n for n in range(100) if store.partition_for(vm_identity(n).name)
                 != store.partition_for(vm_identity(n).vm_id))  # the name and the vm_id on different partitions
    guid = "5D9B2A0E-1C3F-4B7A-9E21-0A4C6D8F1B3E"

    def freeze(event_id: str) -> bytes:
        return (b'{"DocumentIncarnation": 3, "Events": [{"EventId": "' + event_id.encode() + b'", "EventType": '
                b'"Freeze", "Resources": [], "EventStatus": "Scheduled", "NotBefore": "", "EventSource": "Platform"}]}')

    identity = vm_identity(index)
    by_name = envelope_for(replace(identity, vm_id=""), freeze(guid), 1, "inst-a")
    assert by_name.partition_key == identity.name
    fleet = fleets(hub)
    send(hub.connection_string(), [event_data(by_name)])
    wait_until(lambda: fleet.value("azure_scheduled_fleet_vms") == 1, timeout=30, what="the VM known by name")
    send(hub.connection_string(), [event_data(envelope_for(identity, freeze(guid), 2, "inst-a")),
                                   event_data(envelope_for(vm_identity(index + 1), freeze(guid.lower()), 1, "inst-b"))])
    wait_until(lambda: fleet.value("azure_scheduled_fleet_documents_applied_total", kind="change") == 3, timeout=30,
               what="the documents by vm_id")
    assert fleet.value("azure_scheduled_fleet_vms") == 2
    assert fleet.value("azure_scheduled_fleet_event_vms", event_id=guid.lower(), event_type="Freeze") == 2
    assert fleet.value("azure_scheduled_fleet_event_vms", event_id=guid, event_type="Freeze") is None
