"""The fleet's core without a network: messages read and checked, ordering, duplicates, expiry, state bytes."""

from __future__ import annotations

import gzip
import json
from datetime import datetime, timezone
from typing import Any

import pytest

from se_exporter.fleet.state import Fleet, InvalidMessage, Message, PartitionState, decode, encode, read_message

VM_ID = "02aab8a4-74ef-476e-8182-f6d2ba4166a6"
FREEZE = (b'{"DocumentIncarnation": 2, "Events": [{"EventId": "E1", "EventType": "Freeze", "ResourceType": '
          b'"VirtualMachine", "Resources": ["WestNO_0", "WestNO_1"], "EventStatus": "Scheduled", "NotBefore": '
          b'"Mon, 19 Sep 2050 18:29:47 GMT", "EventSource": "Platform", "DurationInSeconds": 5}]}')
NEIGHBOUR = FREEZE.replace(b'"WestNO_0", ', b"")
EMPTY = b'{"DocumentIncarnation": 3, "Events": []}'


def props(sequence: Any = 1, **extra: Any) -> dict[Any, Any]:
    """Properties as the SDK hands them over: bytes keys and string values."""
    base = {"vm_name": "WestNO_0", "vm_id": VM_ID, "vmss_name": "", "location": "norwayeast", "sequence": sequence,
            "subscription_id": "sub", "resource_group": "rg", "observed_at": "2026-11-22T03:04:28.024Z",
            "api_version": "2020-07-01", "exporter_version": "0.1.0", "document_incarnation": 2, **extra}
    return {key.encode(): value.encode() if isinstance(value, str) else value for key, value in base.items()}


def message(body: bytes = FREEZE, sequence: int = 1, installation: str = "inst-a", seen_at: float = 1000.0,
            **extra: Any) -> Message:
    return read_message(body, props(sequence, **extra), f"{installation}:{sequence}".encode(), VM_ID.encode(),
                        seen_at, 1024 * 1024)


def test_a_forwarded_document_is_read_with_its_vm_and_events() -> None:
    """Identity from the properties, order from the message id, events reduced to what the fleet shows."""
    read = message(seen_at=1234.5)
    vm = read.vm
    assert (vm.key, vm.vm_id, vm.vm_name, vm.vmss_name, vm.location) == (VM_ID, VM_ID, "WestNO_0", "", "norwayeast")
    assert (vm.installation, vm.sequence, vm.seen_at, vm.body) == ("inst-a", 1, 1234.5, FREEZE)
    assert read.heartbeat is False and read.unknown_properties == ()
    [event] = vm.events
    assert (event.event_id, event.event_type, event.event_status, event.event_source) == (
        "E1", "Freeze", "Scheduled", "Platform")
    assert event.affects_this_vm == "true"
    assert event.not_before == datetime(2050, 9, 19, 18, 29, 47, tzinfo=timezone.utc).timestamp()
    assert event.duration_seconds == 5.0


def test_a_neighbours_event_is_marked_as_not_this_vms() -> None:
    """An availability set's event reaches every VM in it; Resources says whose it is."""
    [event] = message(NEIGHBOUR).vm.events
    assert event.affects_this_vm == "false"
    assert not event.counts_for_vm


def test_heartbeat_flag_and_unknown_properties_are_read_not_refused() -> None:
    """A heartbeat is marked by its property; properties this version does not know are listed, not fatal."""
    read = message(heartbeat=True, shard="7")
    assert read.heartbeat is True
    assert read.unknown_properties == ("shard",)


@pytest.mark.parametrize(("body", "properties", "message_id", "reason"), [
    (b"x" * 2048, props(), b"i:1", "too_large"),
    (b"\xff\xfe not text", props(), b"i:1", "not_json"),
    (b"<html>captive portal</html>", props(), b"i:1", "not_json"),
    (b"[1, 2]", props(), b"i:1", "invalid_document"),
    (b'{"Events": [{"EventType": "Reboot"}]}', props(), b"i:1", "invalid_document"),
    (EMPTY, props(), None, "not_envelope"),
    (EMPTY, props(), b"no-colon", "not_envelope"),
    (EMPTY, {b"vm_id": b"x"}, b"i:1", "not_envelope"),
    (EMPTY, props(sequence="seven"), b"i:1", "not_envelope"),
    (EMPTY, props(sequence=0), b"i:1", "not_envelope"),
    (EMPTY, props(sequence=True), b"i:1", "not_envelope"),
    (EMPTY, {**props(), b"vm_name": 7}, b"i:1", "not_envelope"),
])
def test_what_is_not_a_forwarded_document_is_refused_with_a_reason(body: bytes, properties: dict[Any, Any],
                                                                   message_id: bytes | None, reason: str) -> None:
    """Every kind of bad message gets the reason it is counted under."""
    with pytest.raises(InvalidMessage) as caught:
        read_message(body, properties, message_id, None, 1.0, 1024)
    assert caught.value.reason == reason


