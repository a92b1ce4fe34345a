"""One identity per VM: a VM heard first by name (its sidecar does not know its vm_id yet) and then by vm_id is one
VM from the moment its vm_id is known, whichever of the replica's partitions holds either and whichever is read
first; a name alone retires nothing it does not own."""

from __future__ import annotations

from typing import Any

from se_exporter.fleet.message import InvalidMessage, Message, read_message
from se_exporter.fleet.vms import Fleet, PartitionState
from tests.fleet.reference_exposition import fleet_text
from tests.fleet.test_vms import FREEZE, VM_ID, props
from tests.support.helpers import parse_samples

NAME = "WestNO_0"


def heard(by_id: bool, sequence: int, seen_at: float, installation: str = "inst-a", name: str = NAME,
          vm_id: str = VM_ID) -> Message:
    """A document of the sidecar ``installation``: under its name (no vm_id) or under its vm_id."""
    extra: dict[str, Any] = {"vm_name": name, "vm_id": vm_id if by_id else ""}
    key = vm_id if by_id else name
    return read_message(FREEZE, props(sequence, **extra), f"{installation}:{sequence}".encode(), key.encode(),
                        seen_at, 1 << 20)


def counts(fleet: Fleet) -> tuple[float | None, float | None, list[str]]:
    """What /metrics says: azure_scheduled_fleet_vms, event_vms of the VMs' Freeze, and the vm_id labels."""
    samples = parse_samples(fleet_text(fleet, 2_000_000_000.0))
    ids = sorted(dict(labels)["vm_id"] for (name, labels) in samples
                 if name == "azure_scheduled_fleet_vm_last_seen_timestamp_seconds")
    return (samples.get(("azure_scheduled_fleet_vms", frozenset())),
            samples.get(("azure_scheduled_fleet_event_vms", frozenset({("event_id", "e1"), ("event_type", "Freeze")}))),
            ids)


def two_partitions() -> Fleet:
    fleet = Fleet()
    fleet.claim("name")  # the partition the name hashes to
    fleet.claim("id")  # the partition the vm_id hashes to
    return fleet


def test_a_vm_heard_by_name_then_by_vm_id_is_one_vm() -> None:
    """By name on one partition, then by vm_id on another: one VM (vms 1, event_vms 1), shown under its vm_id."""
    fleet = two_partitions()
    assert fleet.apply("name", heard(False, 1, 1000.0), 1) == "applied"
    assert counts(fleet) == (1, 1, [NAME])
    assert fleet.apply("id", heard(True, 2, 1010.0), 1) == "applied"
    assert counts(fleet) == (1, 1, [VM_ID])
    assert fleet.snapshot("name").gone == [NAME]  # type: ignore[union-attr]  # the next state write drops it


def test_the_same_on_one_partition() -> None:
    """The name and the vm_id hashing to the same partition: the same one VM."""
    fleet = Fleet()
    fleet.claim("0")
    fleet.apply("0", heard(False, 1, 1000.0))
    fleet.apply("0", heard(True, 2, 1010.0))
    assert counts(fleet) == (1, 1, [VM_ID])


def test_the_vm_id_read_before_the_names_backlog_is_still_one_vm() -> None:
    """The vm_id's partition read first (the name's lags behind): the older documents by name are not applied."""
    fleet = two_partitions()
    fleet.apply("id", heard(True, 3, 1010.0))
    assert fleet.apply("name", heard(False, 1, 1000.0)) == "older"
    assert fleet.apply("name", heard(False, 2, 1005.0)) == "older"
    assert counts(fleet) == (1, 1, [VM_ID])


def test_a_restored_partition_meets_what_the_others_hold() -> None:
    """A partition claimed later (its state restored) holding the name's entry, or the vm_id's: one VM either way."""
    by_name, by_id = heard(False, 1, 1000.0).vm, heard(True, 2, 1010.0).vm
    for held, restored in (("id", "name"), ("name", "id")):
        fleet = Fleet()
        fleet.claim(held)
        fleet.apply(held, heard(held == "id", 1 if held == "name" else 2, by_id.seen_at if held == "id" else 1000.0))
        vm = by_name if restored == "name" else by_id
        fleet.claim(restored, PartitionState(vms={vm.key: vm}, position=1))
        assert counts(fleet) == (1, 1, [VM_ID]), restored


