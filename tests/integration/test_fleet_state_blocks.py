"""The fleet's state for real: state blobs of a base block and delta blocks in Azurite through the official
azure-storage-blob SDK, written by two owners at once, and replicas killed with -9 while documents arrive."""

from __future__ import annotations

import asyncio
import json
import uuid
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from azure.storage.blob.aio import ContainerClient as AsyncContainerClient

from se_exporter.fleet.stateformat import encode_base, encode_delta
from se_exporter.fleet.statestore import StateBlobs, state_blob_name
from tests.fleet.test_state_blocks import document
from tests.fleet.test_state_format import vm
from tests.integration import test_fleet
from tests.integration.test_fleet import TAKEOVER, picture, settled, storage
from tests.support.eventhubs_server import EventHubsTestServer, Store
from tests.support.fleet_helpers import EMPTY, Azurite, FleetProcess, envelope_for, event_data, send, vm_identity
from tests.support.helpers import wait_until

azurite, container, fleets = test_fleet.azurite, test_fleet.container, test_fleet.fleets  # that module's fixtures

pytestmark = pytest.mark.integration
NOW = 1_800_000_000.0
NAME = state_blob_name("ns", "hub", "$default", "0")


def test_two_owners_write_bases_and_deltas_conditionally_and_a_restore_is_one_download(azurite: Azurite) -> None:
    """Deltas append to the block list the writer knows; another owner's newer state makes a write give way, an
    older one is replaced by a base; a blob written whole turns a delta into a base, and so does a position moved
    back; and a reader restores the exact state with a single request."""
    requests: list[str] = []

    async def run() -> dict[str, Any]:
        async with AsyncContainerClient.from_connection_string(
                azurite.connection_string, f"blocks-{uuid.uuid4().hex[:12]}", connection_verify=str(azurite.ca_file),
                raw_request_hook=lambda pipeline: requests.append(pipeline.http_request.method)) as blobs:
            await blobs.create_container()
            blob = blobs.get_blob_client(NAME)

            def store() -> StateBlobs:
                owner = StateBlobs(blobs)
                owner.name("0", NAME)
                return owner

            async def save(owner: StateBlobs, position: int, *vms: Any) -> bool:
                return await owner.save_blocks(
                    "0", position, lambda block: encode_base("0", position, vms, block),
                    lambda block: encode_delta(position, block, [], vms, []))

            async def committed() -> int:
                return len((await blob.get_block_list())[0])

            old, new = store(), store()
            result: dict[str, Any] = {"empty": (await old.load("0", NOW)).state}
            a, b = vm("vm-a", body=document(1)), vm("vm-b", body=document(2))
            result["writes"] = [await save(old, 5, a, b), await committed(),
                                await save(old, 6, vm("vm-a", 2, 1100.0, body=document(1))), await committed()]
            requests.clear()
            restored = (await new.load("0", NOW)).state
            result["restore"] = (list(requests), restored.position if restored else None,
                                 restored and {key: each.sequence for key, each in restored.vms.items()})
            a1, a2, b1 = (vm("vm-a", 3, 1200.0, body=document(1)), vm("vm-a", 4, 1400.0, body=document(1)),
                          vm("vm-b", 2, 1300.0, body=document(2)))
            result["race"] = [await save(old, 7, a1), await committed(),  # the old owner: a delta
                              await save(new, 9, b1), await committed(),  # the new one, ahead: a base
                              await save(old, 8, a2)]  # the old one, behind the stored 9: gives way
            # a blob written whole whose content names block ids it does not have
            await blob.upload_blob(encode_base("0", 9, [a, b], "0123456789ab"), overwrite=True,
                                   metadata={"sequencenumber": "9"})
            third = store()
            await third.load("0", NOW)
            result["whole"] = [await save(third, 10, vm("vm-b", 3, 1500.0, body=document(2))), await committed()]
            reader = store()
            final = (await reader.load("0", NOW)).state
            result["final"] = final and (final.position, {key: each.sequence for key, each in final.vms.items()})
            await reader.load("0", NOW)  # its block list known, then its position reset (a hub recreated)
            result["reset"] = [await save(reader, 3, vm("vm-c")), await committed()]
            reset = (await store().load("0", NOW)).state
            result["after_reset"] = reset and (reset.position, sorted(reset.vms))
            return result

    result = asyncio.run(run())
    assert result["empty"] is None
    assert result["writes"] == [True, 1, True, 2]
    assert result["restore"] == (["GET"], 6, {"vm-a": 2, "vm-b": 1})
    assert result["race"] == [True, 3, True, 1, False]
    assert result["whole"] == [True, 1]
    assert result["final"] == (10, {"vm-b": 3})  # the base (of what save() was given), not a delta on vm-a and vm-b
    assert result["reset"] == [True, 1] and result["after_reset"] == (3, ["vm-c"])  # a base, not a delta going back