def test_a_message_without_any_vm_name_is_refused() -> None:
    """No vm_id, no partition key and no vm_name: nothing to keep it under."""
    properties = {**props(), b"vm_id": b"", b"vm_name": b""}
    with pytest.raises(InvalidMessage, match="no vm_id"):
        read_message(EMPTY, properties, b"i:1", None, 1.0, 1024)


def test_the_key_falls_back_to_the_partition_key_then_the_name() -> None:
    """Before the sidecar knew its vm_id, its partition key (or name) keeps its documents together."""
    read = read_message(EMPTY, {**props(), b"vm_id": b""}, b"i:1", b"WestNO_0-key", 1.0, 1024)
    assert read.vm.key == "WestNO_0-key"
    read = read_message(EMPTY, {**props(), b"vm_id": b""}, b"i:1", None, 1.0, 1024)
    assert read.vm.key == "WestNO_0"


def test_newer_applies_a_resend_or_an_older_one_does_not() -> None:
    """Within one installation the sequence decides; the same one again is a resend, a lower one older."""
    fleet = Fleet()
    fleet.claim("0")
    assert fleet.apply("0", message(FREEZE, sequence=5)) == "applied"
    assert fleet.apply("0", message(EMPTY, sequence=5)) == "resend"
    assert fleet.apply("0", message(EMPTY, sequence=4)) == "older"
    assert [vm.body for vm in fleet.vms()] == [FREEZE]
    assert fleet.apply("0", message(EMPTY, sequence=6)) == "applied"
    assert [vm.body for vm in fleet.vms()] == [EMPTY]


def test_another_installation_replaces_whatever_its_sequence() -> None:
    """A reinstalled sidecar starts at sequence 1 again: the partition's order decides, not the number."""
    fleet = Fleet()
    fleet.claim("0")
    fleet.apply("0", message(FREEZE, sequence=500, installation="old"))
    assert fleet.apply("0", message(EMPTY, sequence=1, installation="new")) == "applied"
    [vm] = fleet.vms()
    assert (vm.installation, vm.sequence, vm.body) == ("new", 1, EMPTY)


def test_a_released_partition_takes_its_vms_along() -> None:
    """When a partition moves away its VMs leave this replica; a late event for it changes nothing."""
    fleet = Fleet()
    fleet.claim("0")
    fleet.claim("1")
    fleet.apply("0", message(sequence=1))
    fleet.apply("1", message(sequence=1, installation="b"))
    assert fleet.release("0") == 1
    assert fleet.owned() == ["1"]
    assert len(fleet.vms()) == 1
    assert fleet.apply("0", message(sequence=2)) == "unowned"


def test_events_the_restored_state_holds_are_recognised_and_the_position_only_grows() -> None:
    """After a restore at sequence number 41, replayed events up to 41 are known; handled positions never go back."""
    fleet = Fleet()
    fleet.claim("0", PartitionState(position=41, restored_position=41))
    assert fleet.already_applied("0", 41) and fleet.already_applied("0", 3)
    assert not fleet.already_applied("0", 42)
    fleet.handled("0", 45)
    fleet.handled("0", 43)
    assert fleet.position("0") == 45
    assert not fleet.already_applied("1", 1)


def test_expiry_forgets_only_vms_silent_past_their_partitions_cutoff() -> None:
    """Each partition has its own cutoff; a partition without one expires nothing."""
    fleet = Fleet()
    for partition_id in ("0", "1"):
        fleet.claim(partition_id)
    fleet.apply("0", message(seen_at=100.0, installation="a"))
    fleet.apply("1", message(seen_at=100.0, installation="b"))
    fleet.apply("1", read_message(EMPTY, {**props(), b"vm_id": b"other"}, b"c:1", None, 300.0, 1024))
    gone = fleet.expire({"1": 200.0})
    assert [(vm.installation, vm.seen_at) for vm in gone] == [("b", 100.0)]
    assert sorted(vm.installation for vm in fleet.vms()) == ["a", "c"]


def test_state_bytes_round_trip_and_restore_as_already_applied() -> None:
    """A partition's state written and read back is the same VMs, and marks its position as applied."""
    fleet = Fleet()
    fleet.claim("3")
    assert fleet.dump("3") is None  # nothing handled yet: nothing to write
    fleet.apply("3", message(FREEZE, sequence=7))
    fleet.apply("3", read_message(EMPTY, {**props(), b"vm_id": b"v2", b"vm_name": b"ss_1", b"vmss_name": b"ss"},
                                  b"j:2", None, 5.5, 1024))
    fleet.handled("3", 17)
    dumped = fleet.dump("3")
    assert dumped is not None
    data, position = dumped
    assert position == 17
    restored = decode(data)
    assert restored.position == restored.restored_position == 17
    assert restored.vms == {vm.key: vm for vm in fleet.vms()}


@pytest.mark.parametrize("data", [b"", b"not gzip", encode("0", 1, [])[:-4],
                                  gzip.compress(json.dumps({"format": 99}).encode())])
def test_unreadable_state_is_an_error_not_an_empty_fleet(data: bytes) -> None:
    """A damaged or foreign state blob raises instead of restoring as if the partition had no VMs."""
    with pytest.raises(ValueError, match="unreadable fleet state"):
        decode(data)