def test_a_name_retires_nothing_it_does_not_own() -> None:
    """A document with a vm_id retires only an entry known by name only, of its own installation and name: not a VM
    known by its vm_id (a forged name), nor another installation's VM of the same name (elsewhere in Azure)."""
    fleet = two_partitions()
    fleet.apply("name", heard(False, 1, 1000.0, installation="other-vm"))  # another VM of that name, by name
    fleet.apply("id", heard(True, 1, 1001.0, installation="victim", name="victim", vm_id="victim-id"))
    fleet.apply("id", heard(True, 5, 1010.0))  # same name as the first, another installation
    forged = heard(True, 9, 1020.0, installation="victim", name="victim", vm_id="forged-id")
    fleet.apply("id", forged)  # the victim's name and installation under another vm_id
    assert sorted(vm.key for vm in fleet.vms()) == sorted([NAME, "victim-id", VM_ID, "forged-id"])


def retiring(sequence: int, seen_at: float, installation: str = "inst-a", name: str = NAME, vm_id: str = VM_ID,
             key: str | None = None) -> Message:
    """The sidecar's one message under its old key (its name) once it knows its vm_id: it retires the name."""
    return read_message(FREEZE, props(sequence, vm_name=name, vm_id=vm_id, retires_name=True),
                        f"{installation}:{sequence}".encode(), (name if key is None else key).encode(), seen_at,
                        1 << 20)


def test_two_replicas_each_owning_one_partition_count_one_vm() -> None:
    """The name's partition on one replica, the vm_id's on another: the retire message, read in the name's partition
    after the documents by name, retires the entry by name there, so the two replicas together show one VM."""
    by_name, by_id = Fleet(), Fleet()
    by_name.claim("name")
    by_id.claim("id")
    assert by_name.apply("name", heard(False, 1, 1000.0), 1) == "applied"
    assert by_name.apply("name", heard(False, 2, 1005.0), 2) == "applied"
    assert by_id.apply("id", heard(True, 4, 1010.0), 1) == "applied"
    assert counts(by_name)[2] + counts(by_id)[2] == [NAME, VM_ID]  # what distinct-vm_id queries counted: 2
    assert by_name.apply("name", retiring(3, 1010.0), 3) == "retired"
    assert counts(by_name) == (0, None, []) and counts(by_id) == (1, 1, [VM_ID])
    assert by_name.snapshot("name").gone == [NAME]  # type: ignore[union-attr]  # the next state write drops it
    assert by_name.position("name") == 3  # the checkpoint may pass it: nothing new to persist
    assert by_name.apply("name", retiring(3, 1010.0), 3) == "older"  # a resend retires nothing more


def test_a_retire_message_changes_nothing_else() -> None:
    """It never creates a VM, never retires a VM known by vm_id, another installation's VM of that name, or a
    document by name sent after it; and once retired on the same replica already, it is a no-op."""
    fleet = Fleet()
    fleet.claim("name")
    assert fleet.apply("name", retiring(3, 1010.0)) == "older"  # nothing held: nothing created
    assert counts(fleet) == (0, None, [])
    fleet.apply("name", heard(False, 1, 1000.0, installation="inst-b"))
    assert fleet.apply("name", retiring(3, 1010.0)) == "older"  # another installation's VM of that name stays
    fleet.apply("name", heard(False, 5, 1020.0, installation="inst-a"))  # inst-a's entry replaces it, sent later
    assert fleet.apply("name", retiring(4, 1030.0)) == "older"  # sent before that document: kept
    assert counts(fleet) == (1, 1, [NAME])
    one = two_partitions()
    one.apply("name", heard(False, 1, 1000.0))
    one.apply("id", heard(True, 3, 1010.0))  # retired already, both partitions on this replica
    assert one.apply("name", retiring(2, 1010.0)) == "older"
    assert counts(one) == (1, 1, [VM_ID])


def test_a_retire_message_is_accepted_only_under_the_name_beside_a_vm_id() -> None:
    """Under any other key, or without a vm_id or a name, it is refused like any misplaced document."""
    for name, vm_id, key in ((NAME, VM_ID, VM_ID), (NAME, "", NAME), ("", VM_ID, ""), (NAME, VM_ID, "other")):
        try:
            retiring(3, 1010.0, name=name, vm_id=vm_id, key=key)
        except InvalidMessage as error:
            assert error.reason == "wrong_partition_key", (name, vm_id, key)
        else:
            raise AssertionError(f"accepted {(name, vm_id, key)}")
    # and a document by name carrying a vm_id without the flag is still refused
    try:
        read_message(FREEZE, props(3, vm_name=NAME, vm_id=VM_ID), b"inst-a:3", NAME.encode(), 1010.0, 1 << 20)
    except InvalidMessage as error:
        assert error.reason == "wrong_partition_key"
    else:
        raise AssertionError("accepted a document by name carrying a vm_id")