def stored_blocks(azurite: Azurite, container: str, prefix: str) -> dict[str, list[dict[str, Any]]]:
    """partition id -> its state blob's blocks, each inflated (concatenated gzip members, read one by one)."""
    result: dict[str, list[dict[str, Any]]] = {}
    with storage(azurite, container) as blobs:
        for blob in blobs.list_blobs(name_starts_with=prefix):
            data, members = blobs.download_blob(blob.name).readall(), []
            while data:
                inflate = zlib.decompressobj(wbits=31)
                members.append(json.loads(inflate.decompress(data)))
                data = inflate.unused_data
            result[blob.name[len(prefix):]] = members
    return result


def test_replicas_killed_with_minus_9_mid_run_restore_the_exact_picture(
        hubs: Callable[..., EventHubsTestServer], fleets: Callable[..., FleetProcess], azurite: Azurite,
        container: str) -> None:
    """Two replicas write their partitions' states as a base and deltas of heartbeats; one is
    killed with -9 while documents arrive and the survivor shows exactly the picture the two showed (every VM, its
    last-seen time to the millisecond); a replica started after the survivor is killed too restores it again."""
    hub = hubs(Store(partition_count=2))
    prefix = state_blob_name(f"127.0.0.1:{hub.port}", hub.store.hub, "$Default", "")
    identities = [vm_identity(index) for index in range(300)]
    send(hub.connection_string(), [event_data(envelope_for(identity, EMPTY, 1, f"inst-{index}"))
                                   for index, identity in enumerate(identities)])
    first, second = fleets(hub), fleets(hub)
    # Balanced before the heartbeats: a partition taken over later gets a base from its new owner, and with no
    # change after it no delta would follow (the wait below timed out so on a loaded machine). While the first
    # replica hands a partition to the second, both may show its VMs for a moment: settled waits that out.
    wait_until(lambda: len(settled([first, second]) or ()) == 300 and all(
        replica.value("azure_scheduled_fleet_owned_partitions") == 1 for replica in (first, second)),
        timeout=60, interval=0.5, what="300 VMs, split one partition each, none on both")

    def heartbeats(sequence: int, indexes: range) -> None:
        send(hub.connection_string(), [event_data(envelope_for(identities[index], EMPTY, sequence, f"inst-{index}",
                                                               observed_at=1_795_316_668.0 + sequence))
                                       for index in indexes])

    def deltas_stored() -> bool:
        blocks = stored_blocks(azurite, container, prefix)
        return len(blocks) == 2 and all(len(members) > 1 and members[0]["format"] == 3 and "touched" in members[-1]
                                        for members in blocks.values())

    def refreshed(replicas: list[FleetProcess], indexes: range, old: dict[str, float]) -> bool:
        """Every VM shown, those of ``indexes`` with a newer last-seen time than in ``old``."""
        now = picture(replicas)
        return len(now) == 300 and all(now[identities[i].vm_id] > old[identities[i].vm_id] for i in indexes)

    def stored(sequence: int) -> bool:
        """Each partition's state holds a heartbeat of ``sequence`` (in its base or in a delta)."""
        blocks = stored_blocks(azurite, container, prefix)
        return len(blocks) == 2 and all(
            any(vm["sequence"] >= sequence for member in members for vm in member["vms"])
            or any(row[1] >= sequence for member in members for row in member.get("touched", ()))
            for members in blocks.values())

    # A partition's new owner writes a base first, and a base written after the first heartbeats were read holds
    # them (a loaded machine saw that): the next heartbeats, read after it, can only go as a delta.
    heartbeats(2, range(0, 300, 3))
    wait_until(lambda: stored(2), timeout=30, interval=0.3, what="the first heartbeats stored")
    heartbeats(3, range(0, 300, 3))
    wait_until(deltas_stored, timeout=30, interval=0.3, what="deltas after the bases")

    earlier = picture([first, second])
    heartbeats(4, range(1, 300, 3))
    wait_until(lambda: refreshed([first, second], range(1, 300, 3), earlier), timeout=30, interval=0.3,
               what="the last heartbeats applied")
    before = picture([first, second])
    first.kill()  # its last writes may or may not have happened: the survivor reads the rest from the checkpoint
    wait_until(lambda: second.value("azure_scheduled_fleet_owned_partitions") == 2, timeout=TAKEOVER + 30,
               what="the survivor owning both partitions")
    wait_until(lambda: picture([second]) == before, timeout=30, interval=0.5, what="the same picture, exact")
    heartbeats(5, range(2, 300, 3))
    wait_until(lambda: refreshed([second], range(2, 300, 3), before), timeout=30, interval=0.3,
               what="the survivor reading on")
    after = picture([second])
    second.kill()
    third = fleets(hub)
    wait_until(lambda: third.value("azure_scheduled_fleet_owned_partitions") == 2 and picture([third]) == after,
               timeout=TAKEOVER + 60, interval=0.5, what="a new replica restoring the exact picture")
